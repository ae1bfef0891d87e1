"""Layout rules of training/ and runroute/ that no other check enforces yet: no private name imported
across packages, no import cycle between their modules, and the agent driver in router.fakes standing
alone (import-linter contracts for the whole tree are a separate check)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names, line) of every import in the file, at any depth (lazy ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
    return out


def _files(*tops: str) -> list[Path]:
    return sorted(p for t in tops for p in (ROOT / t).rglob("*.py"))


def test_no_private_names_imported_across_packages():
    bad = []
    for path in _files("training", "runroute"):
        pkg = _module(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module(path)
        for mod, names, line in _imports(path):
            other_pkg = mod.rsplit(".", 1)[0]
            for n in names:
                if n.startswith("_") and not n.startswith("__") and other_pkg != pkg:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: from {mod} import {n}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_in_training_and_runroute():
    files = _files("training", "runroute")
    mods = {_module(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for mod, names, _ in _imports(p):
            for target in [mod, *(f"{mod}.{n}" for n in names)]:
                if target in mods and target != m and not mods[target].name == "__init__.py":
                    graph[m].add(target)
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_agent_driver_stays_in_router_fakes_layer():
    allowed = ("router.fakes", "features", "models", "router.policy", "router.core")
    for mod, _, line in _imports(ROOT / "router" / "fakes" / "agent.py"):
        top = mod.split(".")[0]
        if top in ("router", "features", "models", "training", "runroute"):
            assert mod.startswith(allowed), f"router/fakes/agent.py:{line} imports {mod}"
