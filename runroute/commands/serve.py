"""`runroute serve`: the routing sidecar (OpenAI-compatible) on one uvicorn worker.

With ``--config FILE`` it serves exactly what the file (plus RUNROUTE_* env overrides) says.
With no config it starts on embedded defaults so a newcomer can try it at once:

- two fake vLLM replicas and a fake frontier (``router.fakes``) as child processes on free
  loopback ports (stopped when the server stops); they end a tool loop like a small real model
  does (a 128k-context model: :data:`EMBEDDED_CONTEXT_TOKENS`): once a request carries
  ``--max-tool-turns`` tool results (default
  :data:`DEFAULT_MAX_TOOL_TURNS`) they answer with a final text instead of another tool call, so
  an agent's multi-step run finishes (0 = never: every request offering tools gets a tool call);
- the model names agents send by default are mapped (:data:`DEFAULT_MODEL_ALIASES`: Claude
  Code's ``claude-*``, openai-agents' and the OpenAI SDK examples' ``gpt-*`` / ``o*``): they are
  aliases, so the policy still chooses the tier, as for ``auto``;
- exploration is off (``policy.explore`` absent): a newcomer's first runs go where the policy and
  the banner say, deterministically; exploration only pays once outcomes are posted and the
  bundle is retrained, which needs a config anyway (``policy.explore`` in ``runroute.yaml``);
- the learned policy with the bundle in ``./runroute-bundle``, trained from the shipped run logs
  (``features.samples``: ``data/`` in a checkout, package ``runroute.data`` when installed) at
  first start when absent (progress printed; MLflow off), unless ``RUNROUTE_BUNDLE__MLFLOW_URI``
  names a registry bundle (``models:/runroute-bundle@champion``): then that one serves, followed
  as its alias moves;
- run logs under ``./runroute-logs``.

It prints where everything is, then serves with uvloop + httptools, one worker, under the
connection limits of :mod:`router.server.limits` (idle / header / body timeouts, a connection cap
with 503 beyond it; the soft open-file limit raised to fit the cap). SIGTERM and SIGINT
both shut down gracefully and then stop the demo's fake backends: uvicorn re-raises the signal it
caught after its shutdown, and SIGTERM's handler here turns it into ``SystemExit`` (143) so the
fakes' context managers run (the default action would kill the process with them orphaned).
"""

from __future__ import annotations

from pathlib import Path

import typer

from runroute.deployconfig import SHOW_HELP, deployment_for
from runroute.errors import CliError

__all__ = [
    "register",
    "train_default_bundle",
    "DEFAULT_BUNDLE",
    "DEFAULT_LOGS",
    "DEFAULT_MAX_TOOL_TURNS",
    "DEFAULT_MODEL_ALIASES",
]

DEFAULT_BUNDLE = Path("runroute-bundle")
DEFAULT_LOGS = Path("runroute-logs")
# tool results after which the embedded fakes answer with a final text (a run that finishes): short
# enough that a newcomer's first agent run ends in seconds, long enough to be a multi-step tool run
DEFAULT_MAX_TOOL_TURNS = 3
# client model names (fnmatch) the embedded frontier entry accepts as aliases of "auto"
DEFAULT_MODEL_ALIASES = ("claude-*", "gpt-*", "o[0-9]*", "chatgpt-*")
# context length of the embedded fake vLLM replicas (their max_model_len and local.max_context)
EMBEDDED_CONTEXT_TOKENS = 131072
_TRAIN_FILES = (
    "tau2bench_airline.parquet",
    "taubench_airline.parquet",
    "swebench_pro.parquet",
    "mooncake_20min.parquet",
)


def train_default_bundle(out: Path) -> None:
    from features.samples import samples_dir
    from training.train import TrainConfig, run_training

    try:
        data = samples_dir()
    except FileNotFoundError as e:
        raise CliError(f"no bundle at {out} and {e}") from None
    runs = [data / f for f in _TRAIN_FILES if (data / f).exists()]
    if not runs:
        raise CliError(f"no bundle at {out} and no shipped run logs in {data} to train one")
    typer.echo(f"runroute: no bundle at {out}: training one from {len(runs)} shipped run logs (once)...")
    cfg = TrainConfig.model_validate(
        {"runs": runs, "out": out, "mlflow": False, "evaluate": False, "n_estimators": 100, "n_jobs": 1}
    )
    run_training(cfg, progress=lambda msg: typer.echo(f"  train: {msg}"))
    typer.echo(f"runroute: bundle written to {out}")


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        config: Path | None = typer.Option(
            None, "--config", "-c", help="runroute.yaml (default: embedded demo)"
        ),
        host: str | None = typer.Option(None, "--host", help="bind address (default from config: 127.0.0.1)"),
        port: int | None = typer.Option(None, "--port", help="port (default from config: 8080)"),
        max_tool_turns: int = typer.Option(
            DEFAULT_MAX_TOOL_TURNS,
            "--max-tool-turns",
            min=0,
            help="embedded defaults only: the fake backends answer with a final text once a request "
            "carries this many tool results (0 = always another tool call)",
        ),
        workers: int = typer.Option(
            1, "--workers", help="worker processes behind the port (> 1 needs store.kind: redis)"
        ),
        show_config: bool = typer.Option(False, "--show-config", help=SHOW_HELP),
    ) -> None:
        """Serve the routing sidecar: POST /v1/chat/completions with model "auto"."""
        import contextlib
        import os

        if show_config:  # the deployment part, resolved as whatif / bench / evaluate resolve it
            deployment_for(config, True)

        # One OpenMP thread for LightGBM's one-row predictions: with the default (all cores) each
        # Booster.predict costs ~25 ms on a busy 2-core machine instead of ~25 us (measured).
        # Must be set before lightgbm is imported.
        os.environ.setdefault("OMP_NUM_THREADS", "1")

        from router.server.settings import RouterSettings, SettingsError

        server: dict[str, object] = {}
        if host is not None:
            server["host"] = host
        if port is not None:
            server["port"] = port
        import signal

        def _terminate(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _terminate)
        with contextlib.ExitStack() as stack:
            try:
                if config is not None:
                    if max_tool_turns != DEFAULT_MAX_TOOL_TURNS:
                        raise CliError(
                            "--max-tool-turns sets the embedded fakes; a --config serves its own backends"
                        )
                    settings = RouterSettings.load(config, **({"server": server} if server else {}))
                else:
                    settings = _demo_settings(stack, server, max_tool_turns)
            except SettingsError as e:
                raise CliError(str(e)) from None
            _run(settings, config, max_tool_turns, workers, server)


def _demo_settings(stack, server: dict[str, object], max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS):
    import os

    from router.fakes.launch import start_fake_process
    from router.server.settings import RouterSettings

    # a registry source in the environment replaces the embedded bundle path (RouterSettings.load)
    registry = bool(os.environ.get("RUNROUTE_BUNDLE__MLFLOW_URI", "").strip())
    if not registry and not DEFAULT_BUNDLE.exists():
        train_default_bundle(DEFAULT_BUNDLE)
    typer.echo("runroute: starting demo backends (fake vLLM x2, fake frontier) ...")
    # a 128k-context model, as agents expect (Claude Code asks for max_tokens=64000 on every step)
    v0, v1 = (
        stack.enter_context(
            start_fake_process(
                "vllm",
                model="local-model",
                name=f"fake-vllm-{i}",
                max_tool_turns=max_tool_turns,
                max_model_len=EMBEDDED_CONTEXT_TOKENS,
            )
        )
        for i in range(2)
    )
    fr = stack.enter_context(
        start_fake_process(
            "frontier", model="frontier-model", name="fake-frontier", max_tool_turns=max_tool_turns
        )
    )
    return RouterSettings.load(
        None,
        local={"urls": [v0.url, v1.url], "model": "local-model", "max_context": EMBEDDED_CONTEXT_TOKENS},
        frontier={
            "url": fr.url,
            "model": "frontier-model",
            "allow_no_key": True,
            "models": list(DEFAULT_MODEL_ALIASES),
        },
        # exploration off (module docstring): policy.explore in a config turns it on
        policy={"kind": "learned"},
        bundle={"path": str(DEFAULT_BUNDLE)},
        runlog={"dir": str(DEFAULT_LOGS)},
        server=server,
    )


def _explore_line(s) -> str:
    explore = getattr(s.policy, "explore", None)
    if explore is None or explore.rate <= 0:
        return "off (set policy.explore in a config to explore with logged propensities)"
    return f"{explore.rate:.0%} of runs (policy.explore.rate: 0 turns it off)"


def check_runlog_dir(d: Path) -> None:
    """``runlog.dir`` must be (or become) a writable directory: a clear error (exit 2) otherwise,
    before anything starts."""
    if d.exists() and not d.is_dir():
        raise CliError(f"runlog.dir {d} exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".runroute-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise CliError(f"runlog.dir {d} is not a writable directory: {e.strerror or e}") from None


def _run(
    settings,
    config: Path | None,
    max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS,
    workers: int = 1,
    server: dict[str, object] | None = None,
) -> None:
    import uvicorn

    from router.server.app import create_app
    from router.server.workers import WorkersError, check_workers

    s = settings
    try:
        check_workers(s, workers)
    except WorkersError as e:
        raise CliError(str(e)) from None
    check_runlog_dir(Path(s.runlog.dir))
    if s.bundle.path is not None or s.bundle.mlflow_uri is not None:
        # fail fast with one line (the app loads it again in its lifespan, where errors are tracebacks)
        from router.server.bundles import load_bundle

        try:
            load_bundle(s.bundle.path, s.bundle.mlflow_uri, s.bundle.tracking_uri())
        except (ValueError, OSError) as e:  # BundleError is a ValueError
            raise CliError(f"cannot load bundle {s.bundle.path or s.bundle.mlflow_uri}: {e}") from None
    try:
        # a config the app refuses at build time (e.g. tracing.exporter otlp without its package)
        app = create_app(s) if workers == 1 else None
    except ValueError as e:
        raise CliError(f"config: {e}") from None
    url = f"http://{s.server.host}:{s.server.port}"
    lines = [
        f"runroute serve ({'config ' + str(config) if config else 'embedded demo defaults'})",
        f'  OpenAI base URL : {url}/v1   (model "auto"; send X-Run-Id per agent run)',
    ]
    if s.local is not None:
        for name, u in zip(s.local.names or [], s.local.urls, strict=True):
            lines.append(f"  local {name:<9} : {u}  model {s.local.model}")
    if s.frontier is not None:
        lines.append(f"  frontier        : {s.frontier.url}  model {s.frontier.model}")
    lines += [
        f"  policy          : {s.policy_kind}"
        + (
            f"  bundle {s.bundle.path or s.bundle.mlflow_uri}"
            if (s.bundle.path or s.bundle.mlflow_uri)
            else ""
        ),
        f"  exploration     : {_explore_line(s)}",
        f"  run logs        : {Path(s.runlog.dir).resolve()}",
        f"  metrics         : {url}/metrics   runs: {url}/v1/runs   ready: {url}/ready",
        f"  live page       : {url}/ui",
    ]
    if config is None:
        lines.insert(2, f"  Anthropic base  : {url}   (Claude Code: ANTHROPIC_BASE_URL={url})")
        lines.append(
            f"  fakes           : end a tool loop after {max_tool_turns} tool results (--max-tool-turns)"
        )
    if workers > 1:
        lines.append(f"  workers         : {workers} processes (run state in {s.store.kind})")
    typer.echo("\n".join(lines), err=False)
    from router.server.limits import FD_MARGIN, GuardedHttpToolsProtocol, raise_nofile, uvicorn_options

    raise_nofile(s.server.max_connections + FD_MARGIN)
    if workers > 1:  # the supervisor: each worker builds its app from the same file (router.server.workers)
        import os
        import shutil
        import tempfile

        from router.server.workers import worker_env

        shared = Path(tempfile.mkdtemp(prefix="runroute-metrics-"))  # the workers' merged /metrics
        os.environ.update(worker_env(config, server or {}, shared))
        # the worker processes get the config by pickling: the module-level protocol class (its
        # header/idle timers at their documented defaults) instead of uvicorn_options' per-config class
        try:
            uvicorn.run(
                "router.server.workers:app_from_env",
                factory=True,
                host=s.server.host,
                port=s.server.port,
                loop="uvloop",
                http=GuardedHttpToolsProtocol,
                timeout_keep_alive=s.server.idle_timeout_s,
                limit_concurrency=s.server.max_connections,
                workers=workers,
                log_level="warning",
                access_log=False,
                lifespan="on",
            )
        finally:
            shutil.rmtree(shared, ignore_errors=True)
        return
    assert app is not None
    uvicorn.run(
        app,
        host=s.server.host,
        port=s.server.port,
        loop="uvloop",
        **uvicorn_options(s.server),  # httptools with the idle/header timers, the connection cap
        workers=1,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
