"""The training job's knobs and result: :class:`TrainConfig` and :class:`TrainResult`.

Kept apart from :mod:`training.train` (the job) so that :mod:`training.mlflow_log`, which the job
calls, can type its inputs without importing the job back (no import cycle): the job imports this
module, :mod:`training.evaluate` and :mod:`training.mlflow_log`; those import only this module and
:mod:`training.evaluate`.

Knobs: every field of :class:`TrainConfig` (CLI flags of ``runroute train`` map 1:1 onto them; the
field comments say what each does and why its default is what it is). :class:`TrainResult` holds the
fitted bundle, where it was saved, the report, the training / held-out datasets, the out-of-fold
predictions and what MLflow returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from features.extract import FEATURE_NAMES
from models.bundle import ModelBundle
from models.cache_reuse import CacheReuseRegressor
from models.escalation import EscalationClassifier
from models.remaining import RemainingWorkRegressor
from router.policy.defaults import KV_CACHE_GB
from training.benefit import BenefitConfig
from training.dataset import Dataset

__all__ = ["TrainConfig", "TrainResult"]


class TrainConfig(BaseModel):
    """Knobs of the training job (CLI flags map 1:1 onto these fields)."""

    model_config = ConfigDict(extra="forbid")

    runs: list[Path] = Field(min_length=1, description="run-log files or directories")
    pairs: list[str] = Field(default_factory=list, description='"WEAK=STRONG" model pairings')
    out: Path = Field(description="bundle directory to write")
    report_json: Path | None = None
    target_frontier_share: float = Field(default=0.3, ge=0.0, le=1.0)
    threshold_band: float = Field(default=0.1, ge=0.0, le=1.0)
    n_folds: int = Field(default=5, ge=2)
    holdout_share: float = Field(default=0.2, ge=0.0, lt=1.0)
    eval_steps: tuple[int, ...] = (1, 3, 5)
    evaluate: bool = True
    # cache-label replay: None = one replica's KV blocks of the node profile (training.dataset.node_cache_blocks)
    cache_capacity_blocks: int | None = Field(default=None, ge=1)
    node_gpu: str = "a100"
    kv_cache_gb: float = Field(default=KV_CACHE_GB, gt=0.0)
    cache_replicas: int = Field(default=2, ge=1)
    block_tokens: int = Field(default=512, ge=1)
    # LightGBM for the regressors (cache reuse; remaining work unless overridden below)
    n_estimators: int = Field(default=200, ge=1)
    learning_rate: float = Field(default=0.05, gt=0.0)
    num_leaves: int = Field(default=31, ge=2)
    min_child_samples: int = Field(default=20, ge=1)
    max_bin: int = Field(default=255, ge=2)
    # remaining-work quantile models: smaller leaves than the cache model (chosen on the grouped CV
    # of the shipped data among 3 settings: 31/20 lost to the per-step quantile baseline)
    remaining_num_leaves: int = Field(default=7, ge=2)
    remaining_min_child_samples: int = Field(default=50, ge=1)
    # LightGBM for the escalation classifier: deliberately regularised (tiny trees, row/column
    # subsampling): its labels are per run and the real labelled data is a few hundred runs.
    escalation_n_estimators: int = Field(default=100, ge=1)
    escalation_num_leaves: int = Field(default=4, ge=2)
    escalation_min_child_samples: int = Field(default=50, ge=1)
    escalation_subsample: float = Field(default=0.8, gt=0.0, le=1.0)
    escalation_colsample_bytree: float = Field(default=0.5, gt=0.0, le=1.0)
    calibration: str = "isotonic"
    calibration_cv: int = Field(default=5, ge=0)
    calibration_max_rows: int | None = Field(
        default=200_000, ge=2, description="rows for the OOF calibration"
    )
    # above calibration_max_rows labelled rows the final escalation model is fit without a random
    # subset of the groups holding at most this share of those rows (and at most
    # calibration_max_rows), and the thresholds are set on its scores of them
    # (training.calibration.threshold_slice: the capped folds' scores did not transfer); 0 = off
    threshold_slice_share: float = Field(default=0.2, ge=0.0, lt=1.0)
    random_state: int = 0
    # LightGBM threads per fit. 1 by default: on a busy 2-core machine OpenMP threads spin-wait for
    # each other (measured 300k rows: 1 thread 5.2 s, 2 threads 12.9 s); use processes instead.
    n_jobs: int = Field(default=1, ge=1)
    # processes for the independent final fits (escalation, cache reuse, remaining steps/tokens)
    # when the data has at least large_data_rows rows (below that, start-up costs more than it saves)
    parallel_fits: int = Field(default=2, ge=1)
    # at or above large_data_rows training rows: max_bin <= 63, calibration_cv <= 3, row bagging
    # (large_data_subsample), regressors with at most large_data_n_estimators trees at a learning rate
    # of at least large_data_learning_rate: keeps 1M steps within ~2 minutes on 2 cores
    large_data_rows: int = Field(default=200_000, ge=1)
    large_data_subsample: float = Field(default=0.5, gt=0.0, le=1.0)
    large_data_n_estimators: int = Field(default=100, ge=1)
    large_data_learning_rate: float = Field(default=0.1, gt=0.0)
    subsample: float = Field(default=1.0, gt=0.0, le=1.0)
    mlflow: bool = True
    tracking_uri: str | None = None
    experiment: str = "runroute-train"
    registered_model: str = "runroute-bundle"
    promote_if_better: bool = False
    # the per-domain benefit model (training.benefit): knobs, and where its tables go (JSON + PNG)
    benefit: BenefitConfig = Field(default_factory=BenefitConfig)
    benefit_report_dir: Path | None = None

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[str]) -> list[str]:
        for p in v:
            if p.count("=") != 1 or not all(p.split("=")):
                raise ValueError(f"pairing {p!r} must look like WEAK_MODEL=STRONG_MODEL")
        return v

    @field_validator("calibration")
    @classmethod
    def _cal(cls, v: str) -> str:
        if v not in ("isotonic", "sigmoid", "none"):
            raise ValueError("calibration must be isotonic, sigmoid or none")
        return v

    def estimator_params(self) -> dict[str, Any]:
        return dict(
            n_estimators=self.n_estimators,
            learning_rate=self.learning_rate,
            num_leaves=self.num_leaves,
            min_child_samples=self.min_child_samples,
            max_bin=self.max_bin,
            subsample=self.subsample,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )

    def make_escalation(self) -> EscalationClassifier:
        params = self.estimator_params()
        params.update(
            n_estimators=self.escalation_n_estimators,
            num_leaves=self.escalation_num_leaves,
            min_child_samples=self.escalation_min_child_samples,
            subsample=min(self.escalation_subsample, self.subsample),
            colsample_bytree=self.escalation_colsample_bytree,
        )
        return EscalationClassifier(
            calibration=self.calibration,
            cv=self.calibration_cv,
            calibration_max_rows=self.calibration_max_rows,
            **params,
        )

    def make_cache(self) -> CacheReuseRegressor:
        return CacheReuseRegressor(prompt_col=FEATURE_NAMES.index("ctx_tokens"), **self.estimator_params())

    def make_remaining(self) -> RemainingWorkRegressor:
        params = self.estimator_params()
        params.update(
            num_leaves=self.remaining_num_leaves, min_child_samples=self.remaining_min_child_samples
        )
        return RemainingWorkRegressor(quantiles=(0.5, 0.9), **params)


@dataclass
class TrainResult:
    bundle: ModelBundle
    bundle_dir: Path
    report: dict[str, Any]
    dataset: Dataset
    holdout: Dataset
    oof: dict[str, Any] = field(default_factory=dict)
    mlflow: dict[str, Any] = field(default_factory=dict)
