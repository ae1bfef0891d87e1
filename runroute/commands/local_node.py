"""`runroute local-node`: run one local vLLM replica with the flags the router relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("local-node")
    def local_node(
        model: Annotated[Path, typer.Option("--model", help="local model folder (runroute make-test-model)")],
        port: Annotated[int, typer.Option("--port", help="port to listen on (loopback)")],
        replica_index: Annotated[
            int,
            typer.Option("--replica-index", help="replica number: selects its CPU cores and state folder"),
        ] = 0,
        python: Annotated[
            str | None,
            typer.Option("--python", help="Python that has vllm (default: this one, then .venv-vllm)"),
        ] = None,
        host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
        served_model_name: Annotated[str, typer.Option("--served-model-name")] = "local",
        block_size: Annotated[
            int, typer.Option("--block-size", help="KV block tokens, multiple of 32 on CPU")
        ] = 32,
        kv_cache_gib: Annotated[float, typer.Option("--kv-cache-gib", help="VLLM_CPU_KVCACHE_SPACE")] = 1.0,
        max_model_len: Annotated[int, typer.Option("--max-model-len")] = 8192,
        cores_per_replica: Annotated[int, typer.Option("--cores-per-replica")] = 1,
        enforce_eager: Annotated[
            bool,
            typer.Option("--enforce-eager/--compile", help="eager: fastest start; compile: faster requests"),
        ] = True,
        state_dir: Annotated[
            Path | None, typer.Option("--state-dir", help="caches, TMPDIR and log (default .runroute/vllm)")
        ] = None,
        health_timeout_s: Annotated[float, typer.Option("--health-timeout")] = 300.0,
        print_argv: Annotated[
            bool, typer.Option("--print-argv", help="print the command and env; start nothing")
        ] = False,
    ) -> None:
        """Start vLLM's OpenAI server (prefix caching, cached-token usage, hermes tools), wait for /health,
        run until SIGINT/SIGTERM, then stop it cleanly."""
        from router.localnode.launch import (
            LocalNode,
            LocalNodeConfig,
            LocalNodeError,
            build_env,
            run_foreground,
        )
        from runroute.errors import CliError

        cfg = LocalNodeConfig(
            model=str(model),
            port=port,
            host=host,
            served_model_name=served_model_name,
            replica_index=replica_index,
            cores_per_replica=cores_per_replica,
            python=python,
            block_size=block_size,
            kv_cache_gib=kv_cache_gib,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            state_dir=str(state_dir) if state_dir else None,
            health_timeout_s=health_timeout_s,
        )
        try:
            if print_argv:
                node = LocalNode(cfg)
                env = build_env(cfg, base={})
                typer.echo(" ".join(f"{k}={v}" for k, v in sorted(env.items())))
                typer.echo(" ".join(node.argv()))
                return
            code = run_foreground(cfg)
        except LocalNodeError as e:
            raise CliError(str(e).splitlines()[0], exit_code=1) from None
        if code:
            raise typer.Exit(code)
