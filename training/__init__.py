"""Offline training: run logs -> per-step datasets -> predictors -> a verified ModelBundle, tracked in
MLflow (``runroute train``), plus evaluation and the scorecard report (:mod:`training.eval`).

Modules (import them directly; this package imports nothing heavy itself):

- :mod:`training.dataset`: per-step rows and labels from whole runs (``build_dataset``, ``lru_replay``).
- :mod:`training.train`: the job (``run_training``, ``train_on_log``); :mod:`training.config`: its
  knobs and result (``TrainConfig``, ``TrainResult``).
- :mod:`training.evaluate`: grouped cross-validation against baselines.
- :mod:`training.calibration`: reliability curve, ECE, thresholds for a target frontier share.
- :mod:`training.mlflow_log`: params, metrics, plots, registered model and the ``champion`` alias.
- :mod:`training.jsonio`: JSON-safe copies of reports, atomic file writes.
- :mod:`training.eval`: outcome model, typed scorecard, policy comparison, live segment, report.
"""

__all__ = ["dataset", "config", "train", "evaluate", "calibration", "mlflow_log", "jsonio", "eval"]
