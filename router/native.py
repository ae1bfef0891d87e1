"""Compiled builds of the simulator's per-step modules, used only while they match their source.

``make native`` (a dependency of ``make test`` and ``make demo``; ``scripts/build_native.py``)
compiles :data:`MODULES` with mypyc, as one group whose shared library is ``router._native__mypyc``,
into :data:`BUILD_DIR` (``.runroute/native``, beside the source tree, never committed) with a
manifest of each source file's SHA-256. The compiled modules are the same Python code: mypyc turns
their annotations into C types, so the results are bit-identical (``tests/test_native.py`` compares
a simulation run both ways; ``bench/sim_digest.py`` on 12 configurations).

At import, :func:`prefer` puts the build's directory first on a package's ``__path__`` when every
module's source still hashes to the manifest's digest and the build is for this interpreter;
otherwise the package is imported from source as always (edit a module, and until ``make native``
runs again the pure-Python form serves; :func:`status` says which and why). ``RUNROUTE_NATIVE=0``
turns the build off for a process (and the processes it starts).

No imports beyond the standard library: this runs in ``router/__init__.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import cache
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

#: The modules compiled together: the simulator's per-step path (``bench/bench_sim.py``).
MODULES: tuple[str, ...] = (
    "router.core.prefix_cache",
    "router.sim.engine",
    "router.sim.node",
    "router.sim.simulator",
)
#: The group's name: its shared library is the module ``router._native__mypyc``.
GROUP = "router._native"
SOURCE_ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = SOURCE_ROOT / ".runroute" / "native"
MANIFEST = "manifest.json"


def source_path(module: str) -> Path:
    return SOURCE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(module: str) -> str:
    return hashlib.sha256(source_path(module).read_bytes()).hexdigest()


def manifest(build_dir: Path = BUILD_DIR) -> dict[str, object] | None:
    try:
        loaded = json.loads((build_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


@cache
def status() -> tuple[bool, str]:
    """(whether the compiled modules serve, why), decided once per process."""
    if os.environ.get("RUNROUTE_NATIVE", "1").strip().lower() in ("0", "false", "off", "no"):
        return False, "pure Python (RUNROUTE_NATIVE=0)"
    why = unusable()
    if why:
        return False, f"pure Python ({why})"
    return True, f"compiled ({len(MODULES)} modules, mypyc)"


def unusable(build_dir: Path = BUILD_DIR) -> str | None:
    """Why the build in ``build_dir`` cannot serve this interpreter and these sources (None: it can)."""
    m = manifest(build_dir)
    if m is None:
        return f"no build in {build_dir}; run `make native`"
    if m.get("cache_tag") != sys.implementation.cache_tag:
        return f"the build is for {m.get('cache_tag')}, this is {sys.implementation.cache_tag}"
    digests = m.get("modules")
    if not isinstance(digests, dict) or set(digests) != set(MODULES):
        return "the build compiled another module list; run `make native`"
    stale = [mod for mod in MODULES if digests[mod] != source_digest(mod)]
    if stale:
        return f"{', '.join(stale)} changed since the build; run `make native`"
    return None


def active() -> bool:
    return status()[0]


def prefer(package: str, path: list[str]) -> None:
    """Put the build's directory for ``package`` first on its ``__path__`` when the build is current."""
    if not active():
        return
    d = BUILD_DIR.joinpath(*package.split("."))
    if d.is_dir() and str(d) not in path:
        path.insert(0, str(d))


def loaded_compiled() -> list[str]:
    """The modules of :data:`MODULES` imported in this process from the build (extension modules)."""
    out = []
    for mod in MODULES:
        m = sys.modules.get(mod)
        if m is not None and str(getattr(m, "__file__", "")).endswith(tuple(EXTENSION_SUFFIXES)):
            out.append(mod)
    return out
