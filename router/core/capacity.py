"""Live capacity forecasts: new-run arrival forecast and the replica count that holds the SLO.

Forecast (:class:`ArrivalForecaster`, timestamps passed in, no clock of its own):
- new-run arrivals are counted in buckets of ``bucket_s`` seconds;
- the level is an EWMA of the per-bucket rate (``alpha`` per bucket, so its half-life is
  ``bucket_s * ln 2 / alpha``);
- once ``min_history_s`` (default one day) of history exists, a daily profile multiplies the
  level: the mean rate of each hour-of-day slot divided by the overall mean, so the forecast for
  ``now + h`` uses the profile of the slot ``now + h`` falls in (smoothed, clamped to [0.1, 10]).

Recommendation (:func:`recommend_replicas`): Little's law gives the active runs at the forecast
rate (``rate x mean run duration``); the fewest replicas for which the admission model
(:func:`router.policy.admission.predict_short_step_latency`) keeps the short-step latency within
the interactive headroom of the SLO. Expected spill/reject shares are the share of forecast
arrivals beyond what the current replica count admits.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from router.policy.admission import (
    AdmissionConfig,
    LoadSnapshot,
    admissible_runs,
    predict_short_step_latency,
)

__all__ = ["ArrivalForecaster", "CapacityPlan", "recommend_replicas", "capacity_plan"]

_DAY = 86400.0


class ArrivalForecaster:
    def __init__(
        self,
        bucket_s: float = 60.0,
        alpha: float = 0.2,
        min_history_s: float = _DAY,
        max_buckets: int = 7 * 24 * 60,
    ):
        self.bucket_s = bucket_s
        self.alpha = alpha
        self.min_history_s = min_history_s
        self._buckets: deque[tuple[int, int]] = deque(maxlen=max_buckets)  # (bucket index, count)
        self._level: float | None = None
        self._first: int | None = None

    def _roll(self, idx: int) -> None:
        """Close buckets up to (not incl.) idx, updating the EWMA level, incl. empty buckets."""
        if not self._buckets:
            self._buckets.append((idx, 0))
            self._first = idx
            return
        last_idx, last_count = self._buckets[-1]
        while last_idx < idx:
            rate = last_count / self.bucket_s
            self._level = rate if self._level is None else (1 - self.alpha) * self._level + self.alpha * rate
            last_idx += 1
            last_count = 0
            self._buckets.append((last_idx, 0))

    def observe(self, t_s: float, n: int = 1) -> None:
        """Record ``n`` new-run arrivals at time ``t_s`` (monotone non-decreasing times)."""
        idx = int(t_s // self.bucket_s)
        self._roll(idx)
        b_idx, count = self._buckets[-1]
        if b_idx == idx:
            self._buckets[-1] = (idx, count + n)

    def level(self, now_s: float) -> float:
        """EWMA arrival rate (runs/s) as of ``now_s``."""
        self._roll(int(now_s // self.bucket_s))
        return self._level or 0.0

    def _profile(self) -> list[float] | None:
        if self._first is None or not self._buckets:
            return None
        span = (self._buckets[-1][0] - self._first) * self.bucket_s
        if span < self.min_history_s:
            return None
        sums = [0.0] * 24
        cnts = [0] * 24
        for idx, c in self._buckets:
            h = int(((idx * self.bucket_s) % _DAY) // 3600)
            sums[h] += c
            cnts[h] += 1
        means = [s / c if c else 0.0 for s, c in zip(sums, cnts, strict=True)]
        overall = sum(means) / 24 or 1.0
        return [min(max(m / overall, 0.1), 10.0) for m in means]

    def forecast(self, now_s: float, horizon_s: float) -> float:
        """Forecast arrival rate (runs/s) averaged over [now, now + horizon]."""
        lvl = self.level(now_s)
        prof = self._profile()
        if prof is None:
            return lvl
        h_now = int((now_s % _DAY) // 3600)
        steps = max(int(horizon_s // 3600), 1)
        ahead = [prof[int(((now_s + k * horizon_s / steps) % _DAY) // 3600)] for k in range(1, steps + 1)]
        return lvl * (sum(ahead) / len(ahead)) / max(prof[h_now], 0.1)


@dataclass(slots=True)
class CapacityPlan:
    horizon_s: float
    forecast_runs_per_s: float
    expected_active_runs: float
    recommended_replicas: int
    expected_shed_share: float  # share of arrivals beyond what the current replicas admit


def recommend_replicas(
    cfg: AdmissionConfig, active_runs: float, run_token_rate: float | None, max_replicas: int = 1024
) -> int:
    """Fewest replicas keeping the predicted short-step latency within the interactive headroom."""
    limit = cfg.slo_short_step_s * cfg.headroom.get("interactive", 0.9)
    for r in range(1, max_replicas + 1):
        load = LoadSnapshot(
            healthy_replicas=r,
            active_local_runs=max(int(math.ceil(active_runs)) - 1, 0),
            run_token_rate=run_token_rate,
        )
        if predict_short_step_latency(cfg, load)[0] <= limit:
            return r
    return max_replicas


def capacity_plan(
    cfg: AdmissionConfig,
    forecaster: ArrivalForecaster,
    now_s: float,
    horizon_s: float,
    mean_run_s: float,
    run_token_rate: float | None,
    current_replicas: int,
) -> CapacityPlan:
    rate = forecaster.forecast(now_s, horizon_s)
    active = rate * mean_run_s
    need = recommend_replicas(cfg, active, run_token_rate)
    if active <= 0:
        shed = 0.0
    else:
        # runs the current replicas hold within the interactive headroom (closed form, O(1))
        load = LoadSnapshot(
            healthy_replicas=current_replicas, active_local_runs=0, run_token_rate=run_token_rate
        )
        held = min(admissible_runs(cfg, load, "interactive"), math.ceil(active))
        shed = max(0.0, 1.0 - held / active)
    return CapacityPlan(horizon_s, rate, active, need, shed)
