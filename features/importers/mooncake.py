"""Mooncake conversation trace (JSONL of requests) -> runs of chained turns.

Input: one JSON object per line, ``timestamp`` (ms since trace start), ``input_length``,
``output_length``, ``hash_ids`` (one id per 512-token prefix block; equal ids = identical blocks).
There is no session id, so conversations are recovered from shared leading blocks.

Algorithm (one pass in file order, O(total blocks)):

1. A prefix trie over block ids: node(k) = the first k blocks of a request. Trie nodes are found by a
   dict ``(parent node, block id) -> node``, so each request costs O(its blocks), never O(blocks^2).
   Every node remembers the *latest* request that contained that prefix.
2. For request r, walk its blocks down the trie: ``d`` = the number of leading blocks r shares with
   ANY earlier request (the deepest existing node).
3. Chaining rule: if ``d >= min_shared_blocks`` (default 2; block 0 is a system prompt that nearly all
   requests share), r *continues* the latest earlier request at that deepest node (the latest request
   whose deepest shared leading block r extends). If that parent is the last turn of its run, r is
   appended to the run; if the run already moved on past the parent (a fork: regenerate/edit), r starts
   a new run. Otherwise (``d < min_shared_blocks``) r starts a new run.
4. Then r's own blocks are inserted/updated in the trie (latest request = r).

Step fields:

- ``arrival_s`` = timestamp / 1000.
- ``prompt_tokens`` = input_length, ``completion_tokens`` = output_length, ``hash_ids`` kept.
- ``prefix_reuse_tokens`` = min(input_length, 512 * d), with d from step 2: the infinite-cache upper
  bound (leading blocks seen in ANY earlier request, not only the run's own earlier turns).
- ``tool_pause_s`` (steps >= 1) = max(0, arrival - (previous turn's arrival + its estimated duration)),
  with estimated duration = output_length / ``decode_tokens_per_s``; with ``decode_tokens_per_s=None``
  it is the plain arrival gap. The trace has no latencies, so this is an estimate.

Run: source ``mooncake``, outcome ``unknown``, started_at/ended_at = first arrival / last arrival.

Knobs: ``block_tokens`` (512, the trace's block size), ``min_shared_blocks`` (2),
``decode_tokens_per_s`` (30.0 tokens/s for the previous turn's duration estimate; None = arrival gap).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from features.importers import check_path, report_bad

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = ["import_mooncake"]


def _parse_row(obj: Any) -> tuple[float, int, int, list[int]] | str:
    """Validated (timestamp_ms, input, output, hash_ids) or a reason string."""
    if not isinstance(obj, dict):
        return "a request must be a JSON object"
    for k in ("timestamp", "input_length", "output_length", "hash_ids"):
        if k not in obj or obj[k] is None:
            return f"missing field '{k}'"
    ts, inp, out, hs = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return "'timestamp' is not a number"
    for name, v in (("input_length", inp), ("output_length", out)):
        if not isinstance(v, int) or isinstance(v, bool):
            return f"'{name}' is not an integer"
        if v < 0:
            return f"negative '{name}' ({v})"
    if ts < 0:
        return f"negative 'timestamp' ({ts})"
    if not isinstance(hs, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hs):
        return "'hash_ids' is not a list of integers"
    return float(ts), inp, out, hs


def import_mooncake(
    path: str | Path,
    *,
    strict: bool = False,
    bad_rows: list[BadRow] | None = None,
    block_tokens: int = 512,
    min_shared_blocks: int = 2,
    decode_tokens_per_s: float | None = 30.0,
    max_requests: int | None = None,
    until_s: float | None = None,
) -> pd.DataFrame:
    """Import a Mooncake trace JSONL; see the module docstring for the chaining rule.

    ``max_requests`` stops after that many good requests; ``until_s`` skips requests arriving at or
    after that trace time (seconds). Both cut samples: chaining only looks back, so the kept requests
    get the same runs and figures as in a full import.
    """
    import pandas as pd

    from features.runlog import conform, records_to_frame
    from features.schema import SCHEMA_VERSION

    p = check_path(path)
    # trie: (parent node id, block id) -> node id; node id -> latest request index containing it
    child: dict[tuple[int, int], int] = {}
    latest: list[int] = [-1]  # node 0 = root
    req_run: list[int] = []  # request index -> run index
    runs_tail: list[int] = []  # run index -> last request index
    runs_len: list[int] = []
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "run_id",
            "step",
            "arrival_s",
            "tool_pause_s",
            "prompt_tokens",
            "prefix_reuse_tokens",
            "completion_tokens",
            "hash_ids",
        )
    }
    arrivals: list[float] = []
    outputs: list[int] = []
    with open(p, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            s = line.strip()
            if not s:
                continue
            try:
                obj = orjson.loads(s)
            except orjson.JSONDecodeError as e:
                report_bad(
                    bad_rows,
                    strict,
                    p,
                    lineno,
                    f"invalid JSON ({str(e).split(':')[0]})",
                    s[:200].decode("utf-8", "replace"),
                )
                continue
            parsed = _parse_row(obj)
            if isinstance(parsed, str):
                report_bad(bad_rows, strict, p, lineno, parsed, obj)
                continue
            ts, inp, out, hs = parsed
            if until_s is not None and ts / 1000.0 >= until_s:
                continue
            r = len(req_run)
            # 2. deepest existing node
            node, d = 0, 0
            for h in hs:
                nxt = child.get((node, h))
                if nxt is None:
                    break
                node, d = nxt, d + 1
            parent = latest[node] if d >= min_shared_blocks else -1
            # 3. chain
            if parent >= 0 and runs_tail[req_run[parent]] == parent:
                run = req_run[parent]
                step = runs_len[run]
                runs_tail[run] = r
                runs_len[run] += 1
                prev_end = arrivals[parent] + (
                    outputs[parent] / decode_tokens_per_s if decode_tokens_per_s else 0.0
                )
                pause: float | None = max(0.0, ts / 1000.0 - prev_end)
            else:
                run = len(runs_tail)
                runs_tail.append(r)
                runs_len.append(1)
                step, pause = 0, None
            req_run.append(run)
            arrivals.append(ts / 1000.0)
            outputs.append(out)
            # 4. insert/update the trie with r's blocks
            node = 0
            latest[0] = r
            for h in hs:
                key = (node, h)
                nxt = child.get(key)
                if nxt is None:
                    nxt = len(latest)
                    child[key] = nxt
                    latest.append(r)
                else:
                    latest[nxt] = r
                node = nxt
            rows["run_id"].append(run)
            rows["step"].append(step)
            rows["arrival_s"].append(ts / 1000.0)
            rows["tool_pause_s"].append(pause)
            rows["prompt_tokens"].append(inp)
            rows["prefix_reuse_tokens"].append(min(inp, block_tokens * d))
            rows["completion_tokens"].append(out)
            rows["hash_ids"].append(hs)
            if max_requests is not None and len(req_run) >= max_requests:
                break
    if not req_run:
        from features.runlog import RunLogError

        if bad_rows:
            return records_to_frame([])
        raise RunLogError(f"{p}: no requests")
    width = max(5, len(str(len(runs_tail))))
    run_names = [f"mooncake-{i:0{width}d}" for i in range(len(runs_tail))]
    steps = pd.DataFrame(rows)
    steps["run_id"] = [run_names[i] for i in rows["run_id"]]
    steps["record"] = "step"
    steps["schema_version"] = SCHEMA_VERSION
    steps["tool_calls"] = [[] for _ in range(len(steps))]
    steps["tool_call_keys"] = [[] for _ in range(len(steps))]
    steps["tool_results_n"] = 0
    steps["tool_result_tokens"] = [[] for _ in range(len(steps))]
    steps["tool_result_errors"] = [[] for _ in range(len(steps))]
    g = steps.groupby("run_id", sort=False)["arrival_s"]
    runs = pd.DataFrame(
        {
            "run_id": run_names,
            "started_at": g.min().reindex(run_names).to_numpy(),
            "ended_at": g.max().reindex(run_names).to_numpy(),
            "n_steps": runs_len,
        }
    )
    runs["record"] = "run"
    runs["schema_version"] = SCHEMA_VERSION
    runs["source"] = "mooncake"
    runs["outcome"] = "unknown"
    out_df = pd.concat([runs, steps], ignore_index=True)
    return conform(out_df)
