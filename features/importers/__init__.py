"""Importers: public traces in ../shared/data -> run-log frames (:mod:`features.schema`).

One module per source, each with ``import_<source>(path, *, strict=False, bad_rows=None)`` returning a
pandas DataFrame with exactly the run-log columns (:func:`features.runlog.records_to_frame`):

========================  ==========================================================================
source (CLI name)         records
========================  ==========================================================================
``mooncake``              Run + Step (requests chained into conversations by shared hash_ids)
``taubench``              Run + Step (one run per simulation, one step per assistant message)
``tau2bench``             Run + Step (one run per simulation, one step per agent generation)
``swebench-pro``          Run only (resolved true/false per model x instance)
``azure``                 Arrival (request arrivals with token counts)
``servegen``              RateWindow (per-client 10-minute rate windows)
========================  ==========================================================================

Bad source rows (unparsable line, negative or missing token counts, ...) are never dropped silently:
each becomes a :class:`features.runlog.BadRow` appended to the caller's ``bad_rows`` list; with
``strict=True`` the first one raises :class:`features.runlog.RunLogError` instead. Whole-file problems
(missing path, empty file, truncated JSON document) raise :class:`RunLogError` with a one-line message.

Shared conventions (documented once here, used by every trajectory importer):

- token estimate when a source logs no usage: ``ceil(chars / 4)`` per text, plus
  :data:`MESSAGE_OVERHEAD_TOKENS` per chat message (role markers), see :func:`estimate_tokens`.
- ``tool_call_keys``: the first 12 hex digits of sha1(name + canonical JSON of the arguments), so a
  repeated identical call (a loop) has a repeated key, see :func:`tool_call_key`.
- tool error flag: the source's own ``error`` flag where logged, else :func:`looks_like_error`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from features.runlog import BadRow

__all__ = [
    "SOURCES",
    "MESSAGE_OVERHEAD_TOKENS",
    "CHARS_PER_TOKEN",
    "get_importer",
    "import_source",
    "check_path",
    "estimate_tokens",
    "tool_call_key",
    "looks_like_error",
    "report_bad",
    "to_frame",
]

#: CLI source name -> (module, function)
SOURCES: dict[str, tuple[str, str]] = {
    "mooncake": ("features.importers.mooncake", "import_mooncake"),
    "taubench": ("features.importers.taubench", "import_taubench"),
    "tau2bench": ("features.importers.tau2bench", "import_tau2bench"),
    "swebench-pro": ("features.importers.swebench_pro", "import_swebench_pro"),
    "azure": ("features.importers.azure", "import_azure"),
    "servegen": ("features.importers.servegen", "import_servegen"),
}

# the one token estimate (shared with the sidecar): features.tokens
from features.tokens import CHARS_PER_TOKEN, MESSAGE_OVERHEAD_TOKENS, text_tokens  # noqa: E402

_ERROR_RE = re.compile(r'^\s*(error\b|exception\b|traceback\b)|"error"\s*:', re.IGNORECASE)


def get_importer(source: str) -> Callable[..., pd.DataFrame]:
    """The ``import_<source>`` function for a CLI source name (imported lazily)."""
    import importlib

    from features.runlog import RunLogError

    if source not in SOURCES:
        raise RunLogError(f"unknown source '{source}' (expected one of: {', '.join(SOURCES)})")
    mod, fn = SOURCES[source]
    return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]


def import_source(
    source: str,
    path: str | Path,
    *,
    strict: bool = False,
    bad_rows: list[BadRow] | None = None,
    embed: bool = False,
) -> pd.DataFrame:
    """Import ``path`` with the importer for ``source`` (``embed``: tau2bench only, the task
    embedding of each run's first user message)."""
    if embed:
        if source != "tau2bench":
            from features.runlog import RunLogError

            raise RunLogError(f"--embed: only tau2bench runs carry a task text to embed (not {source})")
        return get_importer(source)(path, strict=strict, bad_rows=bad_rows, embed=True)
    return get_importer(source)(path, strict=strict, bad_rows=bad_rows)


def check_path(path: str | Path, *, allow_dir: bool = False) -> Path:
    """Resolve an input path or raise a one-line :class:`RunLogError` (missing, empty, a directory)."""
    from features.runlog import RunLogError

    p = Path(path)
    if not p.exists():
        raise RunLogError(f"{p}: no such file or directory")
    if p.is_dir():
        if not allow_dir:
            raise RunLogError(f"{p}: is a directory (pass a file)")
        return p
    if p.stat().st_size == 0:
        raise RunLogError(f"{p}: empty file")
    return p


def load_json_file(p: Path) -> Any:
    """Parse one JSON document; a truncated/invalid file -> one-line :class:`RunLogError`."""
    import orjson

    from features.runlog import RunLogError

    try:
        return orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as e:
        raise RunLogError(f"{p}: not valid JSON ({str(e).splitlines()[0]}); truncated file?") from None


def estimate_tokens(text: str | None) -> int:
    """``ceil(len(text) / CHARS_PER_TOKEN)``; 0 for None/empty."""
    return text_tokens(len(text)) if text else 0


def tool_call_key(name: str, arguments: Any) -> str:
    """12-hex sha1 of the tool name and its canonical (sorted-key, compact) JSON arguments.

    ``arguments`` may be a dict or a JSON string (OpenAI format); an unparsable string is hashed as is.
    """
    import orjson

    if isinstance(arguments, (str, bytes)):
        try:
            arguments = orjson.loads(arguments) if arguments else {}
        except orjson.JSONDecodeError:
            pass
    if isinstance(arguments, (str, bytes)):
        canon = arguments.encode() if isinstance(arguments, str) else arguments
    else:
        canon = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.sha1(name.encode() + b"\x00" + canon).hexdigest()[:12]


def looks_like_error(text: str | None) -> bool:
    """Heuristic tool-error flag when a source does not log one.

    True when the output starts with ``Error``/``Exception``/``Traceback`` (case-insensitive; how
    tau-bench tools report failures, e.g. "Error: not enough seats") or is JSON with an ``"error"`` key.
    """
    return bool(text) and _ERROR_RE.search(text[:2000]) is not None  # type: ignore[index]


def report_bad(
    bad_rows: list[BadRow] | None, strict: bool, path: Path | str, row: int, reason: str, raw: Any = None
) -> None:
    """Record one bad source row: raise in strict mode, else append to ``bad_rows`` (if given)."""
    from features.runlog import BadRow, RunLogError

    b = BadRow(str(path), row, reason, raw)
    if strict:
        raise RunLogError(f"{b} (strict mode)")
    if bad_rows is not None:
        bad_rows.append(b)


def to_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Record dicts -> run-log frame with every column and ``schema_version`` set."""
    from features.runlog import records_to_frame
    from features.schema import SCHEMA_VERSION

    df = records_to_frame(records)
    df["schema_version"] = SCHEMA_VERSION
    return df
