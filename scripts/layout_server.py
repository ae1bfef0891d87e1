"""Lay ``router/server`` out by concept (issue 23): move its flat modules into sub-packages and
rewrite every reference to them in the tracked tree.

Usage (from the repository root): ``python scripts/layout_server.py [--dry-run] [--no-ruff]``.
Run it on any checkout, before or after merging other branches: it is idempotent (a second run
moves nothing and rewrites nothing) and prints what it moved and which files it rewrote.

Layout (:data:`MOVES`, old module -> new dotted path under ``router.server``):

- ``protocols/``: the client protocols and what they share: the adapter interface and base
  (``base``, was ``protocol``), ``chat``, ``messages``, ``responses`` (+ ``responses_read``), the
  translations (``translate``, ``translate_answers``, ``translate_stream``), ``sse``, the SSE
  ``relay`` and the body checks (``validate``);
- ``hotpath/``: the proxy's step around the engine: ``proxy``, ``stepio``, ``answers``,
  ``admission``, the upstream seam (``upstream``) and the backends (``backends``), ``posthoc``;
- ``runs/``: what the sidecar knows of a run: ``identity``, ``lifecycle``, ``context`` (was
  ``runcontext``), ``listing`` (was ``runs_list``), the run-log writer (``log_writer``);
- ``state/``: the run-state stores: ``store`` (was ``state``: the interface and the memory store),
  ``redis_store``, ``lua``, ``fallback``, and ``prefix_share`` (the prefix index through Redis);
- ``metrics/``: the router's own series (``registry``, was ``metrics``; ``specs``, ``doc``,
  ``workers``) and the replicas' (``scrape``, ``parse``).

The app's surface stays where outside code reaches it: ``router.server.app`` (``create_app``,
uvicorn's ``router.server.app:...``), ``router.server.workers:app_from_env``, ``settings``,
``errors``, ``wiring``, the endpoints (``routes``, ``routes_read``, ``openapi``, ``ui`` and its
``ui_assets``) and the process-level parts (``auth``, ``limits``, ``loopwatch``, ``background``,
``bundles``, ``tracing``).

Algorithm:

1. ``git mv router/server/<old>.py router/server/<new>.py`` for every module still at its old
   place (a module whose new place exists already is skipped; both places existing is an error);
   each new package gets an ``__init__.py`` with a docstring (``git add``-ed).
2. Every git-tracked text file (``*.py``, ``*.md``, ``*.toml``, ``*.yaml``/``*.yml``, ``*.cfg``,
   ``*.ini``, ``*.txt``, ``*.sh``, ``*.js``, ``*.html``, ``Makefile``) has each reference rewritten,
   in dotted form (imports, ``mock.patch`` / ``monkeypatch.setattr`` targets, ``python -m``
   commands, uvicorn and importlib strings, ``:mod:`` roles) and in path form
   (``router/server/<old>.py``); ``from router.server import <old> [as x]`` becomes
   ``from router.server.<pkg> import <leaf> as x``. A reference is a whole dotted/path name
   (``router.server.state`` never matches inside ``router.server.state_redis``). A module that
   became a package (``state``, ``metrics``): ``router.server.metrics.<x>`` and ``from
   router.server.metrics import <x>`` are rewritten unless ``<x>`` is one of the new package's
   modules, and a bare ``router.server.metrics`` only in the run that moves ``metrics.py``
   (afterwards it names the package) -- this is what makes a second run a no-op.
3. ``pyproject.toml``'s explicit package list gains the new packages.
4. ``ruff check --select I --fix`` and ``ruff format`` on the rewritten Python files (import order
   changes with the new names), unless ``--no-ruff`` or no ruff is found.

Not rewritten: ``README.md`` (owned by the maintainers; its stale references are printed),
``CHANGELOG.md`` (history names the modules as they were) and this script.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "router" / "server"

MOVES: dict[str, str] = {
    # protocols/
    "protocol": "protocols.base",
    "chat": "protocols.chat",
    "messages": "protocols.messages",
    "responses": "protocols.responses",
    "responses_read": "protocols.responses_read",
    "translate": "protocols.translate",
    "translate_answers": "protocols.translate_answers",
    "translate_stream": "protocols.translate_stream",
    "sse": "protocols.sse",
    "chat_tokens": "protocols.chat_tokens",
    "relay": "protocols.relay",
    "validate": "protocols.validate",
    # hotpath/
    "proxy": "hotpath.proxy",
    "stepio": "hotpath.stepio",
    "answers": "hotpath.answers",
    "admission": "hotpath.admission",
    "upstream": "hotpath.upstream",
    "backends": "hotpath.backends",
    "posthoc": "hotpath.posthoc",
    # runs/
    "identity": "runs.identity",
    "lifecycle": "runs.lifecycle",
    "runcontext": "runs.context",
    "runs_list": "runs.listing",
    "runlog_writer": "runs.log_writer",
    # state/
    "state": "state.store",
    "state_redis": "state.redis_store",
    "state_lua": "state.lua",
    "state_fallback": "state.fallback",
    "prefix_share": "state.prefix_share",
    "kv_events": "state.kv_events",
    # metrics/
    "metrics": "metrics.registry",
    "metrics_specs": "metrics.specs",
    "metrics_doc": "metrics.doc",
    "metrics_workers": "metrics.workers",
    "metrics_parse": "metrics.parse",
    "scrape": "metrics.scrape",
}

PACKAGES: dict[str, str] = {
    "protocols": (
        "The client protocols (Chat Completions, OpenAI Responses, Anthropic Messages) and what they\n"
        "share: the adapter interface and its base (``base``), one adapter per protocol, the\n"
        "translations between them, server-sent events and the SSE relay, the body checks."
    ),
    "hotpath": (
        "The hot path around the step engine: the proxy (read -> plan -> forward -> relay -> record),\n"
        "the step's I/O, the answers besides the upstream's, admission's shared slots, the upstream\n"
        "seam and the backends, post-hoc signals of a local answer."
    ),
    "runs": (
        "What the sidecar knows of a run: its identity, its lifecycle (resolve, end, idle), its\n"
        "context (domain, task embedding), the runs list and the run-log writer."
    ),
    "state": (
        "Run-state stores (run pins, step counters, admission counters): the interface and the\n"
        "in-memory store, the Redis store and its Lua scripts, the Redis-with-fallback store, and\n"
        "the prefix index shared across routers through Redis."
    ),
    "metrics": (
        "Metrics: the router's own Prometheus series (their one declaration, the registry, the\n"
        "generated docs, the multi-worker view) and the local replicas' (scraping and parsing\n"
        "vLLM's ``/metrics``)."
    ),
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt", ".sh", ".js", ".html"}
TEXT_NAMES = {"Makefile"}
SKIP = {"README.md", "CHANGELOG.md", "scripts/layout_server.py"}

_REF = re.compile(
    r"(?<![\w])router([./])server\1("
    + "|".join(sorted(map(re.escape, MOVES), key=len, reverse=True))
    + r")(?!\w)"
)
_FROM = re.compile(
    r"^([ \t]*)from router\.server import ("
    + "|".join(sorted(map(re.escape, MOVES), key=len, reverse=True))
    + r")(?:[ \t]+as[ \t]+(\w+))?[ \t]*$",
    re.M,
)


def _children(pkg: str) -> set[str]:
    return {new.split(".", 1)[1] for new in MOVES.values() if new.split(".", 1)[0] == pkg}


def rewrite(text: str, moving: set[str]) -> str:
    """``text`` with every reference to a moved module rewritten (module docstring, step 2)."""

    def from_import(m: re.Match[str]) -> str:
        indent, old, alias = m.group(1), m.group(2), m.group(3)
        pkg, leaf = MOVES[old].rsplit(".", 1)
        name = alias or old
        return f"{indent}from router.server.{pkg} import {leaf}" + (f" as {name}" if name != leaf else "")

    text = _FROM.sub(from_import, text)

    def ref(m: re.Match[str]) -> str:
        sep, old = m.group(1), m.group(2)
        new = MOVES[old]
        if old in PACKAGES:  # the module's name is now its package's
            rest = text[m.end() : m.end() + 200]
            nxt = re.match(re.escape(sep) + r"(\w+)", rest) or re.match(r"[ \t]+import[ \t]+(\w+)", rest)
            if nxt is not None and nxt.group(1) in _children(old):
                return m.group(0)  # already router.server.<pkg>.<module> (or from <pkg> import it)
            if nxt is None and old not in moving:
                return m.group(0)  # the package itself, named after the move
        return f"router{sep}server{sep}{new.replace('.', sep)}"

    return _REF.sub(ref, text)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _tracked() -> list[str]:
    return [p for p in _git("ls-files", "-z").split("\0") if p]


def _is_text(rel: str) -> bool:
    p = Path(rel)
    return (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES) and rel not in SKIP


def move(dry: bool) -> tuple[set[str], list[str]]:
    """Step 1: the modules moved now, and the new ``__init__.py`` files."""
    moving: set[str] = set()
    errors = []
    for old, new in MOVES.items():
        src, dst = SERVER / f"{old}.py", SERVER / (new.replace(".", "/") + ".py")
        if src.exists() and dst.exists():
            errors.append(f"both {src.relative_to(ROOT)} and {dst.relative_to(ROOT)} exist")
        elif src.exists():
            moving.add(old)
        elif not dst.exists():
            print(f"skip    router/server/{old}.py: neither it nor its new place exists (renamed?)")
    if errors:
        sys.exit("layout_server: refusing to move:\n  " + "\n  ".join(errors))
    created = []
    for pkg, doc in PACKAGES.items():
        init = SERVER / pkg / "__init__.py"
        needed = any(MOVES[o].startswith(pkg + ".") for o in moving) or (SERVER / pkg).is_dir()
        if needed and not init.exists():
            created.append(str(init.relative_to(ROOT)))
            if not dry:
                init.parent.mkdir(exist_ok=True)
                init.write_text(f'"""{doc}\n"""\n')
                _git("add", str(init.relative_to(ROOT)))
    for old in sorted(moving, key=lambda o: MOVES[o]):
        src = f"router/server/{old}.py"
        dst = "router/server/" + MOVES[old].replace(".", "/") + ".py"
        print(f"move    {src} -> {dst}")
        if not dry:
            _git("mv", src, dst)
    for c in created:
        print(f"create  {c}")
    return moving, created


def pyproject(dry: bool) -> bool:
    """Step 3: add the new packages to ``[tool.setuptools] packages``."""
    path = ROOT / "pyproject.toml"
    text = path.read_text()
    present = set(re.findall(r'^\s*"(router\.server[\w.]*)",\s*$', text, re.M))
    missing = [
        f"router.server.{pkg}"
        for pkg in sorted(PACKAGES)
        if (SERVER / pkg / "__init__.py").exists() and f"router.server.{pkg}" not in present
    ]
    if not missing:
        return False
    m = re.search(r'^(\s*)"router\.server",\s*$', text, re.M)
    if m is None:
        sys.exit('layout_server: pyproject.toml lists no "router.server" package')
    indent = m.group(1)
    lines = "".join(f'\n{indent}"{name}",' for name in missing)
    text = text[: m.end()] + lines + text[m.end() :]
    print(f"update  pyproject.toml: packages += {', '.join(missing)}")
    if not dry:
        path.write_text(text)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    ap.add_argument("--no-ruff", action="store_true", help="do not run ruff on the rewritten files")
    a = ap.parse_args()
    moving, created = move(a.dry_run)
    changed = []
    for rel in _tracked():
        if not _is_text(rel) or not (ROOT / rel).is_file():
            continue
        path = ROOT / rel
        text = path.read_text()
        new = rewrite(text, moving)
        if new != text:
            changed.append(rel)
            if not a.dry_run:
                path.write_text(new)
    for rel in changed:
        print(f"rewrite {rel}")
    pyproject(a.dry_run)
    stale = sorted({m.group(0) for m in _REF.finditer((ROOT / "README.md").read_text())})
    stale = [s for s in stale if rewrite(s, moving) != s]
    if stale:
        print("README.md (not rewritten) still names: " + ", ".join(stale))
    if moving:
        for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
            if "router/server/`" in line:
                print(f"README.md:{i} describes the router/server layout (not rewritten): check it by hand")
    names = re.compile(r"^[ \t]*from router\.server import (\([^)]*\)|[^\n]*)", re.M)
    left = [
        f"{rel}: from router.server import {m.group(1).strip()}"
        for rel in _tracked()
        if rel.endswith(".py") and _is_text(rel) and (ROOT / rel).is_file()
        for m in names.finditer((ROOT / rel).read_text())
        if any(
            n.split()[0] in MOVES for n in m.group(1).strip("()").replace("\n", " ").split(",") if n.strip()
        )
    ]
    for line in left if not a.dry_run else []:
        print(f"check   {line} (a multi-name import of a moved module: split it by hand)")
    py = [r for r in changed if r.endswith(".py")] + [c for c in created if c.endswith(".py")]
    ruff = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    if py and not a.dry_run and not a.no_ruff and ruff:
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *py], cwd=ROOT, check=False)
        subprocess.run([ruff, "format", "-q", *py], cwd=ROOT, check=False)
    if not (moving or changed or created):
        print("layout_server: nothing to do (already laid out)")


if __name__ == "__main__":
    main()
