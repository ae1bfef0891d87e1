"""The run log: the contract between the router, training and the simulator.

A run log is one table of *records*. Each row has a ``record`` kind:

- ``run``: one agent run (run_id, source, task, model, outcome, reward, labels known afterwards).
- ``step``: one generation of a run (tokens, tool calls and results, pause, tier, latency,
  features/predictions/decision when the router wrote it).
- ``arrival``: one request arrival with no run structure (Azure traces): time and token counts.
- ``rate``: one window of an arrival-rate trace (ServeGen): start, length, rate, cv.

Parquet is the storage format (one file, one table, columns are the union of the record kinds,
null where a kind does not use them). JSONL (one record per line) is accepted on input and output.

Every row carries ``schema_version``. Reading a file whose version is newer than
:data:`SCHEMA_VERSION` fails with :class:`SchemaVersionError`.

No prompt text is stored unless the writer is configured to (``prompt_text``, null by default).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "SCHEMA_VERSION",
    "Run",
    "Step",
    "Arrival",
    "RateWindow",
    "Record",
    "RECORD_MODELS",
    "ARROW_SCHEMA",
    "COLUMNS",
    "SchemaVersionError",
]

SCHEMA_VERSION = 1

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]


class SchemaVersionError(ValueError):
    """A file was written by a newer/unknown run-log schema version."""


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)
    schema_version: int = SCHEMA_VERSION


class Run(_Base):
    """One agent run. ``outcome``/``reward``/labels are known only after the run ends."""

    record: Literal["run"] = "run"
    run_id: str = Field(min_length=1)
    source: str
    task_id: str | None = None
    model: str | None = None
    agent: str | None = None
    tenant: str | None = None
    started_at: float | None = None  # seconds (epoch or trace-relative; consistent per file)
    ended_at: float | None = None
    outcome: Literal["success", "failure", "unknown"] = "unknown"
    reward: float | None = None
    # Labels known after the fact, e.g. from weak-vs-strong pairing on the same task.
    needs_frontier: bool | None = None
    pair_label: Literal["needs_frontier", "both_fail", "weak_ok", "both_ok"] | None = None
    strong_model: str | None = None
    strong_outcome: Literal["success", "failure", "unknown"] | None = None
    n_steps: NonNegInt | None = None
    # why the run ended: "client" (the client ended it), "idle" (no step for identity.idle_end_s)
    end_reason: str | None = None
    task_embedding: list[float] | None = None
    # (task_embedding: the features.embed vector, EMBED_DIM floats, of the run's first user message;
    # never the text.) domain: the run's domain (router logs: resolved at its first step, see
    # router.server.runs.context; importers: the benchmark's); training and replay give both to RunPrefix
    domain: str | None = None
    # every signal posted on the run (POST /v1/runs/{id}/signal), oldest first, incl. those after its
    # last step (a verifier that failed the finished run); the steps' ``signals`` say when they came
    signals: list[str] | None = None

    @model_validator(mode="after")
    def _check_times(self) -> Run:
        if self.started_at is not None and self.ended_at is not None and self.ended_at < self.started_at:
            raise ValueError("ended_at is before started_at")
        return self


class Step(_Base):
    """One generation (LLM call) of a run."""

    record: Literal["step"] = "step"
    run_id: str = Field(min_length=1)
    step: NonNegInt
    arrival_s: float | None = None  # seconds, same clock as Run.started_at
    tool_pause_s: NonNegFloat | None = None  # time since the previous step ended
    prompt_tokens: NonNegInt
    cached_tokens: NonNegInt | None = None  # served from a prefix cache (router logs / vLLM usage)
    prefix_reuse_tokens: NonNegInt | None = (
        None  # upper bound: prompt tokens repeating the run's earlier prefix
    )
    completion_tokens: NonNegInt
    hash_ids: list[int] | None = None  # prefix block hashes (Mooncake: 512-token blocks)
    tool_calls: list[str] = Field(default_factory=list)  # names of the tool calls this step produced
    tool_call_keys: list[str] = Field(default_factory=list)  # hash of (name, args) per call: loop signal
    tool_results_n: NonNegInt = 0  # tool results consumed by this step's prompt
    tool_result_tokens: list[int] = Field(default_factory=list)
    tool_result_errors: list[bool] = Field(default_factory=list)
    structured: bool | None = None  # output is a tool call / JSON
    tier: Literal["local", "frontier"] | None = None
    replica: str | None = None
    model: str | None = None
    ttft_s: NonNegFloat | None = None
    latency_s: NonNegFloat | None = None
    status: int | None = None
    error_code: str | None = None
    feature_spec_version: str | None = None
    features: list[float] | None = None
    predictions: dict[str, float] | None = None
    decision: str | None = None
    reason: str | None = None
    # the request fields the features read (router logs; null for imported traces)
    prompt_tokens_est: NonNegInt | None = None  # the router's estimate before generation (features.tokens)
    n_tools_offered: NonNegInt | None = None
    wants_json: bool | None = None
    protocol: Literal["chat", "responses", "messages"] | None = None
    admission: str | None = None  # first-step admission verdict: admit-local | spill | reject | frontier
    # the logging policy's probability of the decision taken (1.0 = deterministic) and whether it explored
    propensity: float | None = Field(default=None, ge=0.0, le=1.0)
    explore: bool | None = None
    # signals (kinds) posted on the run since its previous step: what this step's features saw new
    signals: list[str] | None = None
    # a local step's token uncertainty, when the router asked vLLM for logprobs
    # (router.server.hotpath.posthoc.uncertainty): tokens, mean_nll, max_nll (nats per token)
    answer_uncertainty: dict[str, float] | None = None
    prompt_text: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Step:
        if self.cached_tokens is not None and self.cached_tokens > self.prompt_tokens:
            raise ValueError(f"cached_tokens ({self.cached_tokens}) > prompt_tokens ({self.prompt_tokens})")
        if self.prefix_reuse_tokens is not None and self.prefix_reuse_tokens > self.prompt_tokens:
            raise ValueError("prefix_reuse_tokens > prompt_tokens")
        if len(self.tool_result_errors) not in (0, self.tool_results_n):
            raise ValueError("tool_result_errors length differs from tool_results_n")
        if any(t < 0 for t in self.tool_result_tokens):
            raise ValueError("tool_result_tokens must be >= 0")
        return self


class Arrival(_Base):
    """One request arrival without run structure (e.g. Azure LLM inference trace)."""

    record: Literal["arrival"] = "arrival"
    source: str
    arrival_s: float
    prompt_tokens: NonNegInt | None = None
    completion_tokens: NonNegInt | None = None


class RateWindow(_Base):
    """A window of an arrival-rate trace (ServeGen): requests/s over [start_s, start_s+duration_s)."""

    record: Literal["rate"] = "rate"
    source: str
    client: str | None = None
    start_s: float
    duration_s: float = Field(gt=0)
    rate: NonNegFloat
    cv: NonNegFloat | None = None


Record = Annotated[Run | Step | Arrival | RateWindow, Field(discriminator="record")]
RECORD_MODELS: dict[str, type[_Base]] = {"run": Run, "step": Step, "arrival": Arrival, "rate": RateWindow}

# One Arrow schema: the union of all record kinds' fields (nullable where a kind does not use them).
ARROW_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("record", pa.string()),
        ("run_id", pa.string()),
        ("source", pa.string()),
        ("task_id", pa.string()),
        ("model", pa.string()),
        ("agent", pa.string()),
        ("tenant", pa.string()),
        ("started_at", pa.float64()),
        ("ended_at", pa.float64()),
        ("outcome", pa.string()),
        ("reward", pa.float64()),
        ("needs_frontier", pa.bool_()),
        ("pair_label", pa.string()),
        ("strong_model", pa.string()),
        ("strong_outcome", pa.string()),
        ("n_steps", pa.int64()),
        ("end_reason", pa.string()),
        ("task_embedding", pa.list_(pa.float32())),
        ("domain", pa.string()),
        ("signals", pa.list_(pa.string())),
        ("answer_uncertainty", pa.map_(pa.string(), pa.float64())),
        ("step", pa.int64()),
        ("arrival_s", pa.float64()),
        ("tool_pause_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("prefix_reuse_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("hash_ids", pa.list_(pa.int64())),
        ("tool_calls", pa.list_(pa.string())),
        ("tool_call_keys", pa.list_(pa.string())),
        ("tool_results_n", pa.int64()),
        ("tool_result_tokens", pa.list_(pa.int64())),
        ("tool_result_errors", pa.list_(pa.bool_())),
        ("structured", pa.bool_()),
        ("tier", pa.string()),
        ("replica", pa.string()),
        ("ttft_s", pa.float64()),
        ("latency_s", pa.float64()),
        ("status", pa.int64()),
        ("error_code", pa.string()),
        ("feature_spec_version", pa.string()),
        ("features", pa.list_(pa.float64())),
        ("predictions", pa.map_(pa.string(), pa.float64())),
        ("decision", pa.string()),
        ("reason", pa.string()),
        ("prompt_tokens_est", pa.int64()),
        ("n_tools_offered", pa.int64()),
        ("wants_json", pa.bool_()),
        ("protocol", pa.string()),
        ("admission", pa.string()),
        ("propensity", pa.float64()),
        ("explore", pa.bool_()),
        ("prompt_text", pa.string()),
        ("client", pa.string()),
        ("start_s", pa.float64()),
        ("duration_s", pa.float64()),
        ("rate", pa.float64()),
        ("cv", pa.float64()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)

# Every pydantic field must have a column (checked at import so the two never drift apart).
for _kind, _model in RECORD_MODELS.items():
    _missing = set(_model.model_fields) - set(COLUMNS)
    if _missing:  # pragma: no cover - a programming error caught by any import
        raise RuntimeError(f"run-log schema: {_kind} fields without Arrow column: {sorted(_missing)}")
