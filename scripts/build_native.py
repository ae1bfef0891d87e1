"""Compile :data:`router.native.MODULES` with mypyc into ``.runroute/native`` (``make native``).

Does nothing when the build there matches the sources and this interpreter. Otherwise: mypyc
generates C for the modules as one group (shared library ``router._native__mypyc``), setuptools
compiles it (``-O3``, two jobs) into a new directory, the manifest (each source's SHA-256, hashed
before mypyc reads it, and the interpreter's cache tag) is written last, and the new directory
replaces the old one. A failed build leaves the old build in place, and the package imports keep
checking it against the sources (``router/native.py``), so a stale or half-made build never serves.

mypy runs with its own settings here (not ``[tool.mypy]``): imports outside the project and numpy
are not followed (``follow_imports = skip``: their types are ``Any`` to mypyc, which only costs a
generic call), so mypy never analyses mlflow and the like (mypy 2.4 crashes inside mlflow's stubs).

Usage: ``.venv/bin/python scripts/build_native.py [--force]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MYPY_CONFIG = """\
[mypy]
follow_imports = skip
ignore_missing_imports = True

[mypy-router.*,features.*,models.*,training.*,runroute.*,numpy.*]
follow_imports = normal
"""


def build(force: bool = False) -> int:
    from router.native import BUILD_DIR, GROUP, MANIFEST, MODULES, source_digest, source_path, unusable

    why = unusable()
    if why is None and not force:
        print(f"native: up to date ({len(MODULES)} modules in {BUILD_DIR})")
        return 0
    print(f"native: building ({why or 'forced'})", flush=True)
    t0 = time.perf_counter()
    from mypyc.build import mypycify
    from setuptools import Distribution

    root = BUILD_DIR.parent
    root.mkdir(parents=True, exist_ok=True)
    digests = {mod: source_digest(mod) for mod in MODULES}
    work = Path(tempfile.mkdtemp(prefix="native-build-", dir=root))
    new = root / f"native.new-{os.getpid()}"
    try:
        cfg = work / "mypy.ini"
        cfg.write_text(MYPY_CONFIG)
        paths = [str(source_path(mod).relative_to(Path.cwd())) for mod in MODULES]
        exts = mypycify(
            ["--config-file", str(cfg), *paths],
            opt_level="3",
            group_name=GROUP,
            target_dir=str(work / "c"),
        )
        dist = Distribution(
            {
                "name": "runroute-native",
                "ext_modules": exts,
                "script_name": "build_native.py",
                "script_args": [
                    "-q",
                    "build_ext",
                    "--build-lib",
                    str(new),
                    "--build-temp",
                    str(work / "o"),
                    "--parallel",
                    "2",
                ],
            }
        )
        dist.parse_command_line()
        dist.run_commands()
        built = {mod: new.joinpath(*mod.split(".")) for mod in MODULES}
        missing = [m for m, stem in built.items() if not list(stem.parent.glob(stem.name + ".*"))]
        if missing:
            raise RuntimeError(f"mypyc produced no extension for {', '.join(missing)}")
        (new / MANIFEST).write_text(
            json.dumps({"cache_tag": sys.implementation.cache_tag, "modules": digests}, indent=1)
        )
        old = root / f"native.old-{os.getpid()}"
        if BUILD_DIR.exists():
            BUILD_DIR.rename(old)
        new.rename(BUILD_DIR)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(new, ignore_errors=True)
    print(f"native: built {len(MODULES)} modules in {time.perf_counter() - t0:.0f} s into {BUILD_DIR}")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the build is current")
    args = ap.parse_args()
    os.chdir(Path(__file__).resolve().parents[1])
    sys.exit(build(args.force))


if __name__ == "__main__":
    main()
