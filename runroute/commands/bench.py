"""`runroute bench`: every routing policy on any run logs with a given bundle -> scorecard JSON (+ plots)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer

from router.policy.defaults import KV_CACHE_GB
from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for, given
from runroute.errors import CliError


def _floats(s: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what}: expected comma-separated numbers, got {s!r}") from None
    if not vals:
        raise CliError(f"{what}: expected one or more comma-separated numbers")
    return vals


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        ctx: typer.Context,
        runs: Annotated[
            list[str] | None, typer.Option("--runs", help="run-log file(s); repeat or comma-separate")
        ] = None,
        bundle: Annotated[Path | None, typer.Option("--bundle", help="model bundle directory")] = None,
        json_out: Annotated[Path | None, typer.Option("--json", help="write the scorecard JSON here")] = None,
        more_runs: Annotated[
            list[str] | None, typer.Argument(help="more run-log files (`--runs A B`)")
        ] = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write the cost-quality PNG here")] = None,
        report_dir: Annotated[
            Path | None, typer.Option("--report-dir", help="also write report.md + all plots here")
        ] = None,
        replicas: Annotated[
            int, typer.Option("--replicas", help="simulated local replicas (with --config: the file's)")
        ] = 2,
        kv_cache_gb: Annotated[
            float,
            typer.Option("--kv-cache-gb", help="KV cache per replica (GB; with --config: node.kv_cache_gb)"),
        ] = KV_CACHE_GB,
        arrival_rate: Annotated[float, typer.Option("--arrival-rate", help="run starts per second")] = 0.1,
        no_admission: Annotated[
            bool, typer.Option("--no-admission", help="no admission control (default: admission.enabled)")
        ] = False,
        frontier_price: Annotated[
            str | None, typer.Option("--frontier-price", help="USD per 1M tokens: IN,CACHED_IN,OUT")
        ] = None,
        gpu_hour_usd: Annotated[
            float | None, typer.Option("--gpu-hour-usd", help="local GPU-hour price")
        ] = None,
        sweep: Annotated[
            str | None, typer.Option("--sweep", help="p_frontier thresholds to sweep, e.g. 0,0.1,...,1")
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of arrivals and latency draws")] = 0,
        dask: Annotated[
            str | None,
            typer.Option(
                "--dask", help="each simulation (policy, sweep point) a Dask task: 'local' or an address"
            ),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                "--workers", min=1, help="--dask local: worker processes (default 2); an address: wait for N"
            ),
        ] = None,
        config: Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)] = None,
        show_config: Annotated[bool, typer.Option("--show-config", help=SHOW_HELP)] = False,
    ) -> None:
        """Compare always-local, always-frontier, per-step-threshold, session-sticky, stall-escalation,
        learned and oracle on the given logs (what-if simulator + the outcome model), write the scorecard."""
        from pydantic import ValidationError
        from rich.console import Console

        from models.bundle import BundleError
        from training.eval.bench import bench_runs
        from training.eval.config import SimSettings, prices_for
        from training.eval.plots import plot_frontier
        from training.eval.report import print_scorecard, write_report
        from training.jsonio import atomic_write

        flags: dict[str, tuple[str, object]] = {}
        if given(ctx, "replicas"):
            flags["replicas"] = ("--replicas", replicas)
        if given(ctx, "kv_cache_gb"):
            flags["node.kv_cache_gb"] = ("--kv-cache-gb", kv_cache_gb)
        if given(ctx, "no_admission"):
            flags["admission.enabled"] = ("--no-admission", not no_admission)
        if gpu_hour_usd is not None:
            flags["gpu_hour_usd"] = ("--gpu-hour-usd", gpu_hour_usd)
        if frontier_price:
            vals = _floats(frontier_price, "--frontier-price")
            if len(vals) != 3:
                raise CliError("--frontier-price: expected IN,CACHED_IN,OUT")
            for name, x in zip(
                ("price_in_per_m", "price_cached_in_per_m", "price_out_per_m"), vals, strict=True
            ):
                flags[f"frontier.{name}"] = ("--frontier-price", x)
        dep = deployment_for(config, show_config, flags).deployment
        if not runs or bundle is None or json_out is None:
            raise CliError("bench needs --runs, --bundle and --json")
        files = [Path(f) for item in [*runs, *(more_runs or [])] for f in item.split(",") if f]
        for f in files:
            if not f.exists():
                raise CliError(f"run log not found: {f}")
        if not bundle.is_dir():
            raise CliError(f"bundle directory not found: {bundle}")
        try:
            prices = prices_for(dep)
            sim = SimSettings.from_deployment(dep, arrival_rate=arrival_rate, seed=seed)
        except ValidationError as e:
            err = e.errors()[0]
            raise CliError(f"bench: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        sw = _floats(sweep, "--sweep") if sweep else None
        if sw is not None and any(not 0 <= x <= 1 for x in sw):
            raise CliError("--sweep: thresholds must be in [0, 1]")
        con = Console(width=None if Console().is_terminal else 160)
        with contextlib.ExitStack() as stack:
            sim_map: Any = map
            if dask is not None:
                from runroute.dask_support import DaskMap, dask_client, parse_dask, progress_bar

                try:
                    addr = parse_dask(dask)
                except ValueError as e:
                    raise CliError(str(e)) from None
                client = stack.enter_context(
                    dask_client(addr or "local", workers, echo=lambda m: con.print(m, soft_wrap=True))
                )
                bar = stack.enter_context(progress_bar(con, "simulating"))
                sim_map = DaskMap(client, on_done=bar.done, on_submit=bar.submitted)
            try:
                card = bench_runs(
                    files,
                    bundle,
                    prices=prices,
                    sim=sim,
                    sweep_thresholds=sw,
                    progress=lambda m: con.print(f"  [dim]{m}[/dim]"),
                    map=sim_map,
                )
            except BundleError as e:
                raise CliError(f"bundle refused: {e}") from None
        import json

        doc = card.to_json_dict()
        atomic_write(json_out, (json.dumps(doc, indent=2) + "\n").encode())
        if report_dir is not None:
            write_report(doc, report_dir)
        if plot is not None:
            name, s = next(iter(doc["sets"].items()))
            plot_frontier(s, name, plot)
        print_scorecard(doc, con)
        con.print(
            f"wrote {json_out}"
            + (f", {plot}" if plot else "")
            + (f", {report_dir}/report.md" if report_dir else "")
        )
