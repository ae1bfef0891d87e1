"""SLOs by what a step is: targets, their measurement with an interval, and their floors.

Algorithm:

- **Targets** (:func:`parse_slo`, comma-separated ``METRIC_pQ[@CLASS]=DURATION``): ``short_p95=2s``
  (latency of short steps: <= 64 output tokens or a tool call), ``ttft_p95=500ms`` (TTFT of every served
  step), ``ttft_p95@<=8k=2s`` (TTFT of steps whose prompt has <= 8,192 tokens; ``@>32k`` longer than
  32,768; ``@8k-32k`` in (8,192, 32,768]), ``itl_p95@<=32k=60ms`` (inter-token latency, ``(latency -
  TTFT) / (output - 1)`` of steps with more than one output token), ``run_p95=600s`` (run completion
  time, tool pauses included). Any percentile ``p1``..``p99.9``; sizes ``N``, ``Nk`` (x1,024), ``Nm``.
  A class with no served step holds vacuously (reported with ``n = 0``).
- **Measurement with an interval** (:func:`measure`): each target's value on one simulation, and
  ``n_boot`` bootstrap replicates over *runs* (runs drawn with replacement, their steps weighted by the
  draw count; a run's steps stay together, so within-run correlation is kept). :func:`pool` combines
  the simulations of several arrival seeds: the value is the median over seeds, the interval the
  ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of all seeds' replicates pooled (so it holds
  the arrival-to-arrival spread and the sampling error of the percentile). A point *holds* the SLO when
  every target's **upper bound** meets it (:meth:`SLO.holds`; no interval: the value) and admission
  rejected no run.
- **Comparisons** (:func:`paired`): a speed-up or a gain between two simulations of the same runs at
  the same seeds (each :func:`measure` / :func:`measure_goodput` with ``keep_raw``: the replicates in
  draw order) is computed replicate by replicate, so its interval holds only the noise the two do not
  share; :func:`overlap` says whether two figures' intervals overlap (indistinguishable at this
  noise). :func:`measure_goodput` measures DistServe's goodput share (steps within a TTFT and a TPOT
  target) with the same run bootstrap.
- **Floors** (:func:`floors`): each target's value with no queueing at all — every step alone on one
  replica of the profile (prefill in ``token_budget`` chunks, then batch-1 decode), with a cold cache
  and with a perfect prefix cache (the run's earlier prefix, ``StepSpec.upper``, cached). No number of
  replicas gets below it; when it is above the target the SLO cannot be met on this GPU, and the floor
  names its cause (the prefill of the class's longest prompts, or batch-1 decode, or the tool pauses)
  and the levers that move it (cache hits, tensor parallelism, a faster GPU, the frontier for prompts
  above the longest one the node prefills within the target).

Knobs: ``n_boot`` (200 replicates per simulation), ``level`` (0.9, the interval's coverage),
``boot_seed`` (the replicates' seed, fixed so an answer is reproducible).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from router.core.figures import upper_bound_tokens
from router.sim.profiles import NodeProfile
from router.sim.workload import SimError, Workload

if TYPE_CHECKING:
    from router.sim.scorecard import SimResult

__all__ = [
    "Target",
    "SLO",
    "parse_slo",
    "measure",
    "measure_goodput",
    "goodput_key",
    "pool",
    "paired",
    "overlap",
    "floors",
    "floor_lines",
    "prefill_s",
    "METRICS",
]

METRICS: dict[str, str] = {
    "short": "short-step latency",
    "ttft": "TTFT",
    "itl": "inter-token latency",
    "run": "run completion time",
    "step": "step latency",
}
_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|min)?\s*$")
_KEY = re.compile(r"^(short|ttft|itl|run|step)_p([0-9]+(?:\.[0-9]+)?)(?:@(.+))?$")
_SIZE = re.compile(r"^([0-9]*\.?[0-9]+)\s*([kKmM]?)$")


def _size(text: str, part: str) -> int:
    m = _SIZE.match(text.strip())
    if m is None:
        raise SimError(f"--slo: bad prompt size {text!r} in {part!r} (e.g. 8k, 32768)")
    mult = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _fmt_tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


@dataclass(frozen=True)
class Target:
    """One SLO target: ``metric`` pQ over the steps whose prompt is in (``lo``, ``hi``] tokens."""

    metric: str
    q: float
    value_s: float
    lo: int = -1  # prompt tokens > lo
    hi: int | None = None  # prompt tokens <= hi (None: no upper bound)

    @property
    def key(self) -> str:
        q = f"{self.q:g}"
        if self.lo < 0 and self.hi is None:
            return f"{self.metric}_p{q}"
        if self.lo < 0:
            return f"{self.metric}_p{q}@<={_fmt_tokens(self.hi or 0)}"
        if self.hi is None:
            return f"{self.metric}_p{q}@>{_fmt_tokens(self.lo)}"
        return f"{self.metric}_p{q}@{_fmt_tokens(self.lo)}-{_fmt_tokens(self.hi)}"

    def describe(self) -> str:
        cls = ""
        if self.hi is not None or self.lo >= 0:
            cls = " of prompts " + (
                f"<= {self.hi:,} tokens"
                if self.lo < 0
                else f"> {self.lo:,} tokens"
                if self.hi is None
                else f"of {self.lo + 1:,}-{self.hi:,} tokens"
            )
        return f"{METRICS[self.metric]} p{self.q:g}{cls} <= {self.value_s:g} s"

    def in_class(self, prompt: np.ndarray) -> np.ndarray:
        m = prompt > self.lo
        if self.hi is not None:
            m &= prompt <= self.hi
        return m


@dataclass(frozen=True)
class SLO:
    """Targets (module docstring). ``short_p95_s`` / ``ttft_p95_s`` are the two classic ones."""

    short_p95_s: float | None = None
    ttft_p95_s: float | None = None
    targets: tuple[Target, ...] = field(default=())

    def all_targets(self) -> tuple[Target, ...]:
        out = []
        if self.short_p95_s is not None:
            out.append(Target("short", 95.0, self.short_p95_s))
        if self.ttft_p95_s is not None:
            out.append(Target("ttft", 95.0, self.ttft_p95_s))
        keys = {t.key for t in out}
        return (*out, *(t for t in self.targets if t.key not in keys))

    def values(self, card: dict[str, Any], details: dict[str, Any] | None) -> dict[str, float | None]:
        """Each target's value to judge: the interval's upper bound when measured, else the scorecard's."""
        meas = (details or {}).get("slo") or {}
        out: dict[str, float | None] = {}
        for t in self.all_targets():
            m = meas.get(t.key)
            if m is not None:
                out[t.key] = m["hi"] if m["hi"] is not None else m["value"]
            elif t.metric == "short" and t.q == 95 and t.hi is None and t.lo < 0:
                out[t.key] = card["short_step_latency_s_p95"]
            elif t.metric == "ttft" and t.q == 95 and t.hi is None and t.lo < 0:
                out[t.key] = card["ttft_s_p95"]
            else:
                out[t.key] = None
        return out

    def holds(self, card: dict[str, Any], details: dict[str, Any] | None = None) -> bool:
        unfit = (details or {}).get("runs_rejected_kv_too_small", 0)
        if card["runs_rejected"] > unfit:  # admission rejections count; a prompt no KV holds does not
            return False
        meas = (details or {}).get("slo") or {}
        vals = self.values(card, details)
        for t in self.all_targets():
            v = vals[t.key]
            if v is None:
                if meas.get(t.key, {}).get("n", 1) == 0 and t.metric != "short":
                    continue  # no step in the class: vacuous
                return False
            if v > t.value_s:
                return False
        return True

    def score(self, card: dict[str, Any], details: dict[str, Any] | None = None) -> float | None:
        """max over targets of value / target (> 1 fails): what a search watches for a plateau."""
        vals = self.values(card, details)
        r = [v / t.value_s for t in self.all_targets() if (v := vals[t.key]) is not None]
        return max(r) if r else None

    def worst(
        self, card: dict[str, Any], details: dict[str, Any] | None = None
    ) -> tuple[Target, float] | None:
        """The target furthest from holding and its value."""
        vals = self.values(card, details)
        r = [(v / t.value_s, t, v) for t in self.all_targets() if (v := vals[t.key]) is not None]
        if not r:
            return None
        _, t, v = max(r, key=lambda x: x[0])
        return t, v

    def describe(self) -> str:
        return " and ".join(t.describe() for t in self.all_targets())

    def as_dict(self) -> dict[str, Any]:
        return {
            "short_p95_s": self.short_p95_s,
            "ttft_p95_s": self.ttft_p95_s,
            "targets": {t.key: t.value_s for t in self.all_targets()},
        }


def parse_slo(text: str) -> SLO:
    """``short_p95=2s,ttft_p95@<=8k=2s,itl_p95=80ms,run_p95=10min`` (module docstring)."""
    short = ttft = None
    targets: list[Target] = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, eq, val = part.rpartition("=")
        m = _DUR.match(val)
        k = _KEY.match(key.strip()) if eq else None
        if not eq or k is None or m is None:
            raise SimError(
                "--slo: expected METRIC_pQ[@CLASS]=DURATION with METRIC short|ttft|itl|run|step and CLASS "
                f"<=8k, >32k or 8k-32k (e.g. short_p95=2s,ttft_p95@<=8k=2s,itl_p95=80ms), got {part!r}"
            )
        secs = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "min": 60.0, None: 1.0}[m.group(2)]
        if secs <= 0:
            raise SimError("--slo: targets must be > 0")
        q = float(k.group(2))
        if not 0 < q < 100:
            raise SimError(f"--slo: percentile must be in (0, 100), got {part!r}")
        lo, hi = -1, None
        cls = k.group(3)
        if cls:
            cls = cls.strip()
            if k.group(1) == "run":
                raise SimError(f"--slo: run completion has no prompt class, got {part!r}")
            if cls.startswith("<="):
                hi = _size(cls[2:], part)
            elif cls.startswith(">"):
                lo = _size(cls[1:], part)
            elif "-" in cls:
                a, _, b = cls.partition("-")
                lo, hi = _size(a, part), _size(b, part)
                if hi <= lo:
                    raise SimError(f"--slo: empty class {cls!r}")
            else:
                raise SimError(f"--slo: class must be <=N, >N or N-M (tokens), got {cls!r}")
        t = Target(k.group(1), q, secs, lo, hi)
        if t.key == "short_p95":
            short = secs
        elif t.key == "ttft_p95":
            ttft = secs
        else:
            targets.append(t)
    if short is None and ttft is None and not targets:
        raise SimError("--slo: name at least one target (short_p95=..., ttft_p95@<=8k=..., run_p95=...)")
    return SLO(short, ttft, tuple(targets))


# ------------------------------------------------------------------------------------------ measure
def _weighted_quantiles(v: np.ndarray, runs: np.ndarray, w: np.ndarray, q: float) -> np.ndarray:
    """The q-th percentile of ``v`` under each row of run weights ``w`` (B x n_runs): nearest rank."""
    order = np.argsort(v, kind="stable")
    vs, rs = v[order], runs[order]
    cw = np.cumsum(w[:, rs], axis=1)  # B x n
    tot = cw[:, -1]
    out = np.full(len(w), np.nan)
    ok = tot > 0
    idx = np.array([np.searchsorted(cw[i], q / 100.0 * tot[i]) for i in np.flatnonzero(ok)], dtype=int)
    out[ok] = vs[np.minimum(idx, len(vs) - 1)]
    return out


def _metric_arrays(res: SimResult, t: Target) -> tuple[np.ndarray, np.ndarray]:
    """(values, run of each value) of target ``t`` over one :class:`~router.sim.scorecard.SimResult`."""
    from router.sim.scorecard import SERVED_FRONTIER, SERVED_LOCAL, SPILLED

    oc = res.outcome
    served = (oc == SERVED_LOCAL) | (oc == SERVED_FRONTIER) | (oc == SPILLED)
    if t.metric == "run":
        done = ~np.isnan(res.run_completion_s)
        return res.run_completion_s[done], np.flatnonzero(done)
    m = served & t.in_class(res.prompt)
    if t.metric == "short":
        m &= res.short
        return res.latency[m], res.run_of_step[m]
    if t.metric == "step":
        return res.latency[m], res.run_of_step[m]
    if t.metric == "ttft":
        return res.ttft[m], res.run_of_step[m]
    comp = res.completion if res.completion is not None else np.ones_like(res.prompt)
    m &= comp > 1
    itl = (res.latency[m] - res.ttft[m]) / (comp[m] - 1)
    return itl, res.run_of_step[m]


def measure(
    res: SimResult, slo: SLO, n_boot: int = 200, boot_seed: int = 0, keep_raw: bool = False
) -> dict[str, dict[str, Any]]:
    """Per target: value, n (steps or runs measured) and ``n_boot`` run-bootstrap replicates; with
    ``keep_raw`` also ``raw``, every replicate in draw order (NaN where a draw held no step of the
    class), so two simulations of the same runs pair replicate by replicate (:func:`paired`)."""
    n_runs = len(res.run_completion_s)
    rng = np.random.default_rng(boot_seed)
    w = rng.multinomial(n_runs, np.full(n_runs, 1.0 / n_runs), size=n_boot) if n_boot and n_runs else None
    out: dict[str, dict[str, Any]] = {}
    for t in slo.all_targets():
        v, runs = _metric_arrays(res, t)
        if v.size == 0:
            out[t.key] = {"value": None, "n": 0, "boot": []}
            if keep_raw:
                out[t.key]["raw"] = np.full(n_boot if w is not None else 0, np.nan)
            continue
        val = float(np.percentile(v, t.q))
        boot = _weighted_quantiles(v, runs, w, t.q) if w is not None else np.array([])
        out[t.key] = {"value": val, "n": int(v.size), "boot": [float(x) for x in boot if np.isfinite(x)]}
        if keep_raw:
            out[t.key]["raw"] = boot
    return out


def goodput_key(ttft_s: float, tpot_s: float) -> str:
    """The name of a goodput share measured by :func:`measure_goodput`."""
    return f"goodput_share@ttft<={ttft_s:g}s,tpot<={tpot_s:g}s"


def measure_goodput(
    res: SimResult, pairs: tuple[tuple[float, float], ...], n_boot: int = 200, boot_seed: int = 0
) -> dict[str, dict[str, Any]]:
    """DistServe's goodput share (served steps with TTFT <= ``ttft_s`` and time per output token <=
    ``tpot_s``; the scorecard's ``goodput_share``) for each ``(ttft_s, tpot_s)`` of ``pairs``, with
    run-bootstrap replicates in :func:`measure`'s shape (``value``, ``n``, ``boot``, and ``raw``: the
    replicates in draw order). A replicate reweights whole runs (a ratio of sums) with the same draws
    as :func:`measure` at the same ``boot_seed``: one simulation's SLOs need one simulation."""
    from router.sim.scorecard import SERVED_FRONTIER, SERVED_LOCAL, SPILLED

    n_runs = len(res.run_completion_s)
    rng = np.random.default_rng(boot_seed)
    w = rng.multinomial(n_runs, np.full(n_runs, 1.0 / n_runs), size=n_boot) if n_boot and n_runs else None
    oc = res.outcome
    served = (oc == SERVED_LOCAL) | (oc == SERVED_FRONTIER) | (oc == SPILLED)
    comp = (res.completion if res.completion is not None else np.ones_like(res.prompt))[served]
    per = np.where(comp > 1, (res.latency[served] - res.ttft[served]) / np.maximum(comp - 1, 1), 0.0)
    ttft = res.ttft[served]
    runs = res.run_of_step[served]
    den = np.bincount(runs, minlength=n_runs).astype(float)
    out: dict[str, dict[str, Any]] = {}
    for ttft_s, tpot_s in pairs:
        key = goodput_key(ttft_s, tpot_s)
        good = (ttft <= ttft_s) & (per <= tpot_s)
        if not good.size:
            out[key] = {
                "value": None,
                "n": 0,
                "boot": [],
                "raw": np.full(n_boot if w is not None else 0, np.nan),
            }
            continue
        raw = np.array([])
        if w is not None:
            num = np.bincount(runs, weights=good.astype(float), minlength=n_runs)
            d = w @ den
            with np.errstate(invalid="ignore", divide="ignore"):
                raw = np.where(d > 0, (w @ num) / d, np.nan)
        out[key] = {
            "value": float(good.mean()),
            "n": int(good.size),
            "boot": [float(x) for x in raw if np.isfinite(x)],
            "raw": raw,
        }
    return out


def paired(
    a: list[dict[str, Any]],
    b: list[dict[str, Any]],
    op: Callable[[Any, Any], Any],
    level: float = 0.9,
) -> dict[str, Any]:
    """A comparison of two simulations of the same runs (a speed-up ``a / b``, a gain ``b - a``) with
    its interval: ``a[k]`` and ``b[k]`` are one figure's measurements at arrival seed ``k`` (the same
    start times and bootstrap draws for both, keep_raw), so replicate ``i`` of ``a`` and of ``b`` weight
    the same runs. The value is the median over seeds of ``op`` on the two values; the interval the
    ``level`` range of ``op`` over every seed's paired replicates (and the seeds' values), as in
    :func:`pool`. ``None`` figures (no step measured) give ``None``."""
    vals = [
        float(op(x["value"], y["value"]))
        for x, y in zip(a, b, strict=True)
        if x["value"] is not None and y["value"] is not None
    ]
    if not vals:
        return {"value": None, "lo": None, "hi": None}
    boot: list[float] = list(vals)
    for x, y in zip(a, b, strict=True):
        rx, ry = np.asarray(x.get("raw", [])), np.asarray(y.get("raw", []))
        if rx.size and rx.size == ry.size:
            with np.errstate(invalid="ignore", divide="ignore"):
                r = op(rx, ry)
            boot += [float(v) for v in np.asarray(r) if np.isfinite(v)]
    lo_q, hi_q = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return {
        "value": round(float(np.median(vals)), 6),
        "lo": round(float(np.percentile(boot, lo_q)), 6),
        "hi": round(float(np.percentile(boot, hi_q)), 6),
    }


def overlap(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool | None:
    """Whether two intervals (``lo``, ``hi``) overlap: the figures are indistinguishable at this
    noise (the rule the search answers use); ``None`` when either has no interval."""
    if not a or not b or a.get("lo") is None or b.get("lo") is None:
        return None
    return bool(a["lo"] <= b["hi"] and b["lo"] <= a["hi"])


def measure_hit_rates(res: SimResult, n_boot: int = 200, boot_seed: int = 0) -> dict[str, dict[str, Any]]:
    """The cross-turn cache hit rates of one simulation with their run-bootstrap replicates, in
    :func:`measure`'s shape (``value``, ``n``, ``boot``) so :func:`pool` pools them over seeds alike.

    ``cache_hit_rate``: cached / prompt tokens over the local steps with index >= 1
    (:func:`router.core.figures.cache_figures`, the scorecard's figure); with lower KV tiers also
    ``cache_hit_rate_gpu`` and ``cache_hit_rate_<tier>`` (the global CPU pool's is ``_cpu``), as in the
    details. A replicate reweights whole runs (numerator and denominator together: a ratio of sums) with
    the same draws as :func:`measure` at the same ``boot_seed``."""
    from router.core.figures import ratio
    from router.sim.scorecard import SERVED_LOCAL

    n_runs = len(res.run_completion_s)
    rng = np.random.default_rng(boot_seed)
    w = rng.multinomial(n_runs, np.full(n_runs, 1.0 / n_runs), size=n_boot) if n_boot and n_runs else None
    m = (res.outcome == SERVED_LOCAL) & (res.step_index >= 1)
    runs = res.run_of_step[m]
    prompt = res.prompt[m]
    ptok = float(prompt.sum())
    nums: dict[str, np.ndarray] = {"cache_hit_rate": res.cached[m]}
    if res.tier_cached is not None and res.tier_stats is not None:
        lower = res.tier_cached[:, m]
        nums["cache_hit_rate_gpu"] = res.cached[m] - lower.sum(axis=0)
        for st, row in zip(res.tier_stats, lower, strict=True):
            nums[f"cache_hit_rate_{st['tier']}"] = row
    den = np.bincount(runs, weights=prompt.astype(float), minlength=n_runs) if w is not None else None
    out: dict[str, dict[str, Any]] = {}
    for key, v in nums.items():
        if not ptok:
            out[key] = {"value": None, "n": 0, "boot": []}
            continue
        boot: list[float] = []
        if w is not None and den is not None:
            num = np.bincount(runs, weights=v.astype(float), minlength=n_runs)
            d = w @ den
            ok = d > 0
            boot = [float(x) for x in (w[ok] @ num) / d[ok]]
        out[key] = {"value": ratio(float(v.sum()), ptok), "n": int(m.sum()), "boot": boot}
    return out


def pool(per_seed: list[dict[str, dict[str, Any]]], level: float = 0.9) -> dict[str, dict[str, Any]]:
    """Median over seeds and the pooled replicates' ``level`` interval, per target."""
    out: dict[str, dict[str, Any]] = {}
    for key in per_seed[0]:
        vals = [m[key]["value"] for m in per_seed if m[key]["value"] is not None]
        boot = [x for m in per_seed for x in m[key]["boot"]] + vals
        if not vals:
            out[key] = {"value": None, "lo": None, "hi": None, "n": 0, "per_seed": [None] * len(per_seed)}
            continue
        lo_q, hi_q = (1 - level) / 2 * 100, (1 + level) / 2 * 100
        out[key] = {
            "value": round(float(np.median(vals)), 6),
            "lo": round(float(np.percentile(boot, lo_q)), 6),
            "hi": round(float(np.percentile(boot, hi_q)), 6),
            "n": int(np.median([m[key]["n"] for m in per_seed])),
            "per_seed": [None if m[key]["value"] is None else round(m[key]["value"], 6) for m in per_seed],
        }
    return out


# ------------------------------------------------------------------------------------------ floors
def prefill_s(profile: NodeProfile, prompt: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """Seconds to prefill ``prompt - cached`` tokens alone on one replica (chunks of ``token_budget``)."""
    p = profile
    todo = np.maximum(prompt - cached, 1).astype(float)
    s0 = cached.astype(float)
    budget = float(p.token_budget)
    n = np.ceil(todo / budget)
    # sum over chunks of l * (s + l): full chunks of `budget`, then the last one
    full = n - 1
    last = todo - full * budget
    quad = budget * (full * s0 + budget * full * (full + 1) / 2) + last * (s0 + full * budget + last)
    return n * (p.a + p.e) + p.b * todo + p.c * quad


def _decode_s(profile: NodeProfile, ctx: np.ndarray) -> np.ndarray:
    return profile.a + profile.e + profile.d * ctx


def _longest_within(profile: NodeProfile, target_s: float) -> int:
    """The longest cold prompt one replica prefills within ``target_s`` (0 if none)."""
    lo, hi = 0, 1 << 21
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if prefill_s(profile, np.array([mid]), np.array([0]))[0] <= target_s:
            lo = mid
        else:
            hi = mid
    return lo


def floors(workload: Workload, profile: NodeProfile, slo: SLO) -> list[dict[str, Any]]:
    """Per target: its value with no queueing (cold and perfect cache), whether it is above the target,
    the cause and the levers (module docstring). Assumes local serving (the frontier has its own)."""
    prompt = np.array([s.prompt for r in workload.runs for s in r.steps], dtype=np.int64)
    comp = np.array([max(s.completion, 1) for r in workload.runs for s in r.steps], dtype=np.int64)
    upper = np.array(
        [upper_bound_tokens(s.upper, s.prompt) for r in workload.runs for s in r.steps], dtype=np.int64
    )
    short = np.array([s.short for r in workload.runs for s in r.steps], dtype=bool)
    run_of = np.repeat(np.arange(len(workload.runs)), [len(r.steps) for r in workload.runs])
    pauses = np.array([sum(s.pause for s in r.steps[1:]) for r in workload.runs], dtype=float)
    out = []
    for t in slo.all_targets():
        row: dict[str, Any] = {"target": t.key, "target_s": t.value_s}
        vals = {}
        for label, cached in (("cold", np.zeros_like(prompt)), ("perfect_cache", np.maximum(upper, 0))):
            ttft = prefill_s(profile, prompt, cached)
            itl = _decode_s(profile, prompt + comp / 2.0)
            lat = ttft + (comp - 1) * itl
            if t.metric == "run":
                v = np.bincount(run_of, weights=lat, minlength=len(pauses)) + pauses
            else:
                m = t.in_class(prompt)
                if t.metric == "short":
                    m &= short
                if t.metric == "itl":
                    m &= comp > 1
                v = {"short": lat, "step": lat, "ttft": ttft, "itl": itl}[t.metric][m]
            vals[label] = float(np.percentile(v, t.q)) if v.size else None
        row["floor_s"], row["floor_s_perfect_cache"] = vals["cold"], vals["perfect_cache"]
        best = vals["perfect_cache"]
        row["above_target"] = best is not None and best > t.value_s
        row["cold_above_target"] = vals["cold"] is not None and vals["cold"] > t.value_s
        m = t.in_class(prompt) & (short if t.metric == "short" else True)
        p_cls = prompt[m] if t.metric != "run" else prompt
        pq = int(np.percentile(p_cls, t.q)) if p_cls.size else 0
        longest = _longest_within(profile, t.value_s)
        if t.metric in ("ttft", "short", "step"):
            row["cause"] = (
                f"the prefill of the class's longest prompts: its p{t.q:g} prompt has {pq:,} tokens, which one "
                f"{profile.name} replica prefills alone in {float(prefill_s(profile, np.array([pq]), np.array([0]))[0]):.2f} s "
                "(more replicas do not shorten one prompt's prefill)"
            )
            row["levers"] = [
                f"prefix-cache hits (with the run's earlier prefix always cached the floor is {_s(best)})",
                "tensor parallelism (a TP2 replica roughly halves the prefill time; a TP profile is needed)",
                "a faster GPU (another --node-profile)",
                f"the frontier for prompts above {longest:,} tokens (the longest one replica prefills within "
                f"{t.value_s:g} s), or a separate SLO class for them (e.g. ttft_p95@>{_fmt_tokens(max(longest, 1024) // 1024 * 1024)}=...)",
            ]
        elif t.metric == "itl":
            row["cause"] = (
                "batch-1 decode: every token reads the weights and the step's KV cache "
                f"({profile.a * 1000:.1f} ms + {profile.d * 1e9:.0f} ns per context token on {profile.name})"
            )
            row["levers"] = [
                "fp8 KV with --kv-read-scales (halves the KV read)",
                "a faster GPU (memory bandwidth)",
                "speculative decoding (--spec)",
                "disaggregated decode replicas (--disagg-prefill), so prefill chunks do not share iterations",
            ]
        else:
            row["cause"] = (
                f"tool pauses ({float(np.percentile(pauses, t.q)):.1f} s at p{t.q:g}, outside the GPU) plus every "
                "step's own prefill and decode"
            )
            row["levers"] = ["shorter tool pauses (not the GPU)", "prefix-cache hits", "a faster GPU"]
        out.append(row)
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A warning per target whose floor (perfect cache) or cold floor is above the target."""
    out = []
    for r in rows:
        if not (r["above_target"] or r["cold_above_target"]):
            continue
        how = "cannot be met by any number of replicas" if r["above_target"] else "needs prefix-cache hits"
        out.append(
            f"WARNING: SLO {r['target']}={r['target_s']:g}s {how} on this node: its floor (no queueing) is "
            f"{_s(r['floor_s'])} cold, {_s(r['floor_s_perfect_cache'])} with a perfect prefix cache. Cause: "
            f"{r['cause']}. Levers: {'; '.join(r['levers'])}."
        )
    return out
