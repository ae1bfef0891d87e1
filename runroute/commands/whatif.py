"""`runroute whatif`: capacity what-ifs by closed-loop replay of logged runs (router.sim.whatif)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import typer

from router.policy.defaults import GPU_HOUR_USD, KV_CACHE_GB, SLO_SHORT_STEP_S, SLO_TTFT_S
from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for, given
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
        ctx: typer.Context,
        runs: list[str] = typer.Option(
            None, "--runs", help="run-log file(s) (.parquet/.jsonl); repeat or comma-separate"
        ),
        list_profiles_: bool = typer.Option(
            False,
            "--profile",
            help="list the shipped node profiles with their sources and fit errors, then exit",
        ),
        more_runs: list[str] = typer.Argument(None, help="more run-log files (so `--runs A B` works)"),
        arrivals: str = typer.Option(
            "trace", "--arrivals", help="trace | azure-code | servegen:m-large | rate=R"
        ),
        speedup: float = typer.Option(
            1.0, "--speedup", help="replay time compression (all arrival processes)"
        ),
        replicas: str = typer.Option(
            "1,2,4", "--replicas", help="local replica counts, e.g. 1,2,4 (with --config: the file's count)"
        ),
        gpu: str = typer.Option(
            "a100", "--gpu", help="a100 | h100 (picks the default node profile; with --config: node.gpu)"
        ),
        node_profile: str | None = typer.Option(
            None,
            "--node-profile",
            help="shipped profile name or a JSON path (your own vLLM fit; with --config: node.profile)",
        ),
        kv_cache_gb: str = typer.Option(
            "auto",
            "--kv-cache-gb",
            help="KV cache per replica (GB), e.g. 16,32; auto = what vLLM leaves on the profile's GPU "
            f"(memory x 0.9 - weights - reserve; {KV_CACHE_GB:g} when the profile has no memory figures); "
            "with --config: node.kv_cache_gb",
        ),
        policy: str = typer.Option(
            "always-local,session-sticky,always-frontier",
            "--policy",
            help="policy kinds, comma-separated (router.policy.config.POLICY_KINDS)",
        ),
        bundle: Path | None = typer.Option(
            None, "--bundle", help="model bundle dir (predictions + thresholds)"
        ),
        frontier_price: str | None = typer.Option(
            None,
            "--frontier-price",
            help="USD per 1M tokens: IN,CACHED_IN,OUT (default: the config's default frontier's)",
        ),
        frontier_ttft_s: float = typer.Option(0.4, "--frontier-ttft-s", help="frontier median TTFT (s)"),
        frontier_tps: float = typer.Option(60.0, "--frontier-tps", help="frontier median output tokens/s"),
        frontier_rpm: float | None = typer.Option(
            None, "--frontier-rpm", help="frontier rate limit (requests/min)"
        ),
        scale_to_zero: bool = typer.Option(
            False, "--scale-to-zero", help="replicas sleep when idle (compared with always-on)"
        ),
        gpu_hour_usd: float = typer.Option(GPU_HOUR_USD, "--gpu-hour-usd", help="local price per GPU-hour"),
        wake_s: str = typer.Option("267,282", "--wake-s", help="scale-to-zero wake time range LO,HI (s)"),
        idle_reap_s: float = typer.Option(1800.0, "--idle-reap-s", help="scale-to-zero idle reaper (s)"),
        slo_short_s: float = typer.Option(SLO_SHORT_STEP_S, "--slo-short-s", help="p95 short-step SLO (s)"),
        slo_ttft_s: float = typer.Option(
            SLO_TTFT_S, "--slo-ttft-s", help="per-step SLO of long steps: TTFT (s)"
        ),
        admission: bool = typer.Option(
            False,
            "--admission/--no-admission",
            help="admission control at run starts (router.policy.admission; SLO = "
            "--slo-short-s): spill or reject new runs under load (with --config: admission.enabled)",
        ),
        limit_runs: int | None = typer.Option(None, "--limit-runs", help="replay only the first N runs"),
        seed: int = typer.Option(0, "--seed", help="seed of arrivals and latency draws"),
        no_kv_double: bool = typer.Option(
            False, "--no-kv-double", help="do not add the doubled-KV point for the hit-rate answer"
        ),
        json_out: Path | None = typer.Option(None, "--json", help="write the result JSON here"),
        plot_out: Path | None = typer.Option(None, "--plot", help="write the PNG plots here"),
        slo: str | None = typer.Option(
            None,
            "--slo",
            help="SLO targets by step class, e.g. short_p95=2s,ttft_p95@<=8k=2s,ttft_p95@>32k=30s,"
            "itl_p95=80ms,run_p95=10min (short_p95/ttft_p95 also set --slo-short-s/--slo-ttft-s)",
        ),
        seeds: int | None = typer.Option(
            None,
            "--seeds",
            min=1,
            help="simulations per point, one per arrival seed (default 1 with trace arrivals, whose "
            "start times are fixed, else 3); the interval pools them with the run bootstrap",
        ),
        boot: int = typer.Option(
            200, "--boot", min=0, help="run-bootstrap replicates per simulation (0: no interval)"
        ),
        level: float = typer.Option(
            0.9, "--level", help="the intervals' coverage (0.9: 5th-95th percentile)"
        ),
        find_: str | None = typer.Option(
            None, "--find", help="search instead of a grid: replicas | kv | replicas,kv (needs --slo)"
        ),
        max_replicas: int = typer.Option(
            64, "--max-replicas", help="--find replicas: the largest count tried"
        ),
        kv_dtype: str = typer.Option("fp16", "--kv-dtype", help="KV format: fp16 | bf16 | fp8 | int4 | int2"),
        kv_read_scales: bool = typer.Option(
            False, "--kv-read-scales", help="quantised KV also cuts the decode KV-read time (memory-bound)"
        ),
        cpu_kv_gb: str = typer.Option(
            "0", "--cpu-kv-gb", help="CPU KV tier per replica: GB, or Nx of the GPU KV"
        ),
        cpu_kv_gbps: float = typer.Option(25.0, "--cpu-kv-gbps", help="CPU tier -> GPU bandwidth (GB/s)"),
        cpu_kv_global: bool = typer.Option(
            False, "--cpu-kv-global", help="one CPU KV pool shared by all replicas (their summed size)"
        ),
        ssd_kv_gb: str = typer.Option(
            "0", "--ssd-kv-gb", help="SSD KV tier per replica: GB, or Nx of the GPU KV"
        ),
        ssd_kv_gbps: float = typer.Option(5.0, "--ssd-kv-gbps", help="SSD tier -> GPU bandwidth (GB/s)"),
        spec: str = typer.Option(
            "none",
            "--spec",
            help="speculative decoding: none | prompt-lookup[:min=,max=,k=] | eagle:alpha=A[,k=K] | "
            "draft-model:alpha=A,ms=M[,k=K] (M ms per proposed token)",
        ),
        disagg_prefill_s: str = typer.Option(
            "0",
            "--disagg-prefill",
            help="of each replica count, this many prefill-only replicas (0 = co-located); with --find "
            "a list (e.g. 0,2,4) searches each as a variant of one answer and says which are "
            "indistinguishable",
        ),
        kv_link_gbps: float = typer.Option(50.0, "--kv-link-gbps", help="disaggregation: KV link GB/s"),
        tp: int = typer.Option(1, "--tp", min=1, help="tensor-parallel GPUs per replica (prefill pool too)"),
        tp_decode: int = typer.Option(
            0, "--tp-decode", min=0, help="disaggregation: decode pool TP (0: --tp)"
        ),
        tp_efficiency: float = typer.Option(
            0.8, "--tp-efficiency", help="share of the TP speed-up kept after all-reduces (assumed)"
        ),
        dask: str | None = typer.Option(
            None,
            "--dask",
            help="run each point as a Dask task: 'local' (a LocalCluster) or a scheduler address",
        ),
        workers: int | None = typer.Option(
            None,
            "--workers",
            min=1,
            help="--dask local: worker processes (default 2); an address: wait for N",
        ),
        config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
        show_config: bool = typer.Option(False, "--show-config", help=SHOW_HELP),
    ) -> None:
        """Replay logged runs through the router's policies against simulated local replicas and a
        frontier API; print the scorecard per (policy x replicas x KV size) and the built-in answers,
        or with --find bisect for the fewest replicas (or KV) that holds --slo, per policy."""
        from dataclasses import replace

        from features.runlog import read_runlog
        from router.policy.config import PolicyConfigError, build_policy, parse_policy_config
        from router.sim.arrivals import ArrivalError, run_starts
        from router.sim.frontier import FrontierConfig
        from router.sim.precheck import capacity_check, warning_lines
        from router.sim.profiles import ProfileError, load_profile
        from router.sim.report import plot, render_table, write_json
        from router.sim.search import find, parse_slo
        from router.sim.search_report import plot_search, precheck_lines, render_search
        from router.sim.simconfig import kv_quant_note
        from router.sim.slo import floor_lines, floors
        from router.sim.specdec import SpecError, parse_spec
        from router.sim.whatif import SimConfig, SimError, Workload, run_grid

        # the deployment (--config, RUNROUTE_* env, flags): a what-if of a config answers for it
        res = deployment_for(config, show_config, _deployment_flags(ctx, locals()))
        dep = res.deployment
        gpu_hour_usd, slo_short_s, slo_ttft_s = dep.gpu_hour_usd, dep.slo_short_step_s, dep.slo.ttft_s
        gpu, node_profile = dep.node.gpu, dep.node.profile
        if config is not None or res.stated("admission.enabled"):  # the sidecar admits by default
            admission = dep.admission.enabled
        if dep.node.kv_cache_gb is not None and not given(ctx, "kv_cache_gb"):
            kv_cache_gb = f"{dep.node.kv_cache_gb:g}"
        if dep.replicas is not None and not given(ctx, "replicas"):
            replicas = str(dep.replicas)
        if not frontier_price:
            f = dep.frontier
            frontier_price = f"{f.price_in_per_m!r},{f.price_cached_in_per_m!r},{f.price_out_per_m!r}"
        if list_profiles_:
            _print_profiles()
            return
        if not runs:
            raise CliError("--runs: name at least one run-log file (or --profile to list the node profiles)")
        if not 0 < level < 1:
            raise CliError("--level: expected a coverage in (0, 1), e.g. 0.9")
        files = [f for item in [*runs, *(more_runs or [])] for f in item.split(",") if f]
        reps = [int(x) for x in _floats(replicas, "--replicas")]
        if any(r < 0 for r in reps):
            raise CliError("--replicas: counts must be >= 0")
        try:
            prof = load_profile(node_profile, gpu)
        except ProfileError as e:
            raise CliError(str(e)) from None
        flagged: list[str] = []  # defaults that change the answer, said out loud
        if kv_cache_gb.strip().lower() == "auto":
            derived = prof.default_kv_cache_gb()
            kvs = [derived if derived is not None else KV_CACHE_GB]
            flagged.append(
                f"KV cache {kvs[0]:g} GB per replica: "
                + (
                    f"derived from {prof.name} ({prof.gpu_memory_gb:g} GB x {prof.gpu_memory_utilization:g} - "
                    f"{prof.weights_gb:g} GB weights - {prof.reserve_gb:g} GB reserve)"
                    if derived is not None
                    else "the fallback (the profile has no memory figures); set --kv-cache-gb"
                )
            )
        else:
            kvs = _floats(kv_cache_gb, "--kv-cache-gb")
        if any(k <= 0 for k in kvs):
            raise CliError("--kv-cache-gb: sizes must be > 0")
        if not res.stated("gpu_hour_usd"):
            flagged.append(
                f"GPU price ${GPU_HOUR_USD:.2f} per GPU-hour is the deployment default, not a quote: set "
                "--gpu-hour-usd for cost answers"
            )
        if not no_kv_double and find_ is None:
            kvs = sorted(set(kvs) | {2 * max(kvs)})
        lo, hi = _floats(wake_s, "--wake-s", 2)
        try:
            slo_t = parse_slo(slo) if slo else None
            spec_m = parse_spec(spec)
        except (SimError, SpecError) as e:
            raise CliError(str(e)) from None
        if find_ is not None and slo_t is None:
            raise CliError("--find needs --slo (e.g. --slo short_p95=2s)")
        try:
            disagg_list = sorted({int(x) for x in disagg_prefill_s.split(",") if x.strip()}) or [0]
        except ValueError:
            raise CliError(f"--disagg-prefill: expected integers, got {disagg_prefill_s!r}") from None
        if min(disagg_list) < 0:
            raise CliError("--disagg-prefill: prefill replica counts must be >= 0")
        if len(disagg_list) > 1 and find_ is None:
            raise CliError("--disagg-prefill with several values compares variants: it needs --find")
        disagg_prefill = disagg_list[0] if len(disagg_list) == 1 else 0
        if find_ is not None and max(disagg_list) and max_replicas <= max(disagg_list):
            raise CliError(
                "--find with --disagg-prefill P searches P+1..--max-replicas: raise --max-replicas"
            )
        if slo_t is not None:
            slo_short_s = slo_t.short_p95_s if slo_t.short_p95_s is not None else slo_short_s
            slo_ttft_s = slo_t.ttft_p95_s if slo_t.ttft_p95_s is not None else slo_ttft_s
        cpu_gb, cpu_x = _gb_or_x(cpu_kv_gb, "--cpu-kv-gb")
        ssd_gb, ssd_x = _gb_or_x(ssd_kv_gb, "--ssd-kv-gb")
        try:
            fkw: dict[str, Any] = {}
            if frontier_price:
                pin, pc, pout = _floats(frontier_price, "--frontier-price", 3)
                fkw = {"price_in_per_m": pin, "price_cached_in_per_m": pc, "price_out_per_m": pout}
            frontier = FrontierConfig(
                ttft_p50_s=frontier_ttft_s, tokens_per_s_p50=frontier_tps, rpm_limit=frontier_rpm, **fkw
            )
            base = SimConfig(
                profile=prof,
                replicas=max(reps[0], max(disagg_list) + 1),
                frontier=frontier,
                gpu_hour_usd=gpu_hour_usd,
                scale_to_zero=scale_to_zero,
                wake_s=(lo, hi),
                idle_reap_s=idle_reap_s,
                slo_short_s=slo_short_s,
                slo_ttft_s=slo_ttft_s,
                seed=seed,
                kv_dtype=kv_dtype,
                kv_read_scales=kv_read_scales,
                cpu_kv_gb=cpu_gb,
                cpu_kv_x=cpu_x,
                cpu_kv_gbps=cpu_kv_gbps,
                cpu_kv_global=cpu_kv_global,
                ssd_kv_gb=ssd_gb,
                ssd_kv_x=ssd_x,
                ssd_kv_gbps=ssd_kv_gbps,
                spec=spec_m,
                disagg_prefill=disagg_prefill,
                kv_link_gbps=kv_link_gbps,
                tp=tp,
                tp_decode=tp_decode,
                tp_efficiency=tp_efficiency,
            )
            if max(disagg_list) and min(reps) <= max(disagg_list) and find_ != "replicas":
                raise SimError(
                    "--disagg-prefill P needs every --replicas count > P (one decode replica at least)"
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
        mode = f"--find {find_}" if find_ else f"{len(reps)} replica counts x {len(kvs)} KV sizes"
        typer.echo(
            f"replaying {len(work.runs)} runs / {work.n_steps} steps; arrivals {arrivals} x{speedup:g}; "
            f"node profile {prof.name}; {len(factories)} policies x {mode}",
            err=True,
        )
        n_seeds = seeds if seeds is not None else (1 if arrivals == "trace" else 3)
        try:
            seed_starts = [
                run_starts(
                    arrivals,
                    len(work.runs),
                    logged_starts=work.logged_starts(),
                    seed=seed + k,
                    speedup=speedup,
                    mean_steps_per_run=work.mean_steps_per_run(),
                )  # fmt: skip
                for k in range(1, n_seeds)
            ]
        except (SimError, ArrivalError) as e:
            raise CliError(str(e)) from None
        unc: dict[str, Any] = {"seed_starts": seed_starts, "n_boot": boot, "level": level}
        if n_seeds > 1 and arrivals == "trace":
            flagged.append(
                "trace arrivals have fixed start times: extra --seeds vary only the frontier's and wake draws"
            )
        check = capacity_check(work, starts, replace(base, kv_cache_gb=max(kvs)), reps)
        warnings = warning_lines(check, slo_t.short_p95_s if slo_t else None)
        slo_floors = floors(work, prof, slo_t) if slo_t is not None else []
        warnings += floor_lines(slo_floors)
        for line in [*precheck_lines(check), *warnings, *(f"note: {f}" for f in flagged)]:
            typer.echo(line, err=True)
        hook_factory = None
        if admission:
            from router.policy.admission import AdmissionController
            from router.sim.calibrate import admission_config_for_profile

            # knobs derived from the node profile at the smallest KV size asked for (conservative),
            # except those the deployment states (file / env): the sidecar admits with those
            acfg = admission_config_for_profile(prof, min(kvs), slo_short_s)
            acfg = acfg.model_copy(
                update=res.stated_fields("admission", exclude={"slo_short_step_s", "enabled"})
            )

            def hook_factory() -> Any:  # a fresh controller (hysteresis state) per simulation
                return AdmissionController(acfg)

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        total = None if find_ else len(factories) * len(reps) * len(kvs) * (2 if scale_to_zero else 1)
        cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        pool = contextlib.ExitStack()
        point_map: Any = map
        try:
            with pool, Progress(*cols, transient=True) as prog:
                task = prog.add_task("simulating", total=total)
                if dask is not None:  # one task per point; the bar advances as the scheduler finishes them
                    from runroute.dask_support import DaskMap, dask_client, parse_dask

                    try:
                        addr = parse_dask(dask)
                    except ValueError as e:
                        raise CliError(str(e)) from None
                    client = pool.enter_context(
                        dask_client(
                            addr or "local", workers, echo=lambda m: prog.console.print(m, soft_wrap=True)
                        )
                    )
                    point_map = DaskMap(client, on_done=lambda _i: prog.update(task, advance=1))

                def tick(r: Any) -> None:
                    c = r.scorecard
                    prog.update(
                        task,
                        advance=0 if dask is not None else 1,
                        description=f"{r.label} x{c['replicas']} @{c['kv_cache_gb']:g}GB: {r.wall_s:.1f}s",
                    )

                if find_:
                    result = find(
                        work,
                        factories,
                        base,
                        starts,
                        slo_t,  # type: ignore[arg-type]
                        dimension=find_,
                        kv_cache_gb=kvs,
                        replicas=reps,
                        max_replicas=max_replicas,
                        start=check["suggested_start_replicas"] if find_.startswith("replicas") else max(kvs),
                        predictor=model,
                        admission_factory=hook_factory,
                        progress=tick,
                        map=point_map,
                        disagg_variants=disagg_list,
                        **unc,
                    )
                else:
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
                        progress=lambda m: prog.console.print(m, highlight=False),
                        map=point_map,
                        slo=slo_t,
                        **unc,
                    )
        except SimError as e:
            raise CliError(str(e), 1) from None
        result["capacity_check"] = check
        result["capacity_warnings"] = warnings
        result["slo_floors"] = slo_floors
        result["defaults_flagged"] = flagged
        result["inputs"] = _inputs(locals())
        note = kv_quant_note(kv_dtype)
        if note:
            result["kv_quant_note"] = note
            typer.echo(f"note: {note}", err=True)
        title = f"runroute what-if: {len(work.runs)} runs, {arrivals} arrivals x{speedup:g}, node {prof.name}"
        if find_:
            render_search(result)
        else:
            render_table(result)
        if json_out:
            write_json(result, json_out)
            typer.echo(f"wrote {json_out}", err=True)
        if plot_out:
            (plot_search if find_ else plot)(result, plot_out, title=title)
            typer.echo(f"wrote {plot_out}", err=True)


def _deployment_flags(ctx: typer.Context, v: dict[str, Any]) -> dict[str, tuple[str, object]]:
    """The deployment values set on the command line (they win over --config and RUNROUTE_* env)."""
    out: dict[str, tuple[str, object]] = {}
    simple = {
        "gpu_hour_usd": ("gpu_hour_usd", "--gpu-hour-usd"),
        "slo_short_s": ("admission.slo_short_step_s", "--slo-short-s"),
        "slo_ttft_s": ("slo.ttft_s", "--slo-ttft-s"),
        "gpu": ("node.gpu", "--gpu"),
        "node_profile": ("node.profile", "--node-profile"),
        "admission": ("admission.enabled", "--admission"),
    }
    for param, (key, flag) in simple.items():
        if given(ctx, param):
            out[key] = ("--no-admission" if param == "admission" and not v[param] else flag, v[param])
    if given(ctx, "frontier_price") and v["frontier_price"]:
        vals = _floats(v["frontier_price"], "--frontier-price", 3)
        for name, x in zip(("price_in_per_m", "price_cached_in_per_m", "price_out_per_m"), vals, strict=True):
            out[f"frontier.{name}"] = ("--frontier-price", x)
    if given(ctx, "kv_cache_gb") and v["kv_cache_gb"].strip().lower() != "auto":
        kvs = _floats(v["kv_cache_gb"], "--kv-cache-gb")
        if len(kvs) == 1:
            out["node.kv_cache_gb"] = ("--kv-cache-gb", kvs[0])
    if given(ctx, "slo") and v["slo"]:  # short_p95 / ttft_p95 also set the two per-step SLOs
        from router.sim.search import parse_slo
        from router.sim.workload import SimError

        try:
            t = parse_slo(v["slo"])
        except SimError as e:
            raise CliError(str(e)) from None
        if t.short_p95_s is not None:
            out["admission.slo_short_step_s"] = ("--slo short_p95", t.short_p95_s)
        if t.ttft_p95_s is not None:
            out["slo.ttft_s"] = ("--slo ttft_p95", t.ttft_p95_s)
    if given(ctx, "replicas"):
        reps = _floats(v["replicas"], "--replicas")
        if len(reps) == 1:
            out["replicas"] = ("--replicas", int(reps[0]))
    return out


def _print_profiles() -> None:
    """`runroute whatif --profile`: every shipped node profile, its derived KV size, sources, fit error."""
    from rich.console import Console
    from rich.table import Table

    from router.sim.profiles import profile_table

    con = Console(width=160) if not Console().is_terminal else Console()
    t = Table(title="shipped node profiles (router/sim/profiles; fitted by router.sim.fit_profiles)")
    for c in ("name", "default", "a ms", "b us/tok", "c ns", "d ns/ctx", "e ms", "KV GB"):
        t.add_column(c, justify="left" if c in ("name", "default") else "right")
    rows = profile_table()
    for r in rows:
        k = r["coefficients"]
        t.add_row(
            r["name"], r["default_for"] or "", f"{k['a'] * 1e3:.2f}", f"{k['b'] * 1e6:.1f}", f"{k['c'] * 1e9:.3f}",
            f"{k['d'] * 1e9:.1f}", f"{k['e'] * 1e3:.3f}",
            "-" if r["default_kv_cache_gb"] is None else f"{r['default_kv_cache_gb']:g}",
        )  # fmt: skip
    con.print(t)
    for r in rows:
        con.print(f"[bold]{r['name']}[/bold]", highlight=False)
        for src in r["sources"]:
            con.print(f"  source: {src}", highlight=False, soft_wrap=True)
        con.print(f"  terms: {r['terms']}", highlight=False, soft_wrap=True)
        con.print(f"  fit error: {r['fit_error']}", highlight=False, soft_wrap=True)
        for ref in r["references"]:
            con.print(
                f"  check: {ref['figure']}: model {ref['model_s']:.4g} s vs {ref['reference_s']:.4g} s "
                f"({ref['error_pct']:+.1f}%{', in-sample' if ref['in_sample'] else ''})",
                highlight=False,
                soft_wrap=True,
            )


def _gb_or_x(v: str, what: str) -> tuple[float, float]:
    """``"64"`` -> (64 GB, 0); ``"4x"`` -> (0, 4 times the GPU KV)."""
    try:
        if v.strip().lower().endswith("x"):
            x = float(v.strip()[:-1])
            if x < 0:
                raise ValueError
            return 0.0, x
        gb = float(v)
        if gb < 0:
            raise ValueError
        return gb, 0.0
    except ValueError:
        raise CliError(
            f"{what}: expected GB (e.g. 64) or a multiple of the GPU KV (e.g. 4x), got {v!r}"
        ) from None


def _inputs(v: dict[str, Any]) -> dict[str, Any]:
    """The knobs of a run, for the result JSON."""
    prof, frontier, base = v["prof"], v["frontier"], v["base"]
    return {
        "runs": v["files"],
        "n_runs": len(v["work"].runs),
        "n_steps": v["work"].n_steps,
        "arrivals": v["arrivals"],
        "speedup": v["speedup"],
        "gpu": v["gpu"],
        "node_profile": prof.name,
        "node_profile_coefficients": {k: getattr(prof, k) for k in "abcde"},
        "node_profile_fit_error": prof.fit_error,
        "gpu_hour_usd": v["gpu_hour_usd"],
        "replicas": v["reps"],
        "slo_short_s": base.slo_short_s,
        "slo_ttft_s": base.slo_ttft_s,
        "config": str(v["config"]) if v["config"] else None,
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
        "scale_to_zero": v["scale_to_zero"],
        "wake_s": [v["lo"], v["hi"]],
        "idle_reap_s": v["idle_reap_s"],
        "seed": v["seed"],
        "bundle": str(v["bundle"]) if v["bundle"] else None,
        "admission": v["admission"],
        "find": v["find_"],
        "seeds": v["n_seeds"],
        "boot": v["boot"],
        "level": v["level"],
        "kv_cache_gb": v["kvs"],
        "kv_dtype": base.kv_dtype,
        "kv_read_scales": base.kv_read_scales,
        "cpu_kv": {"gb": base.cpu_kv_gb, "x_gpu_kv": base.cpu_kv_x, "gbps": base.cpu_kv_gbps},
        "cpu_kv_global": base.cpu_kv_global,
        "ssd_kv": {"gb": base.ssd_kv_gb, "x_gpu_kv": base.ssd_kv_x, "gbps": base.ssd_kv_gbps},
        "spec_decode": base.spec.describe() if base.spec is not None else None,
        "disagg_prefill": v["disagg_list"] if len(v["disagg_list"]) > 1 else base.disagg_prefill,
        "kv_link_gbps": base.kv_link_gbps,
    }
