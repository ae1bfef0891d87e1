"""Shares of a sidecar's CPU by source, from py-spy raw stacks (``bench/overhead.py --realistic --pyspy DIR``).

Algorithm: every line of a raw file is one distinct stack (``thread (tid): name;frame;...;frame N``,
outermost first) and its sample count; py-spy samples only threads that are on the CPU (no
``--idle``), so a sample is CPU time. Each sample is attributed to one *source*: the innermost frame that matches a
rule of :data:`RULES` decides (rules in order for that frame), so the code that ran wins over its
callers (the one-row prediction over the engine that called it). py-spy sees Python frames only:
C work (orjson, LightGBM, uvloop) counts for the Python frame that called it. Non-loop threads are
sources by their thread name. Output: per file, a table of source, samples, share of the process's
CPU samples and, with ``--ms-per-req X`` (the bench's CPU ms/req for that cell), the ms per request
each source costs; then the top ``--top`` innermost frames (self time) for the loop thread.

Usage: ``.venv/bin/python bench/pyspy_shares.py DIR/*.txt [--ms-per-req 1.9] [--top 25]``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# (source, regex on one frame "function (file:line)"); the innermost frame that matches any rule
# decides, rules tried in order for that frame
RULES: list[tuple[str, str]] = [
    ("gc (collector)", r"garbage collection"),
    (
        "body read (ASGI receive)",
        r"read_body \(router/server/hotpath/backends\.py|Request\.(body|stream) \(starlette",
    ),
    ("JSON parse + validation", r"Adapter\.read \(|protocols/validate\.py|ChatAdapter\.validate"),
    ("one-row prediction (LightGBM)", r"_RowPredictor|_predict_buf|predict_features"),
    ("benefit model", r"_with_benefit|models/benefit\.py"),
    ("feature extraction", r"features/extract\.py|features/prefix\.py"),
    ("prefix index / chainer", r"prefix_index\.py|prefix_precise\.py|MessageSegments|chat_tokens"),
    (
        "step request (tool results, prompt estimate)",
        r"step_request \(|prompt_estimate|features/tokens\.py|protocols/sse\.py",
    ),
    ("run context (signals, domain, embed submit)", r"runs/context\.py"),
    ("run identity / lifecycle", r"runs/lifecycle\.py|runs/identity\.py|core/runs\.py"),
    ("policy / snapshot", r"router/policy/"),
    ("engine + driver (plan/commit/finish, record)", r"router/core/|features/schema\.py|pydantic/"),
    ("run-state store", r"router/server/state/"),
    ("admission", r"hotpath/admission\.py"),
    ("metrics", r"router/server/metrics/|prometheus_client"),
    ("run log (submit)", r"log_writer\.py"),
    ("backend pool (states, candidates)", r"hotpath/backends\.py"),
    ("upstream request (HTTP client)", r"hotpath/upstream\.py|hotpath/h1client\.py|aiohttp/|multidict|yarl"),
    ("answer relay / capture", r"protocols/relay\.py|protocols/chat\.py|protocols/base\.py"),
    ("step record / headers", r"hotpath/stepio\.py|hotpath/answers\.py|hotpath/posthoc\.py"),
    ("proxy (other)", r"hotpath/proxy\.py|router/server/app\.py|router/server/routes\.py"),
    ("stall monitor heartbeat", r"loopwatch\.py"),
    ("HTTP server (uvicorn, starlette, fastapi)", r"uvicorn/|starlette/|fastapi/|h11|httptools"),
    ("event loop itself (C: uvloop, sockets)", r"asyncio/runners\.py"),
    ("asyncio (Python)", r"asyncio/"),
]

_LINE = re.compile(r"^(.*) (\d+)$")
_THREAD = re.compile(r"^thread \(\d+\): ?(.*)$")


def _norm(text: str) -> str:
    """Frame file paths relative to the tree / site-packages (so the rules read short paths)."""
    text = re.sub(r"\(/[^():;]*?/site-packages/", "(", text)
    text = re.sub(r"\(/[^():;]*?/lib/python3\.\d+/", "(", text)
    return re.sub(r"\(/work/[^/():;]+/", "(", text)


_COMPILED = [(src, re.compile(rx)) for src, rx in RULES]


def _source(frames: list[str]) -> str:
    for fr in reversed(frames):
        for src, rx in _COMPILED:
            if rx.search(fr):
                return src
    return "other (loop thread)"


def analyse(path: Path) -> tuple[Counter[str], Counter[str], int]:
    sources: Counter[str] = Counter()
    selfs: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        stack, n = _norm(m.group(1)), int(m.group(2))
        total += n
        head, _, rest = stack.partition(";")
        t = _THREAD.match(head)
        name = t.group(1) if t else "?"
        if t is None:
            rest = stack
        if name != "MainThread":
            sources["thread: " + (re.sub(r"_\d+$", "", name) or "?")] += n
            continue
        frames = rest.split(";")
        sources[_source(frames)] += n
        selfs[frames[-1] if frames else "?"] += n
    return sources, selfs, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--ms-per-req", type=float, default=None)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    for f in a.files:
        sources, selfs, total = analyse(f)
        print(f"\n## {f.name}: {total} CPU samples")
        hdr = "| source | samples | share |" + (" ms/req |" if a.ms_per_req else "")
        print(hdr)
        print("|---|---|---|" + ("---|" if a.ms_per_req else ""))
        for src, n in sources.most_common():
            row = f"| {src} | {n} | {100 * n / total:.1f}% |"
            if a.ms_per_req:
                row += f" {a.ms_per_req * n / total:.3f} |"
            print(row)
        loop = sum(selfs.values())
        print(f"\ntop self frames of the loop thread ({loop} samples):")
        for fr, n in selfs.most_common(a.top):
            print(f"  {100 * n / loop:5.1f}%  {fr}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
