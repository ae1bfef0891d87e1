"""MLflow tracking for the training job: params, metrics, plots, the bundle as a registered model.

Algorithm (:func:`log_training`): one MLflow run in experiment ``cfg.experiment`` logs the config as
params, every numeric leaf of the report as a metric (``escalation.auc``,
``escalation.per_step.1.stall.brier``, ...), the reliability curve and the feature importances as PNG
plots, the report as JSON, and the bundle directory wrapped as a ``pyfunc`` model (so it can be
registered and served) registered as ``cfg.registered_model``. Then the alias ``champion``:

- with no champion yet, the new version becomes champion;
- without ``promote_if_better`` the alias moves to the new version;
- with it, the current champion bundle is downloaded, verified (:meth:`ModelBundle.load`) and scored
  on the *same* held-out groups as the new one (the holdout is a stable hash of the group ids); the
  alias moves only if the new bundle's escalation Brier score is lower (AUC breaks an exact tie). A
  champion that cannot be loaded (e.g. another feature spec) cannot be scored and is replaced.

Tracking URI: ``cfg.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in
the working directory (see :func:`resolve_tracking_uri`). mlflow is imported here only (never on the
router's path).

Helpers for callers that track a job: :func:`ensure_experiment` (create the experiment with its
artifacts in a chosen directory) and :func:`quiet_mlflow` (MLflow's INFO lines and advisory warnings
off the console for a block).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import mlflow.pyfunc

if TYPE_CHECKING:  # pragma: no cover
    from training.config import TrainConfig, TrainResult

__all__ = [
    "resolve_tracking_uri",
    "log_training",
    "BundlePyfunc",
    "CHAMPION",
    "flatten_metrics",
    "quiet_mlflow",
    "ensure_experiment",
]

CHAMPION = "champion"


def resolve_tracking_uri(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


class BundlePyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined]
    """pyfunc face of a bundle: input = feature rows (columns = FEATURE_NAMES), output = predictions."""

    # no type hints on these two: mlflow reads them to infer (and then warn about) a signature
    def load_context(self, context):  # type: ignore[no-untyped-def]
        from models.bundle import ModelBundle

        self.bundle = ModelBundle.load(context.artifacts["bundle"])

    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        import numpy as np
        import pandas as pd

        X = np.asarray(model_input, dtype=np.float64)
        rows = [self.bundle.predict_features(x).as_dict() for x in X]
        return pd.DataFrame(rows)


def flatten_metrics(d: Any, prefix: str = "") -> dict[str, float]:
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
    """Log, register and alias; returns run id, model version, champion version, promotion verdict."""
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
        info = mlflow.pyfunc.log_model(
            name="bundle",
            python_model=BundlePyfunc(),
            artifacts={"bundle": str(result.bundle_dir)},
            registered_model_name=cfg.registered_model,
            pip_requirements=_requirements(result.bundle.manifest.get("libraries", {})),
        )
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
        if current is not None and current != version:
            if cfg.promote_if_better:
                promote, why, champ_scores = _compare(result, cfg.registered_model, current, uri)
            else:
                why = "promotion forced (no --promote-if-better)"
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
    return out


def _requirements(libs: dict[str, str]) -> list[str]:
    names = {"numpy": "numpy", "scikit-learn": "scikit-learn", "lightgbm": "lightgbm", "joblib": "joblib"}
    return [f"{pkg}=={libs[k]}" for k, pkg in names.items() if k in libs]


def _champion_version(client: Any, name: str) -> str | None:
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
    with tempfile.TemporaryDirectory(prefix="runroute-champion-") as tmp:
        try:
            local = Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"models:/{name}/{version}", dst_path=tmp, tracking_uri=uri
                )
            )
            manifests = sorted(local.rglob("manifest.json"))
            if not manifests:
                raise BundleError("no manifest.json in the registered champion")
            champ = ModelBundle.load(manifests[0].parent)
        except (BundleError, OSError) as e:
            return True, f"champion v{version} cannot be scored ({e}); replaced", None
        new = bundle_scores(result.bundle, result.holdout)
        old = bundle_scores(champ, result.holdout)
    ne, oe = new.get("escalation", {}), old.get("escalation", {})
    nb, ob = ne.get("brier", math.inf), oe.get("brier", math.inf)
    if nb < ob or (nb == ob and ne.get("auc", 0.0) > oe.get("auc", 0.0)):
        return True, f"held-out Brier {nb:.4f} < champion v{version}'s {ob:.4f}", old
    return False, f"held-out Brier {nb:.4f} >= champion v{version}'s {ob:.4f}; champion kept", old


def _safe(report: dict[str, Any]) -> dict[str, Any]:
    from training.jsonio import jsonable

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
                message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
            ) -> None:
                if f"{os.sep}mlflow{os.sep}" not in str(filename):
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            yield
    finally:
        lg.setLevel(old)
