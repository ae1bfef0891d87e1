"""How many function parameters in router/ and training/ are annotated with ``Any`` (issue 23).

What is counted: every parameter of every ``def`` / ``async def`` (positional-only, ordinary,
keyword-only, ``*args``, ``**kwargs``; ``self`` and other unannotated parameters are skipped) whose
annotation mentions ``Any`` anywhere — ``Any``, ``typing.Any``, ``dict[str, Any]``,
``Callable[..., Any]``, ``list[Any] | None`` all count once. The denominator is every annotated
parameter. Only the annotation's own text is read (the AST), so an alias that hides ``Any``
(``Json = dict[str, Any]``) is *not* counted: do not use one to lower the figure.

Output: the annotated-parameter totals per package, the ``Any`` counts for router and training,
then the files with the most ``Any`` parameters (``--top``, default 40).

Usage, from the repository root: ``python3 bench/count_any.py [--top 40]`` (no dependencies;
under a second).
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib

PACKAGES = ("router", "training")


def mentions_any(annotation: ast.expr) -> bool:
    """True when the annotation names ``Any`` (bare or as ``typing.Any``) anywhere inside it."""
    return any(
        (isinstance(x, ast.Name) and x.id == "Any") or (isinstance(x, ast.Attribute) and x.attr == "Any")
        for x in ast.walk(annotation)
    )


def count(root: pathlib.Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """(annotated parameters per package, Any parameters per file and per ``<package>_total``)."""
    any_params: collections.Counter[str] = collections.Counter()
    annotated: collections.Counter[str] = collections.Counter()
    for path in sorted(root.glob("*/**/*.py")):
        rel = path.relative_to(root)
        top = rel.parts[0]
        if top not in PACKAGES:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            args = a.posonlyargs + a.args + a.kwonlyargs
            args += [x for x in (a.vararg, a.kwarg) if x is not None]
            for arg in args:
                if arg.annotation is None:
                    continue
                annotated[top] += 1
                if mentions_any(arg.annotation):
                    any_params[str(rel)] += 1
                    any_params[top + "_total"] += 1
    return annotated, any_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--top", type=int, default=40, help="files listed, most Any parameters first")
    args = ap.parse_args()
    annotated, any_params = count(pathlib.Path("."))
    print(annotated, any_params["router_total"], any_params["training_total"])
    for name, n in any_params.most_common(args.top):
        print(n, name)


if __name__ == "__main__":
    main()
