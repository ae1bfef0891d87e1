"""MLflow tracking for the training job: params, metrics, plots, dataset inputs, the bundle as a
registered, self-contained model, and the ``champion`` alias.

Algorithm (:func:`log_training`): one MLflow run in experiment ``cfg.experiment`` logs the config as
params, every numeric leaf of the report as a metric (``escalation.auc``,
``escalation.per_step.1.stall.brier``, ...), the reliability curve and the feature importances as PNG
plots, the report as JSON, and the dataset inputs (``mlflow.data``): every run-log file read
(context ``run-log``, digest and tag ``sha256`` of the file's bytes, tag ``path``), and the per-step
training and held-out sets (contexts ``training`` / ``holdout``: the feature schema, digest and tag
``sha256`` of the rows, labels and groups of each part; the bundle's ``training_data_sha256`` hashes
both parts together). The bundle is logged as a pyfunc model
*from code* (:mod:`training.bundle_model`, no pickle of a class of this package) with the
``features`` and ``models`` packages as its code, pinned requirements (numpy, pandas, pyarrow,
pydantic, orjson, scikit-learn, lightgbm, joblib, and ``runroute`` itself at the version that
trained it), a signature (feature columns in, prediction columns out) and an input example (feature
rows of the training set), registered as ``cfg.registered_model``; the version's tags carry the
bundle version and the promotion verdict.

The alias ``champion`` moves only on promotion:

- with no champion yet, the first version becomes champion (nothing to beat);
- without ``promote_if_better`` the new version is registered and the alias stays where it is;
- with it, the candidate must first beat every baseline on the held-out tasks by more than the SE
  (:func:`training.promote_gate.baseline_gate`; else it is registered and not promoted, even with
  no champion yet); then the current champion bundle is downloaded, verified (:meth:`ModelBundle.load`) and scored
  on the *same* held-out groups as the new one (the holdout is a stable hash of the group ids); the
  alias moves only if the new bundle's escalation Brier score is lower (AUC breaks an exact tie). A
  champion that cannot be loaded (e.g. another feature spec) cannot be scored and is replaced.

A router following ``models:/<registered_model>@champion`` (:mod:`router.server.bundles`) picks the
new version up when the alias moves.

Tracking URI: ``cfg.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in
the working directory (:func:`resolve_tracking_uri` = :func:`models.bundle.default_tracking_uri`,
the router's default too). mlflow is imported here only (never on the router's path).

Helpers for callers that track a job: :func:`ensure_experiment` (create the experiment with its
artifacts in a chosen directory) and :func:`quiet_mlflow` (MLflow's INFO lines and advisory warnings
off the console for a block).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import mlflow
import mlflow.pyfunc

from training.jsonio import jsonable

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from mlflow import MlflowClient

    from training.config import TrainConfig, TrainResult

__all__ = [
    "resolve_tracking_uri",
    "log_training",
    "CHAMPION",
    "flatten_metrics",
    "quiet_mlflow",
    "ensure_experiment",
    "log_bundle_model",
    "log_datasets",
    "run_log_files",
]

CHAMPION = "champion"


def resolve_tracking_uri(explicit: str | None = None) -> str:
    from models.bundle import default_tracking_uri

    return default_tracking_uri(explicit)


def flatten_metrics(d: object, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if k in ("config", "mlflow", "feature_importance_gain", "sources"):
                continue
            out.update(flatten_metrics(v, f"{prefix}{k}."))
    elif isinstance(d, bool):
        out[prefix[:-1]] = float(d)
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        f = float(d)
        if math.isfinite(f):
            out[prefix[:-1]] = f
    return out


def _figures(result: TrainResult) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.calibration import reliability_curve

    figs: dict[str, Any] = {}
    e = result.oof.get("escalation")
    if e is not None:
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect")
        for name in ("model", "stall", "logreg_steps"):
            rc = reliability_curve(e["y"], e[name], 10)
            ax.plot(rc["mean_pred"], rc["frac_pos"], marker="o", label=name)
        ax.set_xlabel("predicted P(needs frontier)")
        ax.set_ylabel("observed share")
        ax.set_title("Reliability (out-of-fold, grouped)")
        ax.legend()
        figs["calibration.png"] = fig
    imp = result.report.get("feature_importance_gain", {})
    if imp:
        top = list(imp.items())[:20][::-1]
        fig, ax = plt.subplots(figsize=(6, 6))
        ax.barh([k for k, _ in top], [v for _, v in top])
        ax.set_xlabel("gain")
        ax.set_title("Escalation model: feature importance")
        fig.tight_layout()
        figs["feature_importance.png"] = fig
    return figs


def _flat_params(cfg: TrainConfig) -> dict[str, str]:
    d = cfg.model_dump(mode="json")
    d["runs"] = ",".join(d["runs"])[:500]
    d["pairs"] = ",".join(d["pairs"])
    return {k: str(v)[:500] for k, v in d.items()}


def log_training(result: TrainResult, cfg: TrainConfig) -> dict[str, Any]:
    """Log, register and (on promotion only) alias; returns run id, model version, champion
    version, promotion verdict."""
    import matplotlib.pyplot as plt
    from mlflow import MlflowClient

    from features.extract import FEATURE_SPEC_VERSION

    uri = resolve_tracking_uri(cfg.tracking_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(cfg.experiment)
    client = MlflowClient(tracking_uri=uri)
    with mlflow.start_run() as run:
        mlflow.log_params(_flat_params(cfg))
        mlflow.set_tags(
            {"feature_spec_version": FEATURE_SPEC_VERSION, "bundle_version": result.bundle.version}
        )
        mlflow.log_metrics(flatten_metrics(result.report))
        for name, fig in _figures(result).items():
            mlflow.log_figure(fig, name)
            plt.close(fig)
        mlflow.log_dict(_safe(result.report), "report.json")
        log_datasets(result, cfg)
        info = log_bundle_model(result, cfg.registered_model)
        version = str(info.registered_model_version)
        out: dict[str, Any] = {
            "tracking_uri": uri,
            "run_id": run.info.run_id,
            "registered_model": cfg.registered_model,
            "version": version,
            "model_uri": f"models:/{cfg.registered_model}/{version}",
        }
        current = _champion_version(client, cfg.registered_model)
        promote, why, champ_scores = True, "no champion yet", None
        if cfg.promote_if_better:  # first: beat every baseline on held-out tasks (training.promote_gate)
            from training.promote_gate import baseline_gate, escalation_gate

            esc = (
                escalation_gate(result.bundle, result.dataset, result.holdout) if len(result.holdout) else {}
            )
            promote, why = baseline_gate(result.report, esc)
        if promote and current is not None and current != version:
            if cfg.promote_if_better:
                promote, why, champ_scores = _compare(result, cfg.registered_model, current, uri)
            else:
                promote, why = False, f"champion v{current} kept (promotion needs --promote-if-better)"
        if promote:
            client.set_registered_model_alias(cfg.registered_model, CHAMPION, version)
        out.update(
            champion_before=current,
            champion=version if promote else current,
            promoted=promote,
            promotion_reason=why,
        )
        if champ_scores is not None:
            out["champion_holdout"] = champ_scores
            mlflow.log_metrics({f"champion_holdout.{k}": v for k, v in flatten_metrics(champ_scores).items()})
        mlflow.set_tags({"promoted": str(promote), "promotion_reason": why[:250]})
        for k, v in (
            ("bundle_version", result.bundle.version),
            ("promoted", str(promote)),
            ("promotion_reason", why[:250]),
        ):
            client.set_model_version_tag(cfg.registered_model, version, k, v)
    return out


def log_bundle_model(result: TrainResult, registered_model: str) -> Any:
    """Log the bundle directory as a self-contained pyfunc model (see the module docstring) in the
    active run and register it; returns MLflow's ``ModelInfo``."""
    import importlib.util

    import features
    import models

    # the file's path, without importing it (it calls mlflow.models.set_model when executed)
    spec = importlib.util.find_spec("training.bundle_model")
    assert spec is not None and spec.origin is not None
    example = _input_example(result)
    return mlflow.pyfunc.log_model(
        name="bundle",
        python_model=str(Path(spec.origin).resolve()),
        artifacts={"bundle": str(result.bundle_dir)},
        code_paths=[str(Path(str(p.__file__)).resolve().parent) for p in (features, models)],
        registered_model_name=registered_model,
        pip_requirements=_requirements(result.bundle.manifest.get("libraries", {})),
        signature=_signature(example, result),
        input_example=example,
    )


def _input_example(result: TrainResult, n: int = 3) -> Any:
    """Feature rows of the training set (rows without NaN first: JSON has no NaN)."""
    import numpy as np
    import pandas as pd

    from features.extract import FEATURE_NAMES

    X = np.asarray(result.dataset.X, dtype=np.float64)
    finite = np.isfinite(X).all(axis=1)
    rows = X[finite][:n] if finite.any() else np.nan_to_num(X[:n])
    return pd.DataFrame(rows, columns=list(FEATURE_NAMES))


def _signature(example: pd.DataFrame, result: TrainResult) -> Any:
    import pandas as pd
    from mlflow.models import infer_signature

    out = pd.DataFrame([result.bundle.predict_features(x).as_dict() for x in example.to_numpy()])
    return infer_signature(example, out)


def run_log_files(paths: list[Path]) -> list[Path]:
    """The run-log files ``paths`` name (a directory: its ``*.parquet`` / ``*.jsonl``, as
    :func:`features.runlog.read_runlog` reads them)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(
                sorted(
                    x
                    for x in p.iterdir()
                    if x.suffix in (".parquet", ".jsonl")
                    and not x.name.endswith(".rejected.jsonl")
                    and not x.name.startswith(".")
                )
            )
        elif p.exists():
            out.append(p)
    return out


def log_datasets(result: TrainResult, cfg: TrainConfig) -> list[dict[str, str]]:
    """Log the dataset inputs of the active run (module docstring); returns what was logged."""
    import mlflow.data.sources as sources
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import ColSpec, Schema

    from features.extract import FEATURE_NAMES
    from models.bundle import file_sha256

    local = sources.LocalArtifactDatasetSource  # type: ignore[attr-defined]  # registered at import
    logged: list[dict[str, str]] = []
    for f in run_log_files(cfg.runs):
        sha = file_sha256(f)
        ds = MetaDataset(source=local(str(f.resolve())), name=f.name, digest=sha[:32])  # type: ignore[abstract]
        tags = {"sha256": sha, "path": str(f.resolve()), "bytes": str(f.stat().st_size)}
        mlflow.log_input(ds, context="run-log", tags=tags)
        logged.append({"context": "run-log", "name": f.name, "sha256": sha})
    schema = Schema([ColSpec("double", n) for n in FEATURE_NAMES])
    src = local(str(Path(cfg.out).resolve()))
    for context, part in (("training", result.dataset), ("holdout", result.holdout)):
        if len(part) == 0:
            continue
        sha = part.sha256()
        ds = MetaDataset(source=src, name=f"steps-{context}", digest=sha[:32], schema=schema)  # type: ignore[abstract]
        tags = {"sha256": sha, "n_steps": str(len(part)), "n_runs": str(part.n_runs)}
        mlflow.log_input(ds, context=context, tags=tags)
        logged.append({"context": context, "name": f"steps-{context}", "sha256": sha})
    return logged


def _requirements(libs: dict[str, str]) -> list[str]:
    """Pinned requirements of the logged model: the bundle's training libraries, what the logged
    ``features`` / ``models`` code imports, and runroute itself (its version names the release the
    bundle belongs to; the code is logged, so loading in-process does not need it installed)."""
    from importlib import metadata

    names = {"numpy": "numpy", "scikit-learn": "scikit-learn", "lightgbm": "lightgbm", "joblib": "joblib"}
    out = [f"{pkg}=={libs[k]}" for k, pkg in names.items() if k in libs]
    have = {r.split("==")[0] for r in out}
    for dist in (
        "runroute",
        "numpy",
        "scikit-learn",
        "lightgbm",
        "joblib",
        "pandas",
        "pyarrow",
        "pydantic",
        "orjson",
    ):
        if dist in have:
            continue
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return out


def _champion_version(client: MlflowClient, name: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except Exception:  # noqa: BLE001 - no alias (or no model) yet
        return None


def _compare(
    result: TrainResult, name: str, version: str, uri: str
) -> tuple[bool, str, dict[str, Any] | None]:
    from models.bundle import BundleError, ModelBundle
    from training.evaluate import bundle_scores

    if len(result.holdout) == 0:
        return True, "no held-out split (holdout_share=0): promoted without comparison", None
    try:
        champ = ModelBundle.load_registered(f"models:/{name}/{version}", uri)
    except (BundleError, OSError) as e:
        return True, f"champion v{version} cannot be scored ({e}); replaced", None
    new = bundle_scores(result.bundle, result.holdout)
    old = bundle_scores(champ, result.holdout)
    ne, oe = new.get("escalation", {}), old.get("escalation", {})
    nb, ob = ne.get("brier", math.inf), oe.get("brier", math.inf)
    if nb < ob or (nb == ob and ne.get("auc", 0.0) > oe.get("auc", 0.0)):
        return True, f"held-out Brier {nb:.4f} < champion v{version}'s {ob:.4f}", old
    return False, f"held-out Brier {nb:.4f} >= champion v{version}'s {ob:.4f}; champion kept", old


def _safe(report: Mapping[str, object]) -> dict[str, Any]:
    out = jsonable(report)
    assert isinstance(out, dict)
    return out


def ensure_experiment(tracking_uri: str, name: str, artifacts: Path) -> None:
    """Create the MLflow experiment ``name`` with its artifacts under ``artifacts`` unless it exists
    (a database tracking store otherwise puts them in ./mlruns of whatever the working directory is)."""
    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(name) is None:
        artifacts.mkdir(parents=True, exist_ok=True)
        mlflow.create_experiment(name, artifact_location=artifacts.resolve().as_uri())


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO lines and advisory warnings (pyfunc type hints, cloudpickle) off the console
    for the block; the logger level and warning hooks are restored afterwards.

    Warnings are dropped at display time (``showwarning``) rather than by a filter, because importing
    parts of mlflow prepends its own ``("once", UserWarning)`` filter, which would shadow ours."""
    lg = logging.getLogger("mlflow")  # mlflow is imported (above), so its logger level is configured
    old = lg.level
    lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            shown = warnings.showwarning

            def show(
                message: Warning | str,
                category: type[Warning],
                filename: str,
                lineno: int,
                file: TextIO | None = None,
                line: str | None = None,
            ) -> None:
                if f"{os.sep}mlflow{os.sep}" not in str(filename):
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            yield
    finally:
        lg.setLevel(old)
