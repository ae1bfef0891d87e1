"""`runroute whatif`: capacity what-ifs by closed-loop replay of logged runs (router.sim.whatif)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from runroute.errors import CliError


def _floats(s: str, what: str, n: int | None = None) -> list[float]:
    try:
        vals = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{what}: expected comma-separated numbers, got {s!r}") from None
    if not vals or (n is not None and len(vals) != n):
        raise CliError(f"{what}: expected {n or 'one or more'} comma-separated numbers, got {s!r}")
    return vals


def register(app: typer.Typer) -> None:
    @app.command("whatif")
    def whatif(
        runs: list[str] = typer.Option(
            ..., "--runs", help="run-log file(s) (.parquet/.jsonl); repeat or comma-separate"
        ),
        more_runs: list[str] = typer.Argument(None, help="more run-log files (so `--runs A B` works)"),
        arrivals: str = typer.Option(
            "trace", "--arrivals", help="trace | azure-code | servegen:m-large | rate=R"
        ),
        speedup: float = typer.Option(
            1.0, "--speedup", help="replay time compression (all arrival processes)"
        ),
        replicas: str = typer.Option("1,2,4", "--replicas", help="local replica counts, e.g. 1,2,4"),
        gpu: str = typer.Option("a100", "--gpu", help="a100 | h100 (picks the default node profile)"),
        node_profile: str | None = typer.Option(
            None, "--node-profile", help="shipped profile name or a JSON path (your own vLLM fit)"
        ),
        kv_cache_gb: str = typer.Option("16", "--kv-cache-gb", help="KV cache per replica (GB), e.g. 16,32"),
        policy: str = typer.Option(
            "always-local,session-sticky,always-frontier",
            "--policy",
            help="policy kinds, comma-separated (router.policy.config.POLICY_KINDS)",
        ),
        bundle: Path | None = typer.Option(
            None, "--bundle", help="model bundle dir (predictions + thresholds)"
        ),
        frontier_price: str | None = typer.Option(
            None, "--frontier-price", help="USD per 1M tokens: IN,CACHED_IN,OUT"
        ),
        frontier_ttft_s: float = typer.Option(0.4, "--frontier-ttft-s", help="frontier median TTFT (s)"),
        frontier_tps: float = typer.Option(60.0, "--frontier-tps", help="frontier median output tokens/s"),
        frontier_rpm: float | None = typer.Option(
            None, "--frontier-rpm", help="frontier rate limit (requests/min)"
        ),
        scale_to_zero: bool = typer.Option(
            False, "--scale-to-zero", help="replicas sleep when idle (compared with always-on)"
        ),
        gpu_hour_usd: float = typer.Option(0.20, "--gpu-hour-usd", help="local price per GPU-hour"),
        wake_s: str = typer.Option("267,282", "--wake-s", help="scale-to-zero wake time range LO,HI (s)"),
        idle_reap_s: float = typer.Option(1800.0, "--idle-reap-s", help="scale-to-zero idle reaper (s)"),
        slo_short_s: float = typer.Option(5.0, "--slo-short-s", help="p95 short-step SLO (s)"),
        slo_ttft_s: float = typer.Option(5.0, "--slo-ttft-s", help="per-step SLO of long steps: TTFT (s)"),
        admission: bool = typer.Option(
            False,
            "--admission",
            help="admission control at run starts (router.policy.admission; SLO = "
            "--slo-short-s): spill or reject new runs under load",
        ),
        limit_runs: int | None = typer.Option(None, "--limit-runs", help="replay only the first N runs"),
        seed: int = typer.Option(0, "--seed", help="seed of arrivals and latency draws"),
        no_kv_double: bool = typer.Option(
            False, "--no-kv-double", help="do not add the doubled-KV point for the hit-rate answer"
        ),
        json_out: Path | None = typer.Option(None, "--json", help="write the result JSON here"),
        plot_out: Path | None = typer.Option(None, "--plot", help="write the PNG plots here"),
    ) -> None:
        """Replay logged runs through the router's policies against simulated local replicas and a
        frontier API; print the scorecard per (policy x replicas x KV size) and the built-in answers."""
        from features.runlog import read_runlog
        from router.policy.config import PolicyConfigError, build_policy, parse_policy_config
        from router.sim.arrivals import ArrivalError, run_starts
        from router.sim.frontier import FrontierConfig
        from router.sim.profiles import ProfileError, load_profile
        from router.sim.report import plot, render_table, write_json
        from router.sim.whatif import SimConfig, SimError, Workload, run_grid

        files = [f for item in [*runs, *(more_runs or [])] for f in item.split(",") if f]
        reps = [int(x) for x in _floats(replicas, "--replicas")]
        if any(r < 0 for r in reps):
            raise CliError("--replicas: counts must be >= 0")
        kvs = _floats(kv_cache_gb, "--kv-cache-gb")
        if any(k <= 0 for k in kvs):
            raise CliError("--kv-cache-gb: sizes must be > 0")
        if not no_kv_double:
            kvs = sorted(set(kvs) | {2 * max(kvs)})
        lo, hi = _floats(wake_s, "--wake-s", 2)
        try:
            prof = load_profile(node_profile, gpu)
            fkw: dict[str, Any] = {}
            if frontier_price:
                pin, pc, pout = _floats(frontier_price, "--frontier-price", 3)
                fkw = {"price_in_per_m": pin, "price_cached_in_per_m": pc, "price_out_per_m": pout}
            frontier = FrontierConfig(
                ttft_p50_s=frontier_ttft_s, tokens_per_s_p50=frontier_tps, rpm_limit=frontier_rpm, **fkw
            )
            base = SimConfig(
                profile=prof,
                frontier=frontier,
                gpu_hour_usd=gpu_hour_usd,
                scale_to_zero=scale_to_zero,
                wake_s=(lo, hi),
                idle_reap_s=idle_reap_s,
                slo_short_s=slo_short_s,
                slo_ttft_s=slo_ttft_s,
                seed=seed,
            )
        except (ProfileError, SimError, ValueError) as e:
            raise CliError(str(e)) from None
        model = None
        if bundle is not None:
            from models.bundle import BundleError, ModelBundle

            try:
                model = ModelBundle.load(bundle)
            except (BundleError, FileNotFoundError) as e:
                raise CliError(f"--bundle: {e}") from None
        factories = {}
        for kind in [p.strip() for p in policy.split(",") if p.strip()]:
            try:
                cfg = parse_policy_config(kind)
                build_policy(cfg, model)  # validate now (e.g. learned without a bundle)
            except (PolicyConfigError, ValueError) as e:
                raise CliError(f"--policy {kind}: {e}") from None
            factories[kind] = (lambda c: lambda: build_policy(c, model))(cfg)
        log = read_runlog(files)
        try:
            work = Workload.from_runlog(log, block_tokens=base.block_tokens, limit_runs=limit_runs)
            starts = run_starts(
                arrivals,
                len(work.runs),
                logged_starts=work.logged_starts(),
                seed=seed,
                speedup=speedup,
                mean_steps_per_run=work.mean_steps_per_run(),
            )
        except (SimError, ArrivalError) as e:
            raise CliError(str(e)) from None
        typer.echo(
            f"replaying {len(work.runs)} runs / {work.n_steps} steps; arrivals {arrivals} x{speedup:g}; "
            f"node profile {prof.name}; {len(factories)} policies x {len(reps)} replica counts x "
            f"{len(kvs)} KV sizes",
            err=True,
        )
        hook_factory = None
        if admission:
            from router.policy.admission import AdmissionController
            from router.sim.calibrate import admission_config_for_profile
            from router.sim.whatif import admission_from_controller

            # knobs derived from the node profile at the smallest KV size asked for (conservative)
            acfg = admission_config_for_profile(prof, min(kvs), slo_short_s)

            def hook_factory() -> Any:  # a fresh controller (hysteresis state) per simulation
                return admission_from_controller(AdmissionController(acfg))

        try:
            result = run_grid(
                work,
                factories,
                reps,
                kvs,
                base,
                starts,
                predictor=model,
                admission_factory=hook_factory,
                compare_always_on=scale_to_zero,
                progress=lambda m: typer.echo(m, err=True),
            )
        except SimError as e:
            raise CliError(str(e), 1) from None
        result["inputs"] = {
            "runs": files,
            "n_runs": len(work.runs),
            "n_steps": work.n_steps,
            "arrivals": arrivals,
            "speedup": speedup,
            "gpu": gpu,
            "node_profile": prof.name,
            "node_profile_coefficients": {k: getattr(prof, k) for k in "abcde"},
            "node_profile_fit_error": prof.fit_error,
            "gpu_hour_usd": gpu_hour_usd,
            "frontier": {
                k: getattr(frontier, k)
                for k in (
                    "price_in_per_m",
                    "price_cached_in_per_m",
                    "price_out_per_m",
                    "ttft_p50_s",
                    "tokens_per_s_p50",
                    "rpm_limit",
                )
            },
            "scale_to_zero": scale_to_zero,
            "wake_s": [lo, hi],
            "idle_reap_s": idle_reap_s,
            "seed": seed,
            "bundle": str(bundle) if bundle else None,
            "admission": admission,
        }
        render_table(result)
        if json_out:
            write_json(result, json_out)
            typer.echo(f"wrote {json_out}", err=True)
        if plot_out:
            plot(
                result,
                plot_out,
                title=f"runroute what-if: {len(work.runs)} runs, {arrivals} arrivals x{speedup:g}, node {prof.name}",
            )
            typer.echo(f"wrote {plot_out}", err=True)
