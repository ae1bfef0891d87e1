"""The metric list of ``docs/metrics.md``, generated from :data:`router.server.metrics.specs.SPECS` and
:data:`router.server.metrics.specs.DEPRECATED` (the one declaration of every series).

``python -m router.server.metrics.doc --write docs/metrics.md`` rewrites the block between the
``metrics:begin`` / ``metrics:end`` markers; ``--check docs/metrics.md`` exits 1 when it is stale (the
test suite runs the check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from router.server.metrics.specs import DEPRECATED, SPECS

__all__ = ["BEGIN", "END", "readme_block", "replace_block", "main"]

BEGIN = "<!-- metrics:begin -->"
END = "<!-- metrics:end -->"


def readme_block() -> str:
    """The markdown between the markers (markers included)."""
    lines = [
        BEGIN,
        "<!-- generated from router/server/metrics/specs.py by `python -m router.server.metrics.doc --write docs/metrics.md`;"
        " edit the help texts there -->",
        "| metric | type | labels | what it counts |",
        "|---|---|---|---|",
    ]
    for s in SPECS:
        labels = ", ".join(f"`{x}`" for x in s.labels) or "-"
        lines.append(f"| `{s.exposed}` | {s.kind} | {labels} | {s.help.replace('|', '/')} |")
    lines += [
        "",
        "Deprecated names (runroute 0.1), exposed while `metrics.deprecated_names` is true (the default of "
        "this release; removed in the next): "
        + ", ".join(f"`{a.old}` -> `{a.new}`" for a in DEPRECATED)
        + ". Same names with changed labels: `runroute_requests_total` (label `status` is now `code`; new "
        'label `handler`: every endpoint is counted, `handler="/v1/chat/completions"` is the 0.1 figure plus '
        "the rejections before routing), `runroute_prompt_tokens_total` (new label `model`), "
        "`runroute_flaps_total` (new label `cause`), `runroute_bundle_info` (new label `registry_version`).",
        END,
    ]
    return "\n".join(lines)


def replace_block(text: str) -> str:
    """``text`` with the block between the markers regenerated (ValueError without markers)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + readme_block() + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, help="rewrite the block in this file")
    g.add_argument("--check", type=Path, help="exit 1 when the block in this file is stale")
    a = ap.parse_args(argv)
    path = a.write or a.check
    text = path.read_text()
    new = replace_block(text)
    if a.check:
        if new != text:
            print(f"{path}: the metric list is stale; run python -m router.server.metrics.doc --write {path}")
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
