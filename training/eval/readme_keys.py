"""The list of scorecard and what-if keys in ``docs/scorecard.md``, generated from the typed scorecard models.

Algorithm: walk the fields of :class:`training.eval.scorecard.Scorecard` depth first, in declared
order; each field becomes one bullet ``- `name`: description`` (its JSON name, with ``[]`` for a
list and ``.<key>`` for a mapping, the key named by the field's ``each``), and a field whose type is
another scorecard model is followed by that model's fields, indented (``Skipped``, the
``{"skipped": reason}`` stand-in, is named in the descriptions instead). The what-if rows
(:class:`training.eval.scorecard.WhatIfRow`) are listed the same way, after checking that their
names are ``router.sim.whatif.SCORECARD_KEYS`` in order (a mismatch is an error, never a stale doc).

The block sits between ``<!-- scorecard-keys:begin -->`` and ``<!-- scorecard-keys:end -->`` in
docs/scorecard.md; ``report.md`` ends with the scorecard part of the same text.

Usage: ``python -m training.eval.readme_keys`` prints the block; ``--write docs/scorecard.md`` rewrites
the block in place; ``--check docs/scorecard.md`` exits 1 when the block is out of date (the tests do the same).

Knobs: the wrap width of the generated lines (:data:`WIDTH`).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from training.eval.scorecard import SCHEMA, Scorecard, Skipped, WhatIfRow

__all__ = [
    "BEGIN",
    "END",
    "WIDTH",
    "COMMAND",
    "scorecard_keys",
    "whatif_keys",
    "readme_block",
    "update_readme",
    "documented_models",
    "main",
]

BEGIN = "<!-- scorecard-keys:begin -->"
END = "<!-- scorecard-keys:end -->"
WIDTH = 110
COMMAND = "python -m training.eval.readme_keys --write docs/scorecard.md"
_NOTE = (
    f"<!-- generated from training/eval/scorecard.py by `{COMMAND}`; edit the field descriptions there -->"
)


def _shape(ann: object, each: str | None) -> tuple[str, list[type[BaseModel]]]:
    """(suffix of the JSON name, models to expand) of a field's type."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "", [] if ann is Skipped else [ann]
    if origin in (typing.Union, types.UnionType):
        suffix, models = "", []
        for a in args:
            if a is type(None):
                continue
            s, m = _shape(a, each)
            suffix = suffix or s
            models += [x for x in m if x not in models]
        return suffix, models
    if origin is list:
        s, m = _shape(args[0], each)
        return "[]" + s, m
    if origin is dict:
        s, m = _shape(args[1], each)
        return (f".<{each}>" + s if each else s), m
    return "", []


def _lines(model: type[BaseModel], depth: int) -> list[str]:
    out: list[str] = []
    indent = "  " * depth
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        each = extra.get("each")
        suffix, models = _shape(f.annotation, each if isinstance(each, str) else None)
        key = f.alias or name
        text = f"{indent}- `{key}{suffix}`: {f.description}"
        out.append(
            textwrap.fill(
                text,
                width=WIDTH,
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
        for m in models:
            out += _lines(m, depth + 1)
    return out


def documented_models() -> list[type[BaseModel]]:
    """Every model whose fields the generated text lists (for the tests)."""
    seen: list[type[BaseModel]] = []

    def visit(m: type[BaseModel]) -> None:
        if m in seen:
            return
        seen.append(m)
        for f in m.model_fields.values():
            for sub in _shape(f.annotation, None)[1]:
                visit(sub)

    visit(Scorecard)
    visit(Skipped)
    visit(WhatIfRow)
    return seen


def scorecard_keys() -> str:
    """The key reference of ``scorecard.json`` (markdown)."""
    head = (
        f"`scorecard.json` (schema `{SCHEMA}`), written by `runroute demo` and `runroute bench --json`. "
        'Keys marked "demo:" are written by the demo only, "bench:" by bench only; `null` is an undefined '
        'figure; a part that did not run is `{"skipped": reason}`.'
    )
    return textwrap.fill(head, width=WIDTH) + "\n\n" + "\n".join(_lines(Scorecard, 0)) + "\n"


def whatif_keys() -> str:
    """The key reference of the rows of ``runroute whatif --json`` (markdown); checks the key list."""
    from router.sim.whatif import SCORECARD_KEYS

    names = tuple(WhatIfRow.model_fields)
    if names != tuple(SCORECARD_KEYS):
        raise RuntimeError(
            "training.eval.scorecard.WhatIfRow is out of date with router.sim.whatif.SCORECARD_KEYS: "
            f"{names} != {tuple(SCORECARD_KEYS)}"
        )
    head = (
        "`runroute whatif --json` writes one row per (policy x replicas x KV size) with these keys "
        '(`router.sim.whatif.SCORECARD_KEYS`; the definitions also in ../shared/ARCHITECTURE.md, "Scorecard"):'
    )
    return textwrap.fill(head, width=WIDTH) + "\n\n" + "\n".join(_lines(WhatIfRow, 0)) + "\n"


def readme_block() -> str:
    """The whole generated block, markers included."""
    return f"{BEGIN}\n{_NOTE}\n\n{scorecard_keys()}\n{whatif_keys()}{END}"


def update_readme(text: str) -> str:
    """``text`` (a README) with its marked block replaced by :func:`readme_block`."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    return text[:i] + readme_block() + text[j + len(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", type=Path, metavar="README", help="rewrite the marked block in this file")
    g.add_argument("--check", type=Path, metavar="README", help="exit 1 if the block in this file is stale")
    a = ap.parse_args(argv)
    if a.write is None and a.check is None:
        print(readme_block())
        return 0
    path = a.write or a.check
    old = path.read_text()
    new = update_readme(old)
    if a.check is not None:
        if new != old:
            print(f"{path}: the scorecard key list is out of date; run: {COMMAND}")
            return 1
        return 0
    if new != old:
        path.write_text(new)
        print(f"{path}: scorecard key list rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
