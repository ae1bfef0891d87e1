"""Measure prompt-lookup (n-gram) speculative-decoding acceptance on real logged agent outputs.

Reads the tau-bench / tau2-bench trajectory files in ``../shared/data`` (the shipped run-log
samples keep no text), replays vLLM's n-gram proposer over every logged assistant output against
the conversation before it, and writes the rates the simulator reads
(``router/sim/prompt_lookup_acceptance.json``: counts and ratios only, no text, with provenance).

Algorithm:

1. **Tokens.** No BPE vocabulary can be loaded offline, so text is split into cl100k-style
   pre-tokens (:func:`pretokens`: letter runs with one optional leading non-letter, digit groups
   of 1-3, punctuation runs, whitespace). A BPE tokenizer would cut rare words and identifiers
   into more pieces; the figures are per pre-token, an approximation that is stated in the file.
2. **Context.** Per simulation, in order: the system prompt (the agent policy), the tool
   definitions where the file has them (tau2 ``tool_defs``; tau-bench files have none, so its
   tool-call outputs are measured without schemas in context), then every message rendered as
   ``<role>\\n<content>``; a tool call renders as ``{"name": N, "arguments": A}`` (the logged
   argument JSON), tool results as their content.
3. **Drafting** (vLLM ``NgramProposer``): at output position ``j`` the proposer looks for the
   longest n-gram, ``prompt_lookup_min <= n <= prompt_lookup_max``, that ends the sequence so far
   (context + the output's first ``j`` tokens) and occurred earlier; of equally long ones the
   earliest; it proposes up to ``num_speculative_tokens`` tokens that followed it (fewer near the
   end). The logged output is the target's choice (greedy verification), so the accepted drafts
   are the longest common prefix of the proposal and the output's next tokens. An iteration emits
   accepted + 1 tokens. The first output token comes from the prefill and is not drafted.
4. **Kinds.** ``tool_call`` = an assistant message with tool calls (its output: any content plus
   the rendered calls); ``free_text`` = the rest. Per kind and per file: steps, output tokens,
   decode iterations, iterations with a draft, proposed and accepted drafts;
   ``acceptance_rate`` = accepted / proposed (vLLM's draft acceptance rate),
   ``tokens_per_iteration`` = (output - first) tokens / decode iterations (vLLM's mean acceptance
   length), ``proposed_per_iteration`` = proposed / decode iterations.

The index is shared by all configurations: the context at position ``j`` is the same whatever was
drafted, so one pass records, per position and n, the earliest earlier end of the n-gram.

Knobs (CLI): ``--data`` (``/work/shared/data``), ``--out`` (the shipped file), ``--configs``
(``min:max:k`` list; the first is the default the simulator uses), ``--limit`` (simulations per
file, for a quick run). ``python -m router.sim.spec_measure``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

__all__ = ["pretokens", "Sim", "measure_step", "measure", "iter_sims", "DEFAULT_CONFIGS", "main"]

DEFAULT_CONFIGS: tuple[tuple[int, int, int], ...] = ((2, 4, 4), (1, 3, 3), (3, 5, 5), (2, 4, 8))
KINDS = ("tool_call", "free_text")

_PAT = re.compile(
    r"'(?:[sdmtSDMT]|ll|ve|re|LL|VE|RE)"
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def pretokens(text: str) -> list[str]:
    """cl100k-style pre-tokens of ``text`` (module docstring, 1)."""
    return _PAT.findall(text)


class Sim:
    """One conversation: its running token ids and the n-gram index over them."""

    def __init__(self, max_n: int, vocab: dict[str, int]):
        self.max_n = max_n
        self.vocab = vocab
        self.ids: list[int] = []
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]

    def encode(self, text: str) -> list[int]:
        v = self.vocab
        out = []
        for t in pretokens(text):
            i = v.get(t)
            if i is None:
                i = v[t] = len(v)
            out.append(i)
        return out

    def push(self, tok: int) -> None:
        """Append one token; index the n-grams ending at the token before it (never the suffix)."""
        ids = self.ids
        end = len(ids) - 1  # n-grams ending here become matchable once a later token exists
        if end >= 0:
            for n in range(1, self.max_n + 1):
                if end - n + 1 < 0:
                    break
                key = tuple(ids[end - n + 1 : end + 1])
                self.index[n].setdefault(key, end)
        ids.append(tok)

    def extend(self, toks: Sequence[int]) -> None:
        for t in toks:
            self.push(t)

    def matches(self) -> list[int]:
        """Per n (index n), the earliest earlier end of the sequence's last n tokens (-1: none)."""
        ids = self.ids
        L = len(ids)
        out = [-1] * (self.max_n + 1)
        for n in range(1, self.max_n + 1):
            if n > L:
                break
            out[n] = self.index[n].get(tuple(ids[L - n :]), -1)
        return out


def measure_step(
    sim: Sim, output: list[int], configs: Sequence[tuple[int, int, int]]
) -> list[dict[str, int]]:
    """Feed one assistant output through ``sim``; per config: iterations, drafted, proposed, accepted."""
    n_out = len(output)
    base = len(sim.ids)
    found: list[list[int]] = []  # per output position j >= 1: matches() with the first j tokens in
    if n_out:
        sim.push(output[0])
    for j in range(1, n_out):
        found.append(sim.matches())
        sim.push(output[j])
    seq = sim.ids  # context + output
    res = []
    for lo, hi, k in configs:
        it = drafted = proposed = accepted = 0
        j = 1
        while j < n_out:
            m = found[j - 1]
            end = -1
            n = hi
            while n >= lo:
                if m[n] >= 0:
                    end = m[n]
                    break
                n -= 1
            acc = 0
            if end >= 0:
                start = end + 1
                cur = base + j  # tokens known at this position
                kk = min(k, cur - start)
                if kk > 0:
                    drafted += 1
                    proposed += kk
                    rem = n_out - j
                    while acc < kk and acc < rem and seq[start + acc] == output[j + acc]:
                        acc += 1
                    accepted += acc
            it += 1
            j += acc + 1
        res.append({"iterations": it, "drafted": drafted, "proposed": proposed, "accepted": accepted})
    return res


def _render_call(name: str, args: object) -> str:
    a = args if isinstance(args, str) else json.dumps(args)
    return '{"name": ' + json.dumps(name) + ', "arguments": ' + a + "}"


def iter_sims(path: Path, limit: int | None = None) -> Iterator[tuple[str, list[tuple[str, str, bool]]]]:
    """(system text, [(role, text, made_tool_calls)]) per simulation of a tau / tau2 file."""
    data = json.loads(path.read_text())
    if isinstance(data, list):  # tau-bench trajectories, or a bare list of tau2 simulations
        sims = [
            (s["traj"], "")
            if isinstance(s.get("traj"), list)
            else (s.get("messages") or [], str(s.get("policy") or ""))
            for s in data
            if isinstance(s, dict)
        ]
    elif isinstance(data, dict) and isinstance(data.get("simulations"), list):
        env = (data.get("info") or {}).get("environment_info") or {}
        system = str(env.get("policy") or "")
        if env.get("tool_defs"):
            system += "\n" + json.dumps(env["tool_defs"])
        sims = [(s.get("messages") or [], system) for s in data["simulations"] if isinstance(s, dict)]
    else:
        return
    for i, (msgs, system) in enumerate(sims):
        if limit is not None and i >= limit:
            break
        out: list[tuple[str, str, bool]] = []
        for m in msgs:
            if not isinstance(m, dict):
                continue
            role = str(m.get("role", ""))
            text = m.get("content") if isinstance(m.get("content"), str) else ""
            calls = [c for c in (m.get("tool_calls") or []) if isinstance(c, dict)]
            parts = [text] if text else []
            for c in calls:
                fn = c.get("function") or c
                parts.append(_render_call(str(fn.get("name", "")), fn.get("arguments", {})))
            out.append((role, "\n".join(parts), bool(calls)))
        yield system, out


def _files(data: Path) -> list[Path]:
    files = sorted((data / "taubench").glob("*.json")) + sorted((data / "tau2bench").glob("*.json"))
    return [f for f in files if f.name.lower() != "license"]


def measure(
    files: Sequence[Path],
    configs: Sequence[tuple[int, int, int]],
    limit: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Counts per config x kind (and per file), module docstring 4."""
    max_n = max(hi for _, hi, _ in configs)
    zero = {"steps": 0, "output_tokens": 0, "iterations": 0, "drafted": 0, "proposed": 0, "accepted": 0}
    tot = [{kd: dict(zero) for kd in KINDS} for _ in configs]
    per_file: dict[str, list[dict[str, dict[str, int]]]] = {}
    used: list[Path] = []
    for f in files:
        vocab: dict[str, int] = {}
        ff = [{kd: dict(zero) for kd in KINDS} for _ in configs]
        n_sims = 0
        for system, msgs in iter_sims(f, limit):
            n_sims += 1
            sim = Sim(max_n, vocab)
            if system:
                sim.extend(sim.encode("system\n" + system + "\n"))
            for role, text, calls in msgs:
                if role == "assistant" and text:
                    sim.extend(sim.encode("assistant\n"))
                    out = sim.encode(text)
                    kind = "tool_call" if calls else "free_text"
                    for c, r in enumerate(measure_step(sim, out, configs)):
                        for agg in (tot[c][kind], ff[c][kind]):
                            agg["steps"] += 1
                            agg["output_tokens"] += len(out)
                            for key, v in r.items():
                                agg[key] += v
                    sim.extend(sim.encode("\n"))
                elif text:
                    sim.extend(sim.encode(f"{role}\n{text}\n"))
        if n_sims:
            used.append(f)
            per_file[f.name] = ff
        if progress is not None:
            progress(f.name, n_sims)
    return {"totals": tot, "per_file": per_file, "files": used}


def _rates(c: dict[str, int]) -> dict[str, Any]:
    it = c["iterations"]
    dec = c["output_tokens"] - c["steps"]  # tokens after each output's first (from the prefill)
    return {
        **c,
        "acceptance_rate": round(c["accepted"] / c["proposed"], 4) if c["proposed"] else None,
        "tokens_per_iteration": round(dec / it, 4) if it else 1.0,
        "proposed_per_iteration": round(c["proposed"] / it, 4) if it else 0.0,
        "draft_share": round(c["drafted"] / it, 4) if it else None,
    }


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def build_report(meas: dict[str, Any], configs: Sequence[tuple[int, int, int]], data: Path) -> dict[str, Any]:
    files: list[Path] = meas["files"]
    return {
        "provenance": {
            "what": "prompt-lookup (n-gram) speculative decoding replayed over logged assistant outputs",
            "script": "python -m router.sim.spec_measure",
            "measured_on": str(date.today()),
            "data": [{"file": f"{f.parent.name}/{f.name}", "sha256_16": _sha(f)} for f in files],
            "data_root": str(data),
            "licence": "tau-bench and tau2-bench trajectories: MIT (sierra-research)",
            "tokens": "cl100k-style pre-tokens (router.sim.spec_measure.pretokens), no BPE merges: an approximation",
            "semantics": "vLLM NgramProposer: longest suffix n-gram in [prompt_lookup_min, prompt_lookup_max], "
            "earliest earlier occurrence, up to num_speculative_tokens following tokens; greedy verification "
            "against the logged output; the first output token comes from the prefill",
            "context": "system policy + tool_defs (tau2 only) + every earlier message; tool calls rendered as "
            '{"name": N, "arguments": A}',
        },
        "default": 0,
        "configs": [
            {
                "prompt_lookup_min": lo,
                "prompt_lookup_max": hi,
                "num_speculative_tokens": k,
                "kinds": {kd: _rates(meas["totals"][i][kd]) for kd in KINDS},
                "per_file": {
                    name: {kd: _rates(ff[i][kd]) for kd in KINDS} for name, ff in meas["per_file"].items()
                },
            }
            for i, (lo, hi, k) in enumerate(configs)
        ],
    }


def main(argv: Sequence[str] | None = None) -> None:
    from router.sim.specdec import ACCEPTANCE_FILE

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--out", type=Path, default=ACCEPTANCE_FILE)
    ap.add_argument("--configs", default=",".join(f"{a}:{b}:{c}" for a, b, c in DEFAULT_CONFIGS))
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args(argv)
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    if any(len(c) != 3 or not 1 <= c[0] <= c[1] or c[2] < 1 for c in configs):
        raise SystemExit("--configs: expected min:max:k with 1 <= min <= max and k >= 1")
    files = _files(args.data)
    if not files:
        raise SystemExit(f"no tau-bench / tau2-bench files under {args.data}")
    from rich.progress import Progress

    with Progress() as prog:
        task = prog.add_task("measuring", total=len(files))

        def tick(name: str, n: int) -> None:
            prog.update(task, advance=1, description=f"{name[:40]} ({n} sims)")

        meas = measure(files, configs, args.limit, tick)  # type: ignore[arg-type]
    rep = build_report(meas, configs, args.data)  # type: ignore[arg-type]
    args.out.write_text(json.dumps(rep, indent=1) + "\n")
    for c in rep["configs"]:
        line = ", ".join(
            f"{kd}: acceptance {c['kinds'][kd]['acceptance_rate']}, {c['kinds'][kd]['tokens_per_iteration']} "
            f"tokens/iteration over {c['kinds'][kd]['steps']} steps"
            for kd in KINDS
        )
        print(
            f"min={c['prompt_lookup_min']} max={c['prompt_lookup_max']} k={c['num_speculative_tokens']}: {line}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
