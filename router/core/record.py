"""What the step engine hands back: the step's facts, its run-log record and its summary entry.

:class:`StepRequest` is the protocol-independent view of an arriving step that an adapter extracts
(the sidecar from a request body, the simulator and replay from a logged step); :class:`StepResult`
is what the adapter observed when the step ended. :func:`step_record` builds the run-log
:class:`features.schema.Step` for a finished step (``Step.model_construct``'s result, built
without its per-field alias checks: the engine's own values need no re-validation on the hot path;
a test validates them against the model), and
:func:`step_entry` the short summary kept per run for ``GET /v1/runs/{id}``.

A logged step (a row of a run log's steps frame, as :func:`features.logged.steps_columns` lists
it) becomes engine input through one converter, :func:`logged_request` (replay, off-policy replay):
the prompt tokens the router saw (its logged estimate ``prompt_tokens_est`` when present, else the
logged count), the tool results it consumed, tools offered and JSON wanted (0 / False when the
source did not log them), the signals new at the step, and the run's ``needs_frontier`` label (the
oracle's). :func:`logged_result` is the logged outcome as a :class:`StepResult`, with the cached
tokens the caller's world gives. Missing cells (None, NaN, pd.NA) are read with the one helper,
:func:`features.logged.opt`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from features.logged import opt, opt_int, signals_of
from features.prefix import RunPrefix, StepView
from features.schema import Step
from router.core.prefix_index import Segments

__all__ = [
    "StepRequest",
    "StepResult",
    "step_record",
    "step_entry",
    "LazyFeatures",
    "logged_request",
    "logged_result",
    "logged_end",
]


@dataclass(slots=True)
class StepRequest:
    """An arriving step as the engine sees it (no protocol, no prompt text)."""

    prompt_tokens: int  # logged count (simulator, replay) or the estimate (sidecar)
    tool_results_n: int = 0
    tool_result_errors: tuple[bool, ...] = ()
    tool_result_tokens: tuple[int, ...] = ()
    n_tools_offered: int = 0
    wants_json: bool = False
    requested_model: str | None = None  # a concrete model named by the client
    priority: str = "interactive"
    tenant: str | None = None
    label_needs_frontier: bool | None = None  # evaluation only (the oracle)
    protocol: str = "chat"
    estimated: bool = False  # prompt_tokens is the router's estimate (the upstream will count)
    # signal kinds posted on the run since its previous step (sidecar: from the run-state store;
    # simulator / replay: the logged Step.signals); the engine adds them to the run's track
    signals: tuple[str, ...] = ()
    # the prompt's block chain for the prefix index (router.core.prefix_index; None: no index
    # lookup): ``chain[:chain_lookup]`` lie inside the prompt, the replica holds
    # ``chain[:chain_hold]`` after the step (None: all of it)
    chain: Sequence[int] | None = None
    chain_lookup: int = 0
    chain_hold: int | None = None
    # the prompt as text segments (one per message; the sidecar's lazy view of the body): the
    # engine's TextChainer turns them into ``chain`` incrementally per run (no text is kept)
    segments: Segments | None = None

    @property
    def spill_ok(self) -> bool:
        """A run whose client named a concrete model is rejected rather than moved elsewhere."""
        return self.requested_model is None


@dataclass(slots=True)
class StepResult:
    """What the adapter observed when the step ended."""

    status: int
    error_code: str | None = None
    prompt_tokens: int | None = None  # the upstream's count (None: keep the request's)
    cached_tokens: int | None = None
    completion_tokens: int = 0
    tool_calls: tuple[str, ...] = ()
    tool_call_keys: tuple[str, ...] = ()
    ttft_s: float | None = None
    latency_s: float | None = None
    structured: bool | None = None  # None: produced tool calls, or the request wanted JSON


class LazyFeatures(Mapping[str, float]):
    """The snapshot's named features, built on first read: from the vector the predictor saw, or
    (when nothing extracted one) by extracting the prefix then.

    Policies that never read ``snapshot.features`` cost nothing for them; one that does gets
    exactly what the predictor saw (or would have).
    """

    __slots__ = ("_vec", "_prefix", "_d")

    def __init__(self, vec: np.ndarray | None, prefix: RunPrefix | None = None):
        self._vec = vec
        self._prefix = prefix
        self._d: dict[str, float] | None = None

    def _get(self) -> dict[str, float]:
        if self._d is None:
            from features.extract import FEATURE_NAMES, extract
            from features.prefix import POSTHOC_KINDS

            if self._vec is not None:
                vec = self._vec
            else:
                assert self._prefix is not None, "LazyFeatures needs a vector or a prefix"
                vec = extract(self._prefix)
            d = dict(zip(FEATURE_NAMES, vec.tolist(), strict=True))
            # the sidecar's own post-hoc kinds (features.prefix.POSTHOC_KINDS) count as sig_other
            # in the vector; each is named here too, so the trouble term can weigh it alone
            sig = getattr(self._prefix, "signals", ()) or ()
            for kind in POSTHOC_KINDS:
                d[f"sig_{kind}"] = float(sig.count(kind))
            self._d = d
        return self._d

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def logged_request(
    cols: Mapping[str, Sequence[object]],
    i: int,
    view: StepView,
    *,
    label: bool | None = None,
) -> StepRequest:
    """Logged row ``i`` (``view``: its :func:`features.logged.step_views`) as the engine's input
    (module docstring)."""
    seen = opt_int(cols["prompt_tokens_est"][i])
    return StepRequest(
        prompt_tokens=view.prompt_tokens if seen is None else seen,
        tool_results_n=view.tool_results_n,
        tool_result_errors=view.tool_result_errors,
        tool_result_tokens=view.tool_result_tokens,
        n_tools_offered=opt_int(cols["n_tools_offered"][i]) or 0,
        wants_json=bool(opt(cols["wants_json"][i]) or False),
        label_needs_frontier=label,
        signals=signals_of(cols["signals"][i]),
    )


def logged_result(view: StepView, cached_tokens: int | None) -> StepResult:
    """A logged step's outcome (served, its tokens, tool calls and latency) as a :class:`StepResult`;
    ``cached_tokens``: what the caller's world cached of its prompt."""
    return StepResult(
        status=200,
        prompt_tokens=view.prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=view.completion_tokens,
        tool_calls=view.tool_calls,
        tool_call_keys=view.tool_call_keys,
        latency_s=view.latency_s,
        structured=view.structured,
    )


def logged_end(view: StepView) -> float | None:
    """When a logged step ended: its arrival + latency (its arrival when the latency is unknown)."""
    a, lat = view.arrival_s, view.latency_s
    return a + lat if a is not None and lat is not None else a


def step_record(
    *,
    run_id: str,
    step: int,
    arrival_s: float | None,
    tool_pause_s: float | None,
    req: StepRequest,
    prompt_tokens: int,
    cached_tokens: int | None,
    res: StepResult,
    structured: bool,
    tier: str | None,
    replica: str | None,
    model: str | None,
    spec_version: str,
    features: list[float] | None,
    predictions: dict[str, float],
    decision: str | None,
    reason: str,
    admission: str | None,
    propensity: float,
    explore: bool,
) -> Step:
    """The run-log record of one finished step (fields as in :class:`features.schema.Step`)."""
    return _construct_step(
        run_id=run_id,
        step=step,
        arrival_s=arrival_s,
        tool_pause_s=tool_pause_s,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=res.completion_tokens,
        tool_calls=list(res.tool_calls),
        tool_call_keys=list(res.tool_call_keys),
        tool_results_n=req.tool_results_n,
        tool_result_tokens=list(req.tool_result_tokens),
        tool_result_errors=list(req.tool_result_errors),
        structured=structured,
        tier=tier,
        replica=replica,
        model=model,
        ttft_s=res.ttft_s,
        latency_s=res.latency_s,
        status=res.status,
        error_code=res.error_code,
        feature_spec_version=spec_version,
        features=features,
        predictions=predictions,
        decision=decision,
        reason=reason,
        prompt_tokens_est=req.prompt_tokens if req.estimated else None,
        n_tools_offered=req.n_tools_offered,
        wants_json=req.wants_json,
        protocol=req.protocol,
        admission=admission,
        propensity=propensity,
        explore=explore,
        signals=list(req.signals) if req.signals else None,
    )


_IMMUTABLE = (type(None), str, int, float, bool, tuple, frozenset)


def _step_layout() -> tuple[tuple[str, ...], frozenset[str], frozenset[str], dict[str, Any]]:
    """``Step``'s fields in order, their names, the required ones, and the defaults that can be
    shared (immutable); every other default is made per record, as ``model_construct`` makes it."""
    fields = Step.model_fields
    if Step.__pydantic_post_init__ is not None or any(  # what _construct_step does not reproduce
        f.alias is not None
        or f.validation_alias is not None
        or (f.default_factory is not None and f.default_factory_takes_validated_data)
        for f in fields.values()
    ):
        raise RuntimeError("features.schema.Step changed shape: record.step_record must use model_construct")
    shared = {
        n: f.default
        for n, f in fields.items()
        if not f.is_required() and f.default_factory is None and isinstance(f.default, _IMMUTABLE)
    }
    required = frozenset(n for n, f in fields.items() if f.is_required())
    return tuple(fields), frozenset(fields), required, shared


_STEP_ORDER, _STEP_NAMES, _STEP_REQUIRED, _STEP_SHARED = _step_layout()
_setattr = object.__setattr__


_Layout = tuple[frozenset[str], tuple[str, ...], dict[str, Any], tuple[str, ...]]
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}  # by the names given, in their order (a few: one per caller)


def _layout_of(names: tuple[str, ...]) -> _Layout:
    """For the names a record is built with: the fields among them, the names to drop again
    (not fields; required fields not given), the shared defaults of the fields not given and
    the fields whose default is made per record."""
    given = frozenset(names) & _STEP_NAMES
    drop = tuple(n for n in names if n not in _STEP_NAMES)
    drop += tuple(n for n in _STEP_ORDER if n not in given and n in _STEP_REQUIRED)
    shared = {n: _STEP_SHARED[n] for n in _STEP_ORDER if n not in given and n in _STEP_SHARED}
    made = tuple(
        n for n in _STEP_ORDER if n not in given and n not in _STEP_SHARED and n not in _STEP_REQUIRED
    )
    return given, drop, shared, made


def _construct_step(**values: Any) -> Step:
    """``Step.model_construct(**values)`` without its per-field loop of alias checks: the same
    ``__dict__`` in the same (field) order, the same fields set, unknown names dropped as it drops
    them; the work that depends only on which names are given is done once per set of names
    (:func:`_layout_of`). Several times cheaper, and every step builds one.
    ``tests/test_hotpath_cost.py`` compares them."""
    names = tuple(values)
    lay = _LAYOUTS.get(names)
    if lay is None:
        lay = _layout_of(names)
        if len(_LAYOUTS) < 64:
            _LAYOUTS[names] = lay
    given, drop, shared, made = lay
    d: dict[str, Any] = dict.fromkeys(_STEP_ORDER)  # the field order; then the given values
    d.update(values)
    for n in drop:
        del d[n]
    if shared:
        d.update(shared)
    for n in made:
        d[n] = Step.model_fields[n].get_default(call_default_factory=True)
    m = Step.__new__(Step)
    _setattr(m, "__dict__", d)
    _setattr(m, "__pydantic_fields_set__", set(given))
    _setattr(m, "__pydantic_extra__", None)
    _setattr(m, "__pydantic_private__", None)
    return m


def step_entry(rec: Step, fallback_from: str | None, switched: bool) -> dict[str, Any]:
    """The short per-step summary of ``GET /v1/runs/{id}``."""
    return {
        "step": rec.step,
        "tier": rec.tier,
        "replica": rec.replica,
        "model": rec.model,
        "reason": rec.reason,
        "switched": switched,
        "fallback_from": fallback_from,
        "admission": rec.admission,
        "predictions": rec.predictions,
        "status": rec.status,
        "error_code": rec.error_code,
        "prompt_tokens": rec.prompt_tokens,
        "cached_tokens": rec.cached_tokens,
        "completion_tokens": rec.completion_tokens,
        "tool_calls": rec.tool_calls,
        "ttft_s": rec.ttft_s,
        "latency_s": rec.latency_s,
        "arrival_s": rec.arrival_s,
    }
