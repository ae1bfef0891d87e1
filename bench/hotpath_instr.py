"""Instructions per request of the sidecar's hot path (``bench/hotpath_profile.py``) under
``valgrind --tool=callgrind``: immune to the CPU noise of a shared machine.

Algorithm: the in-process hot path is run twice under callgrind with the same runs, priming and
seed, once with ``--requests N`` and once with ``--requests 2N`` measured requests (the two side
by side); the difference
of the two runs' total instruction counts over ``N`` is the cost of one request in the steady
state (start-up, bundle loading, priming and shutdown cancel out). The bodies are built inside the
measured phase (the same for every tree, as in ``hotpath_profile.py``). The replicas' scrape is
turned off (``--scrape-s`` past the run: under valgrind's ~50x slowdown a per-second cost would be
charged to 50x fewer requests). With ``--annotate N`` the top ``N`` C-level functions of the
``2N`` run by exclusive instructions (``callgrind_annotate``; Python code shows as the
interpreter's own functions; use ``hotpath_profile.py --profile`` for Python shares).

Knobs: ``--runs`` (40), ``--steps`` (50), ``--requests`` (``N``, 200), ``--stream``, ``--tree``
(another checkout's code), ``--annotate``, ``--keep`` (leave the callgrind files in the temp dir).

Usage: ``.venv/bin/python bench/hotpath_instr.py [--stream] [--tree ../other-checkout]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _start(a: argparse.Namespace, requests: int, out: Path) -> tuple[list[str], subprocess.Popen[str]]:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(HERE / "hotpath_profile.py"),
        "--runs",
        str(a.runs),
        "--steps",
        str(a.steps),
        "--requests",
        str(requests),
        "--scrape-s",
        "100000",
        "--tree",
        str(a.tree),
        *(["--stream"] if a.stream else []),
    ]
    return cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _count(cmd: list[str], p: subprocess.Popen[str]) -> int:
    stdout, stderr = p.communicate()
    m = re.search(r"Collected : (\d+)", stderr)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"hotpath_instr: {' '.join(cmd)} failed:\n{stdout}\n{stderr[-3000:]}")
    line = next((x for x in stdout.splitlines() if x.startswith("hotpath ")), "")
    if "non-200 0;" not in line:
        raise SystemExit(f"hotpath_instr: requests failed: {line}")
    return int(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--tree", type=Path, default=HERE.parent)
    ap.add_argument("--annotate", type=int, default=0)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    a.tree = a.tree.resolve()
    if shutil.which("valgrind") is None:
        raise SystemExit("hotpath_instr: valgrind is not installed")
    work = Path(tempfile.mkdtemp(prefix="runroute-instr-"))
    try:
        n = a.requests
        p1, p2 = _start(a, n, work / "cg.1"), _start(a, 2 * n, work / "cg.2")  # side by side
        try:
            i1, i2 = _count(*p1), _count(*p2)
        finally:
            for _, p in (p1, p2):
                if p.poll() is None:
                    p.kill()
                    p.wait()
        mode = "stream" if a.stream else "plain"
        print(
            f"hotpath_instr {mode} tree={a.tree.name} runs={a.runs} requests={n} vs {2 * n}: "
            f"{(i2 - i1) / n / 1e6:.3f} M instructions/request (totals {i1 / 1e9:.2f} / {i2 / 1e9:.2f} G)"
        )
        if a.annotate:
            cp = subprocess.run(
                ["callgrind_annotate", "--threshold=100", str(work / "cg.2")], capture_output=True, text=True
            )
            lines = [x for x in cp.stdout.splitlines() if re.match(r"^\s*[\d,]+ \(", x)]
            print("\n".join(lines[: a.annotate + 1]))
    finally:
        if a.keep:
            print(f"hotpath_instr: callgrind files in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
