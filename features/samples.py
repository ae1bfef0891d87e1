"""The shipped run-log samples: where they are, in a source checkout or an installed package.

The samples live in ``data/`` at the top of the repository; the build installs that folder as the
package ``runroute.data`` (``pyproject.toml``: ``package-dir``), so the same files are found through
:mod:`importlib.resources` whether runroute runs from a checkout (editable install) or from a wheel
installed anywhere. Every reader of the samples (the demo, ``runroute serve``'s first-start training,
the tests) goes through :func:`sample_path` / :func:`sample_files`; none builds a path from
``__file__``.

Knobs: :data:`SAMPLES_PACKAGE` (the package the samples are installed as).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["SAMPLES_PACKAGE", "samples_dir", "sample_path", "sample_files"]

SAMPLES_PACKAGE = "runroute.data"


def samples_dir() -> Path:
    """The directory holding the shipped samples (raises ``FileNotFoundError`` if not installed)."""
    try:
        root = resources.files(SAMPLES_PACKAGE)
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"the shipped samples (package {SAMPLES_PACKAGE}) are not installed; reinstall runroute"
        ) from None
    path = Path(str(root))
    if not path.is_dir():  # e.g. a zipped install: not supported, the samples are read by path
        raise FileNotFoundError(f"the shipped samples are not a directory on disk: {root}")
    return path


def sample_path(name: str) -> Path:
    """The path of one shipped sample, e.g. ``sample_path("tau2bench_airline.parquet")``."""
    path = samples_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"no shipped sample {name!r} in {path.parent}")
    return path


def sample_files(pattern: str = "*.parquet") -> list[Path]:
    """Every shipped sample whose name matches ``pattern``, sorted by name."""
    return sorted(samples_dir().glob(pattern))
