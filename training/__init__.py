"""Offline training: run logs -> per-step datasets -> predictors -> a verified ModelBundle, tracked in
MLflow (``runroute train``), plus evaluation and the scorecard report.

Modules (import them directly; this package imports nothing heavy itself):

- :mod:`training.dataset`: per-step rows and labels from whole runs (``build_dataset``, ``lru_replay``).
- :mod:`training.train`: the job (``TrainConfig``, ``run_training``, ``train_on_log``).
- :mod:`training.evaluate`: grouped cross-validation against baselines.
- :mod:`training.calibration`: reliability curve, ECE, thresholds for a target frontier share.
- :mod:`training.mlflow_log`: params, metrics, plots, registered model and the ``champion`` alias.
"""

__all__ = ["dataset", "train", "evaluate", "calibration", "mlflow_log"]
