"""`runroute make-test-model OUT_DIR`: a tiny random Llama model + locally trained tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _has_model_libs() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "tokenizers", "torch"))


def register(app: typer.Typer) -> None:
    @app.command("make-test-model")
    def make_test_model(
        out_dir: Annotated[Path, typer.Argument(help="folder to write the model into")],
        python: Annotated[
            str | None,
            typer.Option("--python", help="Python with transformers (default: this one, then .venv-vllm)"),
        ] = None,
    ) -> None:
        """Build a tiny Llama-architecture model with random weights and a BPE tokenizer trained on the
        project's own text, with a hermes-style tool chat template. Nothing comes from a model hub.

        transformers/tokenizers/torch live in .venv-vllm; when this interpreter lacks them the build
        runs there (python -m router.localnode.testmodel)."""
        import json
        import os
        import subprocess
        import sys

        from router.localnode.launch import project_root
        from runroute.errors import CliError

        if python is None and _has_model_libs():
            from router.localnode.testmodel import build_test_model

            try:
                manifest = build_test_model(out_dir)
            except ValueError as e:
                raise CliError(str(e)) from None
            typer.echo(
                f"make-test-model: {out_dir} ({manifest['parameters']} parameters, vocab {manifest['vocab']}, "
                f"{manifest['total_s']:.1f} s)"
            )
            return
        py = python or str(project_root() / ".venv-vllm" / "bin" / "python")
        if not Path(py).exists():
            raise CliError(
                f"transformers/tokenizers/torch are not installed here and {py} does not exist: "
                "run `bash scripts/setup-vllm.sh` (or `make test-vllm`) to create .venv-vllm",
                exit_code=1,
            )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root()), env.get("PYTHONPATH")]))
        env.setdefault("HF_HUB_OFFLINE", "1")
        r = subprocess.run(
            [py, "-m", "router.localnode.testmodel", str(out_dir)], env=env, capture_output=True, text=True
        )
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise CliError(f"make-test-model failed in {py}: {last}", exit_code=1)
        manifest = json.loads(r.stdout.strip().splitlines()[-1])
        typer.echo(
            f"make-test-model: {out_dir} ({manifest['parameters']} parameters, vocab {manifest['vocab']}, "
            f"{manifest['total_s']:.1f} s, built with {py})"
        )
        sys.stdout.flush()
