"""The README is a front door: at most 250 lines, every docs/ page it names exists and is linked,
and every shell block of its Quickstart runs on a fresh checkout (issue 27).

A fresh checkout here is the tracked files only (``git ls-files``: what a clone holds, with the
working tree's content, so an uncommitted README is what gets tested), copied to a temporary
folder: no ``.venv``, no ``runroute-bundle``, no logs. Two things are given to it, and the test
says so rather than hiding it:

- the ``.venv`` of this checkout (a symlink; ``make setup`` takes minutes) with the copy first on
  ``PYTHONPATH``, so the copy's code is what runs;
- ``runroute-bundle``: the small test bundle of conftest.py, which ``runroute serve`` would
  otherwise train from ``data/`` at its first start (~40 s).

The Quickstart's port 8080 is replaced by a free port (several test runs share the machine).
A block preceded by ``<!-- quickstart-test: skip: REASON -->`` is not run; it must give a reason
(``make demo`` / ``make test`` take minutes and CI runs ``make test`` itself).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!-- quickstart-test: skip: (.+?) -->\s*$")


def quickstart_blocks(text: str) -> list[tuple[str, str | None]]:
    """``(script, skip reason or None)`` of every ```sh block of the ``## Quickstart`` section."""
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    out: list[tuple[str, str | None]] = []
    lines = section.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            prev = next((x for x in reversed(lines[:i]) if x.strip()), "")
            m = SKIP.search(prev)
            j = lines.index("```", i + 1)
            out.append(("\n".join(lines[i + 1 : j]), m.group(1) if m else None))
            i = j
        i += 1
    return out


def test_readme_fits_and_links_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)\)", text))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and pages <= linked, pages - linked
    assert linked <= pages, linked - pages
    for head in ("## Quickstart", "## Connect your agent", "## A real vLLM and a real frontier", "## Layout"):
        assert head in text
    for agent in ("Claude Code", "openai-agents", "LangGraph", "litellm"):
        assert f"**{agent}" in text
    assert "--max-tool-turns" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_quickstart_blocks_run_on_a_fresh_checkout(tmp_path, small_bundle):
    blocks = quickstart_blocks(README.read_text())
    run = [b for b, why in blocks if why is None]
    assert run and all(why.strip() for _, why in blocks if why is not None)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    clone = tmp_path / "clone"
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            dst = clone / f.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    assert not (clone / ".venv").exists() and not (clone / "runroute-bundle").exists()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    shutil.copytree(small_bundle, clone / "runroute-bundle")
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(clone)}
    for script in run:
        script = script.replace("8080", port)
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        log = (clone / "serve.log").read_text() if (clone / "serve.log").exists() else ""
        assert p.returncode == 0, (script, p.stdout[-1500:], p.stderr[-1500:], log[-1500:])
        if "/v1/runs" in script:
            assert '"object":"list"' in p.stdout and '"state":"active"' in p.stdout, p.stdout[-800:]
