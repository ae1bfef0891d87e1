"""The scorecard as typed models: one pydantic model per JSON object ``scorecard.json`` holds.

``runroute demo`` and ``runroute bench`` build a :class:`Scorecard` (validated: every field typed,
no unknown key) and write it with :meth:`Scorecard.to_json_dict`; :mod:`training.eval.report`
renders ``report.md`` and the plots from that dict. Every field carries a ``description``: the
list of scorecard keys in docs/scorecard.md and the key reference at the end of ``report.md`` are generated
from them (:mod:`training.eval.readme_keys`), so the documentation cannot drift from the code.

:class:`WhatIfRow` documents the rows of ``runroute whatif --json``: they are computed by
``router.sim.whatif.scorecard``; its field names are asserted (in the tests) to equal
``router.sim.whatif.SCORECARD_KEYS``, in order.

Serialisation: fields listed in a model's ``ONLY_WHEN_SET`` are written only when the producer set
them (e.g. ``split`` only by the demo, ``bad_rows`` only by bench, ``thresholds`` only on the rows
of threshold policies); every other field is always written, ``null`` where a figure is undefined
(NaN and infinities become ``null`` too, :func:`training.jsonio.jsonable`).

No knobs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from training.eval.config import LiveSettings, SimSettings
from training.jsonio import jsonable

__all__ = [
    "SCHEMA",
    "PriceTable",
    "SyntheticSet",
    "Split",
    "TrainingInfo",
    "EscalationScores",
    "CacheScores",
    "RemainingScores",
    "ModelScores",
    "Skipped",
    "SimInfo",
    "PolicyRow",
    "SweepPoint",
    "SetResult",
    "LiveFigures",
    "LiveSegment",
    "RunLevelPair",
    "Scorecard",
    "WhatIfRow",
]

SCHEMA: Literal["runroute-scorecard/1"] = "runroute-scorecard/1"


def _f(description: str, **kw: Any) -> Any:
    """A field with its description; ``each`` names the key of a mapping field in the docs."""
    each = kw.pop("each", None)
    return Field(description=description, json_schema_extra={"each": each} if each else None, **kw)


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ONLY_WHEN_SET: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for k in self.ONLY_WHEN_SET - self.model_fields_set:
                out.pop(k, None)
        return out


# ------------------------------------------------------------------------------- simulator figures

# one description per simulator figure, shared by the policy rows and the what-if rows
_SIM: dict[str, str] = {
    "policy": "policy label (the `name` of its config)",
    "replicas": "simulated local replicas",
    "kv_cache_gb": "KV cache per replica (GB)",
    "runs_completed": "runs whose every step was served",
    "runs_rejected": "runs rejected by admission control at their first step",
    "runs_spilled": "runs admission control spilled whole to the frontier at their first step",
    "run_completion_s_p50": "median run completion time (s; first arrival to last step's end, incl. tool pauses)",
    "run_completion_s_p95": "p95 run completion time (s, incl. tool pauses)",
    "step_latency_s_p50": "median end-to-end step latency (s, served steps)",
    "step_latency_s_p95": "p95 end-to-end step latency (s, served steps)",
    "step_latency_s_p99": "p99 end-to-end step latency (s, served steps)",
    "short_step_latency_s_p95": "p95 latency of short steps (s; <= 64 output tokens or a tool call)",
    "long_step_latency_s_p95": "p95 latency of the other (long) steps (s)",
    "ttft_s_p95": "p95 time to first token (s, served steps)",
    "cache_hit_rate": "cached / prompt tokens over local steps from the 2nd step of a run on",
    "cache_hit_upper_bound": "prompt tokens repeating the run's earlier prefix / prompt tokens, same steps "
    "(what a perfect prefix cache would reach)",
    "cost_usd": "simulated bill (USD): frontier tokens x prices + local GPU-hours x the GPU-hour price",
    "escalation_rate": "policy-routed runs with at least one frontier step / policy-routed runs",
    "flaps_per_run": "switches of tier or replica per policy-routed run",
    "slo_attainment": "served steps within the per-step SLO (short steps: latency <= `slo_short_s`; "
    "others: TTFT <= `slo_ttft_s`)",
}


class WhatIfRow(_Card):
    """One row of ``runroute whatif --json`` (``router.sim.whatif.scorecard``), per policy x grid point."""

    policy: str = _f(_SIM["policy"])
    replicas: int = _f(_SIM["replicas"])
    kv_cache_gb: float = _f(_SIM["kv_cache_gb"])
    runs_completed: int = _f(_SIM["runs_completed"])
    runs_rejected: int = _f(_SIM["runs_rejected"])
    runs_spilled: int = _f(_SIM["runs_spilled"])
    run_completion_s_p50: float | None = _f(_SIM["run_completion_s_p50"])
    run_completion_s_p95: float | None = _f(_SIM["run_completion_s_p95"])
    step_latency_s_p50: float | None = _f(_SIM["step_latency_s_p50"])
    step_latency_s_p95: float | None = _f(_SIM["step_latency_s_p95"])
    step_latency_s_p99: float | None = _f(_SIM["step_latency_s_p99"])
    short_step_latency_s_p95: float | None = _f(_SIM["short_step_latency_s_p95"])
    ttft_s_p95: float | None = _f(_SIM["ttft_s_p95"])
    cache_hit_rate: float | None = _f(_SIM["cache_hit_rate"])
    cache_hit_upper_bound: float | None = _f(_SIM["cache_hit_upper_bound"])
    cost_usd: float = _f(_SIM["cost_usd"])
    escalation_rate: float | None = _f(_SIM["escalation_rate"])
    flaps_per_run: float | None = _f(_SIM["flaps_per_run"])
    slo_attainment: float | None = _f(_SIM["slo_attainment"])


# ------------------------------------------------------------------------------- one held-out set


class Skipped(_Card):
    """A part that did not run, and why."""

    skipped: str = _f("why this part did not run")


class PolicyRow(_Card):
    """One policy on one held-out set: simulator figures, outcome-model figures, frontier-relative ones."""

    ONLY_WHEN_SET = frozenset({"thresholds"})

    policy: str = _f("policy label")
    kind: str = _f("policy kind (`router.policy.config`)")
    # simulator
    runs_completed: int = _f("simulator: " + _SIM["runs_completed"])
    runs_rejected: int = _f("simulator: " + _SIM["runs_rejected"])
    runs_spilled: int = _f("simulator: " + _SIM["runs_spilled"])
    run_completion_s_p50: float | None = _f("simulator: " + _SIM["run_completion_s_p50"])
    run_completion_s_p95: float | None = _f("simulator: " + _SIM["run_completion_s_p95"])
    step_latency_s_p95: float | None = _f("simulator: " + _SIM["step_latency_s_p95"])
    short_step_latency_s_p95: float | None = _f("simulator: " + _SIM["short_step_latency_s_p95"])
    long_step_latency_s_p95: float | None = _f("simulator: " + _SIM["long_step_latency_s_p95"])
    ttft_s_p95: float | None = _f("simulator: " + _SIM["ttft_s_p95"])
    cache_hit_rate: float | None = _f("simulator: " + _SIM["cache_hit_rate"])
    cache_hit_upper_bound: float | None = _f("simulator: " + _SIM["cache_hit_upper_bound"])
    flaps_per_run: float | None = _f("simulator: " + _SIM["flaps_per_run"])
    slo_attainment: float | None = _f("simulator: " + _SIM["slo_attainment"])
    sim_cost_usd: float = _f(
        "simulator: the simulated bill (frontier tokens + always-on GPU-hours of the simulated replicas)"
    )
    # outcome model
    runs: int = _f("runs of the set")
    quality_runs: int = _f("runs with both outcomes known (the denominator of `success_rate`)")
    success_rate: float | None = _f("mean expected success under the base (first) outcome variant")
    success_se: float | None = _f("task-bootstrap standard error of `success_rate`")
    success_ci_low: float | None = _f(
        "2.5th percentile of `success_rate` over task-bootstrap resamples (`training.eval.trials`)",
        default=None,
    )
    success_ci_high: float | None = _f("97.5th percentile of the same bootstrap", default=None)
    success_tasks: int = _f("tasks (bootstrap groups) behind `success_rate`", default=0)
    success_by_variant: dict[str, float | None] = _f(
        "`success_rate` under each outcome variant", each="variant"
    )
    cost_usd: float = _f("outcome-model cost (USD, token-priced) of the whole set")
    local_cost_usd: float = _f("the local part of `cost_usd`")
    frontier_cost_usd: float = _f("the frontier part of `cost_usd`")
    cost_per_run_usd: float | None = _f("`cost_usd` / runs")
    cost_per_success_usd: float | None = _f("`cost_usd` / expected successes")
    escalation_rate: float | None = _f(
        "served runs with any frontier step chosen by the policy (runs admission control spilled whole "
        "are left out here and counted in `spilled_runs`)"
    )
    frontier_step_share: float | None = _f("steps served on the frontier / steps")
    escalation_step_median: float | None = _f("median step index of a run's first frontier step")
    tier_switches_per_run: float | None = _f("tier changes between consecutive served steps, per run")
    needs_frontier_recall: float | None = _f(
        "needs-frontier runs the policy flagged (sent any step to the frontier) / needs-frontier runs "
        "(labelled, non-spilled runs only)"
    )
    needs_frontier_precision: float | None = _f("flagged runs that needed the frontier / flagged runs")
    needs_frontier_runs: int = _f("labelled needs-frontier runs (non-spilled)")
    spilled_runs: int = _f("runs admission control spilled whole to the frontier (scored as frontier runs)")
    thresholds: dict[str, float] | None = _f(
        "learned / per-step-threshold only: the operating thresholds (`p_frontier_up` / `p_frontier_down`, "
        "or `threshold`) from the bundle",
        default=None,
    )
    aiq_by_variant: dict[str, float | None] = _f("`aiq` under each outcome variant", each="variant")
    cost_at_95pct_frontier_success_by_variant: dict[str, float | None] = _f(
        "`cost_at_95pct_frontier_success_usd` under each outcome variant", each="variant"
    )
    cost_at_95pct_frontier_success_usd: float | None = _f(
        "cheapest cost among the policy's points (its sweep, if swept) reaching 95% of always-frontier's "
        "success; null if none does. It picks the sweep point with hindsight on the evaluated set: it "
        "describes the policy's curve, it is not the operating point the router runs (that is the row's "
        "own `success_rate` / `cost_usd`)"
    )
    aiq: float | None = _f(
        "area under the policy's non-decreasing concave cost-quality hull over the normalised cost axis "
        "x = (cost - always-local cost) / (always-frontier cost - always-local cost) in [0, 1], hull "
        "anchored at always-local (`training.eval.curves`)"
    )
    aiq_se: float | None = _f(
        "task-bootstrap standard error of `aiq` (tasks resampled, one draw shared by every policy, the "
        "anchors and sweep points recomputed in each resample; `training.eval.compare`)",
        default=None,
    )
    aiq_ci_low: float | None = _f("2.5th percentile of `aiq` over the same resamples", default=None)
    aiq_ci_high: float | None = _f("97.5th percentile of the same", default=None)
    success_diff_vs_ref: float | None = _f(
        "`success_rate` minus per-step-threshold's on the same runs (a paired comparison; null without "
        "that baseline)",
        default=None,
    )
    success_diff_vs_ref_ci_low: float | None = _f(
        "2.5th percentile of the paired success difference over the task-bootstrap resamples", default=None
    )
    success_diff_vs_ref_ci_high: float | None = _f("97.5th percentile of the same", default=None)
    aiq_diff_vs_ref: float | None = _f("`aiq` minus per-step-threshold's (paired)", default=None)
    aiq_diff_vs_ref_ci_low: float | None = _f(
        "2.5th percentile of the paired AIQ difference over the same resamples", default=None
    )
    aiq_diff_vs_ref_ci_high: float | None = _f("97.5th percentile of the same", default=None)


class SweepPoint(_Card):
    """One threshold of a swept policy."""

    threshold: float = _f("the swept p_frontier threshold")
    success_rate: float | None = _f("success under the base outcome variant")
    success_by_variant: dict[str, float | None] = _f("success under each outcome variant", each="variant")
    cost_usd: float = _f("outcome-model cost of the set (USD)")
    escalation_rate: float | None = _f("share of served runs escalated")
    flaps_per_run: float | None = _f("simulator: switches of tier or replica per run")


class SimInfo(SimSettings):
    """The simulated deployment of a set: :class:`SimSettings` plus what was derived from it."""

    node_profile: str = _f("the local node profile the step times come from (`router.sim.profiles`)")
    arrivals: str = _f("the arrival process, in words")


class EscalationScores(_Card):
    """The escalation model's figures on labelled steps."""

    auc: float | None = _f("ROC AUC (null with one class only)")
    pr_auc: float | None = _f("average precision (null with one class only)")
    brier: float | None = _f("Brier score")
    ece: float | None = _f("expected calibration error (10 bins)")
    n: float = _f("labelled steps")
    pos_rate: float | None = _f("share of positive (needs-frontier) steps")


class CacheScores(_Card):
    mae_tokens: float = _f("mean absolute error of the predicted cached prompt tokens")


class RemainingScores(_Card):
    pinball_p50: float = _f("pinball loss of the p50 remaining-steps prediction")
    pinball_p90: float = _f("pinball loss of the p90 remaining-steps prediction")


class ModelScores(_Card):
    """The bundle's predictors scored on a held-out set (`training.evaluate.bundle_scores`)."""

    ONLY_WHEN_SET = frozenset({"escalation", "cache_reuse", "remaining_steps"})

    n_steps: int = _f("steps of the set")
    escalation: EscalationScores | None = _f("escalation model (absent without labelled steps)", default=None)
    cache_reuse: CacheScores | None = _f("cache-reuse model (absent without cache labels)", default=None)
    remaining_steps: RemainingScores | None = _f("remaining-steps model", default=None)


class SetResult(_Card):
    """Every policy on one held-out workload."""

    ONLY_WHEN_SET = frozenset({"model_scores"})

    n_runs: int = _f("runs with steps in the set")
    n_steps: int = _f("steps in the set")
    n_quality_runs: int = _f("runs with both outcomes known")
    n_needs_frontier: int = _f("runs labelled needs-frontier")
    policies: list[PolicyRow] = _f("one row per policy, in the order of every table")
    sweeps: dict[str, list[SweepPoint]] = _f("threshold sweep of each swept policy", each="policy")
    sim: SimInfo = _f("the simulated deployment")
    model_scores: ModelScores | Skipped | None = _f(
        "demo and `runroute bench`: the bundle's predictors scored on this set, or `skipped` with the reason",
        default=None,
    )


# ------------------------------------------------------------------------------- live segment


class LiveFigures(_Card):
    """One policy through the real sidecar with fake backends (measured, not simulated)."""

    runs: int = _f("runs that sent at least one step")
    steps: int = _f("steps answered 200")
    errors: int = _f("steps answered with another status")
    step_latency_s_p50: float | None = _f("median measured step latency (s)")
    step_latency_s_p95: float | None = _f("p95 measured step latency (s)")
    short_step_latency_s_p95: float | None = _f("p95 of short steps (<= 64 output tokens or a tool call)")
    long_step_latency_s_p95: float | None = _f("p95 of the other steps")
    cache_hit_rate: float | None = _f(
        "cached / prompt tokens reported by the fake vLLM, local steps from the 2nd on"
    )
    cache_hit_upper_bound: float | None = _f(
        "the run's previous prompt + output (capped) / prompt tokens, same steps"
    )
    escalation_rate: float | None = _f("runs with any step the sidecar sent to the frontier")
    flaps_per_run: float | None = _f("switches of tier or replica per run")
    reasons: dict[str, int] = _f("decision reasons (`x-runroute-reason`) and their counts")


class LiveSegment(_Card):
    """The live sidecar segment: a few held-out runs per policy through ``create_app`` under uvicorn."""

    policies: dict[str, LiveFigures | Skipped] = _f(
        "measured figures per policy (the oracle is never run live), or `skipped`", each="policy"
    )
    runs: list[str] = _f("run ids driven (the same for every policy)")
    wall_s: float = _f("wall seconds of the whole segment")
    backends: dict[str, dict[str, Any]] = _f("knobs of the fake vLLM replicas and the fake frontier")
    settings: LiveSettings = _f("the live segment's settings")
    driver_errors: list[str] = _f("exceptions of the agent driver, one line each (none expected)")


# ------------------------------------------------------------------------------- demo context


class PriceTable(_Card):
    """Every price the outcome model used (`training.eval.outcome.Prices.table`)."""

    frontier_in_per_m: float = _f("frontier input, USD per 1M tokens")
    frontier_cached_in_per_m: float = _f("frontier cached input, USD per 1M tokens")
    frontier_out_per_m: float = _f("frontier output, USD per 1M tokens")
    gpu_hour_usd: float = _f("local GPU, USD per GPU-hour")
    local_prefill_tokens_per_s: float = _f("sustained uncached prompt tokens/s per GPU")
    local_decode_tokens_per_s: float = _f("sustained output tokens/s per GPU")
    local_in_per_m: float = _f(
        "derived: local uncached input, USD per 1M tokens (cached local prefix is free)"
    )
    local_out_per_m: float = _f("derived: local output, USD per 1M tokens")


class SyntheticSet(_Card):
    runs: int = _f("runs generated")
    seed: int = _f("generator seed")


class Split(_Card):
    """Exactly what was held out and what trained (demo)."""

    method: str = _f("how the split was made")
    seed: int = _f("seed of the task permutation")
    tau2_heldout_tasks: list[str] = _f("held-out tau2 airline task ids")
    tau2_train_tasks: list[str] = _f("tau2 airline task ids left for training")
    tau2_heldout_runs: int = _f("paired gpt-oss-120b runs of the held-out tasks")
    tau2_heldout_runs_without_steps: int = _f("of those, runs with no step record (cannot be replayed)")
    excluded_from_training_runs: int = _f("runs of held-out task ids, of any source, kept out of training")
    excluded_from_training_by_source: dict[str, int] = _f("the same, per source")
    synthetic_heldout: SyntheticSet = _f("the synthetic held-out workload")
    synthetic_train: SyntheticSet = _f("the synthetic runs added to training")
    training_runs: int = _f("runs in the training set")
    training_steps: int = _f("steps in the training set")
    training_runs_by_source: dict[str, int] = _f("training runs per source")


class TrainingInfo(_Card):
    """The bundle the policies ran with."""

    ONLY_WHEN_SET = frozenset(
        {
            "thresholds_report",
            "timings",
            "mlflow",
            "tracking_uri",
            "n_steps",
            "n_escalation_runs",
            "escalation",
            "sweep_thresholds",
        }
    )

    bundle_dir: str = _f("bundle directory")
    bundle_version: str = _f("bundle version (content hash)")
    thresholds: dict[str, float] = _f(
        "the bundle's calibrated thresholds (`p_frontier_up` / `p_frontier_down`)"
    )
    thresholds_report: dict[str, Any] | None = _f(
        "demo: training's threshold report (`target_frontier_share` they were calibrated for, ...)",
        default=None,
    )
    timings: dict[str, Any] | None = _f("demo: training's wall seconds per stage", default=None)
    mlflow: dict[str, str] | None = _f(
        "demo: MLflow run id, registered model version and URI, champion (empty without MLflow)", default=None
    )
    tracking_uri: str | None = _f("demo: MLflow tracking URI (null without MLflow)", default=None)
    n_steps: int | None = _f("demo: training steps", default=None)
    n_escalation_runs: int | None = _f("demo: training runs with a needs-frontier label", default=None)
    escalation: dict[str, Any] | None = _f("demo: training's escalation-model figures", default=None)
    sweep_thresholds: list[float] | None = _f(
        "demo: the sweep grid: fixed points plus quantiles of the training runs' max P(frontier), never "
        "held-out data",
        default=None,
    )


class RunLevelPair(_Card):
    """Paired runs without step records: the bounds a router has (no policy can be replayed on them)."""

    runs: int = _f("paired runs")
    always_local_success: float = _f("the weak model's success rate")
    always_frontier_success: float = _f("the strong model's success rate")
    oracle_success: float = _f(
        "success when exactly the runs the weak model fails and the strong one solves escalate"
    )
    oracle_escalation_rate: float = _f("the oracle's escalation rate")


class Scorecard(_Card):
    """``scorecard.json``: written by ``runroute demo`` and ``runroute bench --json``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ONLY_WHEN_SET = frozenset({"split", "run_level_pairs", "import_summary", "config", "bad_rows"})

    schema_: Literal["runroute-scorecard/1"] = Field(
        default=SCHEMA, alias="schema", description="schema name and version"
    )
    generated_at: str = _f("UTC time the scorecard was written (ISO 8601)")
    command: str = _f("`runroute demo` or `runroute bench`")
    prices: PriceTable = _f("the price assumptions")
    outcome_variants: list[str] = _f("outcome-model variants evaluated; the first is the headline")
    split: Split | None = _f("demo: exactly what was held out and what trained", default=None)
    training: TrainingInfo = _f("the bundle the policies ran with")
    sets: dict[str, SetResult] = _f("one held-out workload each", each="set")
    live: LiveSegment | Skipped = _f("the live sidecar segment, or `skipped` with the reason")
    run_level_pairs: dict[str, RunLevelPair] | None = _f(
        "demo: paired runs without step records (SWE-bench Pro), per (source: weak vs strong)",
        each="pair",
        default=None,
    )
    import_summary: dict[str, Any] | None = _f(
        "demo: the per-source summary of the shipped samples (`features.importers.summary`)", default=None
    )
    config: dict[str, Any] | None = _f("demo: every knob of the run (`DemoConfig`)", default=None)
    bad_rows: int | None = _f("bench: run-log rows that failed validation (reported, not used)", default=None)
    timings: dict[str, float] = _f("wall seconds per stage and `total_s`")

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object written to ``scorecard.json`` (plain types; NaN -> null)."""
        out = jsonable(self.model_dump(by_alias=True))
        assert isinstance(out, dict)
        return out
