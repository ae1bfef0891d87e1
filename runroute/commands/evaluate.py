"""`runroute evaluate --runs LOGS --policy NAME|CONFIG [--bundle B]`: off-policy evaluation.

Estimates each candidate policy's success rate, cost per run, escalation rate, net value per run
(``--value-of-success`` x success - cost) and AIQ from logged runs with IPS, self-normalised IPS and
doubly robust estimators, bootstrap intervals and the effective sample size
(:mod:`training.eval.ope_eval`). Refuses, with one line, logs without propensities and candidates
that need actions the logs never explored. ``--policy`` (repeat): a policy kind, a YAML/JSON file
with one config or a list of them, or an inline JSON object; an ``explore`` block is dropped (the
deterministic policy is evaluated). ``--json`` writes the report, ``--plot`` a PNG of the intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for, given, priced_backends
from runroute.errors import CliError


def _configs(specs: list[str]) -> list[dict[str, Any]]:
    import orjson
    import yaml

    from router.policy.config import POLICY_KINDS

    out: list[dict[str, Any]] = []
    for spec in specs:
        if spec in POLICY_KINDS:
            items: Any = [{"kind": spec}]
        elif spec.lstrip().startswith("{"):
            try:
                items = [orjson.loads(spec)]
            except orjson.JSONDecodeError:
                raise CliError(f"--policy: {spec!r} is not valid JSON") from None
        elif Path(spec).is_file():
            try:
                raw = yaml.safe_load(Path(spec).read_text())
            except yaml.YAMLError as e:
                raise CliError(f"{spec}: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
            raw = raw.get("policies", raw) if isinstance(raw, dict) and "kind" not in raw else raw
            items = raw if isinstance(raw, list) else [raw]
        else:
            raise CliError(
                f"--policy: {spec!r} is neither a policy kind ({', '.join(POLICY_KINDS)}) nor a config file"
            )
        for it in items:
            if not isinstance(it, dict) or "kind" not in it:
                raise CliError(f"--policy {spec}: each config must be a mapping with 'kind'")
            out.append({k: v for k, v in it.items() if k != "explore"})
    names = [str(c.get("name") or c["kind"]) for c in out]
    if len(set(names)) != len(names):
        raise CliError(f"--policy: candidate names must be unique (got {names}); set 'name' in the configs")
    return out


def _cell(e: Any, digits: int) -> str:
    if e.value is None:
        return "-"
    if e.lo is None:
        return f"{e.value:.{digits}f}"
    return f"{e.value:.{digits}f} [{e.lo:.{digits}f}, {e.hi:.{digits}f}]"


def print_report(rep: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if Console().is_terminal else 160)
    left = ", ".join(f"{v} {k}" for k, v in rep.left_out.items()) or "none"
    con.print(
        f"[bold]off-policy evaluation[/bold] on {rep.n_runs} logged runs ({rep.n_steps} steps; "
        f"{rep.explored_runs} exploring; left out: {left}); net = {rep.value_of_success:g} x success - cost"
    )
    t = Table(show_lines=False)
    for c in ("policy", "estimator", "success", "cost / run USD", "escalation", "net / run USD", "AIQ"):
        t.add_column(c)
    t.add_column("ESS", justify="right")
    t.add_column("unsupported", justify="right")
    for name, r in rep.candidates.items():
        for e in ("ips", "snips", "dr"):
            est = r.estimates[e]
            aiq = est.get("aiq")
            t.add_row(
                name if e == "ips" else "",
                e.upper(),
                _cell(est["success"], 3),
                _cell(est["cost"], 4),
                _cell(est["escalated"], 3),
                _cell(est["net"], 4),
                _cell(aiq, 3) if aiq is not None else "-",
                f"{r.diagnostics['ess']:.0f}" if e == "ips" else "",
                f"{r.diagnostics['unsupported_share']:.1%}" if e == "ips" else "",
            )
    con.print(t)
    con.print(
        f"{rep.n_runs * (len(rep.candidates) + len(rep.references)) / max(rep.wall_s, 1e-9):.0f} runs evaluated/s"
    )


def plot_report(rep: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rep.candidates)
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(names) + 2))
    for ax, metric, label in (
        (axes[0], "net", "net value per run (USD)"),
        (axes[1], "success", "success rate"),
    ):
        for j, e in enumerate(("ips", "snips", "dr")):
            ys = [i + (j - 1) * 0.22 for i in range(len(names))]
            ests = [rep.candidates[n].estimates[e][metric] for n in names]
            xs = [x.value if x.value is not None else float("nan") for x in ests]
            err = [
                [max(0.0, x.value - x.lo) if x.lo is not None and x.value is not None else 0.0 for x in ests],
                [max(0.0, x.hi - x.value) if x.hi is not None and x.value is not None else 0.0 for x in ests],
            ]
            ax.errorbar(xs, ys, xerr=err, fmt="o", capsize=3, label=e.upper())
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"off-policy estimates with 95% bootstrap intervals ({rep.n_runs} logged runs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def register(app: typer.Typer) -> None:
    @app.command("evaluate")
    def evaluate(
        ctx: typer.Context,
        runs: Annotated[
            list[Path] | None, typer.Option("--runs", help="run-log files/directories with propensities")
        ] = None,
        policy: Annotated[
            list[str] | None, typer.Option("--policy", help="kind, config file or inline JSON; repeat")
        ] = None,
        bundle: Annotated[
            Path | None, typer.Option("--bundle", help="model bundle of the candidates")
        ] = None,
        value_of_success: Annotated[
            float, typer.Option("--value-of-success", help="USD of a successful run (net value)")
        ] = 1.0,
        boot: Annotated[int, typer.Option("--boot", min=50, help="bootstrap replicates")] = 1000,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        no_dm: Annotated[bool, typer.Option("--no-dm", help="no outcome model (DR = IPS)")] = False,
        max_unsupported: Annotated[
            float,
            typer.Option(
                "--max-unsupported", help="refuse a candidate unsupported on more runs than this share"
            ),
        ] = 0.02,
        n_local: Annotated[
            int,
            typer.Option("--n-local", min=1, help="local replicas of the replay (with --config: the file's)"),
        ] = 2,
        json_out: Annotated[Path | None, typer.Option("--json", help="write the report here")] = None,
        plot: Annotated[Path | None, typer.Option("--plot", help="write a PNG of the intervals here")] = None,
        config: Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)] = None,
        show_config: Annotated[bool, typer.Option("--show-config", help=SHOW_HELP)] = False,
    ) -> None:
        """Off-policy estimates (IPS, SNIPS, DR) of candidate policies on logged runs."""
        import json

        from training.eval.config import prices_for

        flags = {"replicas": ("--n-local", n_local)} if given(ctx, "n_local") else {}
        res = deployment_for(config, show_config, flags)
        if not runs or not policy:
            raise CliError("evaluate needs --runs and --policy")
        n_local = res.deployment.replicas or n_local

        from features.runlog import read_runlog
        from models.predictor import ConstantPredictor
        from router.policy.config import PolicyConfigError, build_policy
        from router.replay import default_backends
        from training.eval.ope_eval import OPEError, evaluate_policies

        loaded: Any = None
        if bundle is not None:
            from models.bundle import BundleError, ModelBundle

            try:
                loaded = ModelBundle.load(bundle)
            except BundleError as e:
                raise CliError(str(e)) from None
        predictor = loaded if loaded is not None else ConstantPredictor()
        try:
            cands = {
                str(c.get("name") or c["kind"]): (build_policy(c, loaded), predictor)
                for c in _configs(policy)
            }
        except PolicyConfigError as e:
            raise CliError(str(e)) from None
        log = read_runlog(runs, strict=True)
        try:
            rep = evaluate_policies(
                log,
                cands,
                value_of_success=value_of_success,
                backends=priced_backends(res, default_backends(n_local=n_local)),
                prices=prices_for(res.deployment),
                n_boot=boot,
                seed=seed,
                dm=not no_dm,
                max_unsupported_share=max_unsupported,
                progress=lambda m: typer.echo(m, err=True),
            )
        except OPEError as e:
            raise CliError(str(e)) from None
        print_report(rep)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(rep.to_json(), indent=2) + "\n")
        if plot is not None:
            plot_report(rep, plot)
            typer.echo(f"wrote {plot}", err=True)
