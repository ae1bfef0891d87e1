"""The step hook's pre-bound series (``router.server.metrics.registry``: ``adder``, ``observer``,
``_StepSeries``) give what the library's own calls give: the same samples, in the same order, the
same refusals."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from router.policy.types import BackendState
from router.server.metrics.registry import RouterMetrics, adder, observer
from router.server.metrics.specs import LATENCY_BUCKETS

EDGES = [0.0, -1.0, 0.005, 0.0050000001, 0.3, 1, 120, 121.5, math.inf, math.nan, 1e-300, *LATENCY_BUCKETS]


def _samples(reg: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for fam in reg.collect():
        for s in fam.samples:
            if not s.name.endswith("_created"):
                v = "nan" if s.value != s.value else s.value
                out.append((s.name, s.labels, v))
    return out


def test_observer_matches_histogram_observe() -> None:
    regs = [CollectorRegistry(), CollectorRegistry()]
    hs = [Histogram("lat_seconds", "h", ["tier"], registry=r, buckets=LATENCY_BUCKETS) for r in regs]
    lib, fast = hs[0].labels("local"), observer(hs[1].labels("local"))
    for x in EDGES:
        lib.observe(x)
        fast(x)
    assert _samples(regs[0]) == _samples(regs[1])


def test_adder_matches_counter_inc_and_refuses_negative() -> None:
    regs = [CollectorRegistry(), CollectorRegistry()]
    cs = [Counter("toks", "c", ["tier"], registry=r) for r in regs]
    lib, fast = cs[0].labels("local"), adder(cs[1].labels("local"))
    for x in (0, 1, 2.5, 1e9, 0.1, 0.2):
        lib.inc(x)
        fast(x)
    assert _samples(regs[0]) == _samples(regs[1])
    with pytest.raises(ValueError):
        fast(-1)
    assert _samples(regs[0]) == _samples(regs[1])  # a refused amount adds nothing


def _rec(**kw):
    base = dict(
        tier="local",
        error_code=None,
        protocol="chat",
        status=200,
        ttft_s=None,
        latency_s=0.04,
        prompt_tokens=5000,
        cached_tokens=4000,
        completion_tokens=16,
        model="m",
        replica="r0",
        tool_calls=(),
        structured=False,
        step=3,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def _reference(m: RouterMetrics, rec, prev_tokens: int, state) -> None:
    """The hook as written with the library's calls (the code before the pre-bound series)."""
    from router.core.accounting import backend_step_usd
    from router.core.figures import is_short, upper_bound_tokens
    from router.server.metrics.specs import CHAT_HANDLER, HANDLERS

    tier = rec.tier or "none"
    c = m.child
    if rec.error_code != "no_healthy_backend":
        c(m.requests, HANDLERS.get(rec.protocol or "chat", CHAT_HANDLER), tier, str(rec.status)).inc()
    if rec.ttft_s is not None:
        c(m.ttft, tier).observe(rec.ttft_s)
    if rec.status != 200:
        return
    latency, prompt, cached = rec.latency_s or 0.0, rec.prompt_tokens, rec.cached_tokens or 0
    out, model, backend = rec.completion_tokens, rec.model or "", rec.replica or ""
    short = is_short(out, bool(rec.tool_calls), bool(rec.structured), m.short_step_tokens)
    c(m.step_latency, tier, "short" if short else "long").observe(latency)
    c(m.slo_steps, "yes" if latency <= m.step_slo_s else "no").inc()
    c(m.prompt_tokens, tier, model).inc(prompt)
    c(m.output_tokens, tier, model).inc(out)
    if cached:
        c(m.cached_tokens, tier, backend).inc(cached)
    if rec.step > 0:
        c(m.xturn_prompt, tier, backend).inc(prompt)
        c(m.xturn_cached, tier, backend).inc(cached)
        c(m.xturn_bound, tier, backend).inc(upper_bound_tokens(prev_tokens, prompt))
    if state is not None:
        usd = backend_step_usd(state, prompt, cached, out)
        if usd > 0:
            c(m.spend, tier, model).inc(usd)


def test_step_finished_matches_the_library_calls() -> None:
    local = BackendState(name="r0", tier="local", model="m", gpu_usd_per_hour=1.5)
    front = BackendState(name="f", tier="frontier", model="fm", price_in_per_m=3.0, price_out_per_m=15.0)
    recs = [
        (_rec(), 4000, local),
        (_rec(step=0, cached_tokens=None, ttft_s=0.01), 0, local),
        (_rec(tier="frontier", replica="f", model="fm", latency_s=7.5, completion_tokens=900), 10, front),
        (_rec(status=502, error_code="upstream_error"), 0, local),
        (_rec(status=503, error_code="no_healthy_backend", tier=None, replica=None, model=None), 0, None),
        (_rec(protocol="messages", tool_calls=("f",), latency_s=math.nan), 3, local),
        (_rec(protocol="responses", status=499, error_code="client_cancelled", ttft_s=0.2), 0, front),
        (_rec(), 4000, local),
    ]
    ms = [RouterMetrics(), RouterMetrics()]
    for rec, prev, st in recs:
        _reference(ms[0], rec, prev, st)
        ms[1].step_finished(rec, prev, st)
    assert _samples(ms[0].registry) == _samples(ms[1].registry)
    assert ms[0].render()[0] == ms[1].render()[0]
