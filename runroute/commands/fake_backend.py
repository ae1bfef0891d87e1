"""`runroute fake-backend`: serve a fake vLLM replica or a fake frontier API on a loopback port."""

from __future__ import annotations

import typer

from runroute.errors import CliError


def register(app: typer.Typer) -> None:
    @app.command(
        "fake-backend",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def fake_backend(
        ctx: typer.Context,
        kind: str = typer.Option(..., "--kind", help="vllm or frontier"),
        port: int = typer.Option(0, "--port", help="port to listen on (0 = a free one)"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to bind"),
        model: str | None = typer.Option(None, "--model", help="served model name"),
    ) -> None:
        """Serve a fake backend until Ctrl-C. Extra --knob=value options set the fake's knobs
        (see router/fakes/vllm.py and frontier.py), e.g. --zero-latency --error-rate=0.1.
        Prints one JSON line with the URL when ready."""
        from router.fakes.launch import KnobError, parse_knob_args, serve_forever

        try:
            knobs: dict[str, object] = dict(parse_knob_args(ctx.args))
            if model is not None:
                knobs["model"] = model
            serve_forever(kind, host, port, knobs)
        except KnobError as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"cannot listen on {host}:{port}: {e}", 1) from None
