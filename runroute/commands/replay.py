"""`runroute replay`: decision replay of logged runs through routing policies (no timing).

``runroute replay --runs FILE [--runs FILE ...] --policy NAME[,NAME...] --bundle DIR --json OUT``
walks every logged run step by step, asks each policy, and prints one table row per policy
(escalation rate, recall/precision of needs-frontier runs, escalation step, switches per run,
warm vs re-prefilled tokens, frontier cost); ``--json`` writes the full report (router.replay).

``--policy`` takes policy kinds (``all`` = every kind) or names defined in ``--policy-config``, a
YAML/JSON file holding a list of policy configs (``{kind: learned, name: learned-v2, ...}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from runroute.deployconfig import CONFIG_HELP, SHOW_HELP, deployment_for, given, priced_backends


def _policy_configs(spec: str, config_file: Path | None) -> list[Any]:
    from router.policy.config import POLICY_KINDS
    from runroute.errors import CliError

    defined: dict[str, dict[str, Any]] = {}
    if config_file is not None:
        import yaml

        if not config_file.is_file():
            raise CliError(f"{config_file}: no such policy config file")
        try:
            raw = yaml.safe_load(config_file.read_text())
        except yaml.YAMLError as e:
            raise CliError(f"{config_file}: not valid YAML/JSON ({str(e).splitlines()[0]})") from None
        items = raw.get("policies", raw) if isinstance(raw, dict) else raw
        if not isinstance(items, list) or not all(isinstance(x, dict) and "kind" in x for x in items):
            raise CliError(f"{config_file}: expected a list of policy configs, each with 'kind'")
        for item in items:
            defined[str(item.get("name") or item["kind"])] = item
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise CliError("--policy: give at least one policy name")
    out: list[Any] = []
    for n in names:
        if n == "all":
            out.extend(defined.get(k, {"kind": k}) for k in POLICY_KINDS)
        elif n in defined:
            out.append(defined[n])
        elif n in POLICY_KINDS:
            out.append({"kind": n})
        else:
            known = ", ".join([*POLICY_KINDS, *[d for d in defined if d not in POLICY_KINDS]])
            raise CliError(f"--policy: unknown policy {n!r}; known: all, {known}")
    return out


def _fmt(v: Any, pct: bool = False, digits: int = 2) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"decision replay: {report['runs']} runs, {report['steps']} steps, "
        f"{report['needs_frontier_runs']}/{report['labelled_runs']} labelled runs need the frontier"
    )
    table = Table(title=title)
    for col in (
        "policy",
        "esc. rate",
        "frontier steps",
        "recall",
        "precision",
        "esc. step p50",
        "switches/run",
        "max sw.",
        "flapping runs",
        "warm share",
        "re-prefill tok",
        "frontier $",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in report["policies"].items():
        table.add_row(
            name,
            _fmt(r["escalation_rate"], pct=True),
            _fmt(r["frontier_step_share"], pct=True),
            _fmt(r["recall"], digits=2),
            _fmt(r["precision"], digits=2),
            _fmt(r["escalation_step_median"], digits=1),
            _fmt(r["switches_per_run"], digits=2),
            _fmt(r["max_switches"]),
            _fmt(r["runs_with_flaps"]),
            _fmt(r["warm_share"], pct=True),
            f"{r['reprefill_tokens']:,}",
            _fmt(r["frontier_cost_usd"], digits=2),
        )
    Console(width=200).print(table)


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay_cmd(
        ctx: typer.Context,
        runs: Annotated[
            list[Path] | None, typer.Option("--runs", help="run-log file or directory (repeat for several)")
        ] = None,
        policy: Annotated[
            str, typer.Option("--policy", help="policy names, comma-separated, or 'all'")
        ] = "all",
        bundle: Annotated[
            Path | None, typer.Option("--bundle", help="model bundle directory (predictions, thresholds)")
        ] = None,
        json_out: Annotated[Path | None, typer.Option("--json", help="write the full report here")] = None,
        weak_model: Annotated[
            str | None, typer.Option("--weak-model", help="replay only runs of this (local) model")
        ] = None,
        policy_config: Annotated[
            Path | None, typer.Option("--policy-config", help="YAML/JSON list of policy configs")
        ] = None,
        n_local: Annotated[
            int, typer.Option("--n-local", min=1, help="synthetic local replicas (with --config: the file's)")
        ] = 2,
        config: Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)] = None,
        show_config: Annotated[bool, typer.Option("--show-config", help=SHOW_HELP)] = False,
    ) -> None:
        """Replay logged runs through routing policies: escalations, recall, flaps, cache (no timing)."""
        import orjson

        from runroute.errors import CliError

        res = deployment_for(
            config, show_config, {"replicas": ("--n-local", n_local)} if given(ctx, "n_local") else {}
        )
        if not runs:
            raise CliError("replay needs --runs")
        n_local = res.deployment.replicas or n_local

        from features.runlog import read_runlog
        from models.predictor import ConstantPredictor
        from router.policy.config import PolicyConfigError, build_policy
        from router.replay import default_backends, replay
        from runroute.errors import CliError

        predictor: Any
        loaded = None
        if bundle is not None:
            from models.bundle import BundleError, ModelBundle

            try:
                loaded = ModelBundle.load(bundle)
            except BundleError as e:
                raise CliError(str(e)) from None
            predictor = loaded
        else:
            predictor = ConstantPredictor()
            typer.echo("note: no --bundle; predictions are constant (p_frontier 0)", err=True)
        try:
            policies = [build_policy(c, loaded) for c in _policy_configs(policy, policy_config)]
        except PolicyConfigError as e:
            raise CliError(str(e)) from None
        log = read_runlog(runs)
        if len(log.steps) == 0:
            raise CliError("no step records in the given run logs")
        frontier_model = "frontier-model"
        if "strong_model" in log.runs.columns:
            strong = log.runs["strong_model"].dropna().unique().tolist()
            if len(strong) == 1:
                frontier_model = str(strong[0])
        backends = priced_backends(
            res,
            default_backends(
                local_model=weak_model or "local-model", frontier_model=frontier_model, n_local=n_local
            ),
        )
        try:
            report = replay(log, policies, predictor, backends=backends, weak_model=weak_model)
        except ValueError as e:
            raise CliError(str(e)) from None
        if report["steps"] == 0:
            raise CliError(f"no steps to replay (no runs of model {weak_model!r}?)")
        report["inputs"] = {
            "runs": [str(p) for p in runs],
            "bundle": str(bundle) if bundle else None,
            "bundle_version": loaded.version if loaded is not None else None,
            "policies": [p.name for p in policies],
        }
        print_table(report)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
            typer.echo(f"wrote {json_out}")
