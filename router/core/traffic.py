"""The traffic model: the local tier's load as the router itself sees it (sync, no I/O, clocks injected).

:class:`TrafficModel` keeps, from the steps the step engine starts and finishes:

- **per local replica**, the work of its in-flight steps: prefill tokens (the new prompt minus the
  expected prefix-cache reuse) and decode tokens (the run's mean output so far, else
  ``default_decode_tokens``), plus a time-decayed rate of the *work* it served, counted in
  decode-token equivalents: ``completion + prefill_weight x uncached prompt``
  (:class:`router.policy.admission.AdmissionConfig` defines the unit);
- **per active local run** (admitted): its priority, tenant, last step time and the latest
  remaining-work predictions (``remaining_tokens_p50``, ``remaining_steps_p50``); their sum is the
  predicted remaining local work, and ``remaining_steps_p50 x`` the mean step cycle (EWMA of the
  time between a run's consecutive steps) is the predicted time until a run ends (Retry-After);
- **the per-run token rate**: the decayed local work rate divided by the time-averaged number of
  active local runs (both exponentially weighted with time constant ``tau_s`` and normalised for
  the warm-up, so the first ``tau_s`` seconds are not biased low); ``None`` until
  ``min_rate_steps`` local steps were seen (the admission config's default applies);
- **new-run arrivals**, fed to :class:`router.core.capacity.ArrivalForecaster`, and an EWMA of run
  durations (first step to end) for Little's law in the capacity plan.

The sidecar and the simulator run the same object (the simulator with its event clock), so the
admission controller sees the same kind of figures in both.

Knobs (constructor): ``tau_s`` (30 s), ``prefill_weight`` (the admission config's
``work_prefill_weight``), ``default_decode_tokens`` (64), ``min_rate_steps`` (20), ``forecaster``,
``clock`` (monotonic seconds) and ``wall`` (epoch seconds, for the forecaster's daily profile).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from models.types import Predictions
from router.core.capacity import ArrivalForecaster

__all__ = ["DecayingRate", "DecayingMean", "ActiveRun", "ReplicaLoad", "StepToken", "TrafficModel"]


class DecayingRate:
    """Events-per-second estimate with exponential time decay (time constant ``tau_s``).

    ``rate = sum_i x_i exp(-(now - t_i) / tau) / (tau (1 - exp(-(now - t0) / tau)))``: the
    denominator is the effective window, so the estimate is unbiased during the warm-up too.
    """

    __slots__ = ("tau", "t0", "t", "v")

    def __init__(self, tau_s: float, t0: float):
        self.tau, self.t0, self.t, self.v = tau_s, t0, t0, 0.0

    def _decay(self, now: float) -> None:
        if now > self.t:
            self.v *= math.exp(-(now - self.t) / self.tau)
            self.t = now

    def add(self, now: float, x: float) -> None:
        self._decay(now)
        self.v += x

    def rate(self, now: float) -> float:
        self._decay(now)
        window = self.tau * (1.0 - math.exp(-max(now - self.t0, 1e-9) / self.tau))
        return self.v / max(window, 1e-9)


class DecayingMean:
    """Time-weighted exponential mean of a piecewise-constant signal (e.g. the active run count)."""

    __slots__ = ("tau", "t0", "t", "value", "integral")

    def __init__(self, tau_s: float, t0: float):
        self.tau, self.t0, self.t, self.value, self.integral = tau_s, t0, t0, 0.0, 0.0

    def _advance(self, now: float) -> None:
        if now > self.t:
            k = math.exp(-(now - self.t) / self.tau)
            self.integral = self.integral * k + self.value * self.tau * (1.0 - k)
            self.t = now

    def set(self, now: float, value: float) -> None:
        self._advance(now)
        self.value = value

    def mean(self, now: float) -> float:
        self._advance(now)
        window = self.tau * (1.0 - math.exp(-max(now - self.t0, 1e-9) / self.tau))
        return self.integral / window if window > 1e-9 else self.value


@dataclass(slots=True)
class ActiveRun:
    run_id: str
    admitted_s: float
    last_s: float
    priority: str
    tenant: str | None
    remaining_tokens: float = 0.0
    remaining_steps: float = 0.0
    steps: int = 0
    completion_sum: int = 0


@dataclass(slots=True)
class ReplicaLoad:
    name: str
    work: DecayingRate
    inflight_steps: int = 0
    prefill_tokens: float = 0.0  # queued/running prefill work of in-flight steps (estimate)
    decode_tokens: float = 0.0  # queued/running decode work of in-flight steps (estimate)
    context_tokens: float = 0.0  # prompt + expected output of in-flight steps (what decode attends over)


@dataclass(slots=True)
class StepToken:
    """What :meth:`TrafficModel.step_started` charged, so :meth:`TrafficModel.step_finished` undoes it once."""

    replica: str | None
    run_id: str
    prefill: float
    decode: float
    done: bool = False
    context: float = 0.0


class TrafficModel:
    """See the module docstring. Knobs: ``tau_s`` (decay time constant of the rates, s),
    ``prefill_weight`` (decode-token equivalents per uncached prefill token),
    ``default_decode_tokens`` (expected output of a step before a run has history),
    ``min_rate_steps`` (local steps seen before the per-run rate is trusted), ``forecaster``,
    ``idle_end_s`` (the sidecar ends a run idle this long: a bound on when its slot frees; None =
    no such bound).
    """

    def __init__(
        self,
        replicas: list[str],
        *,
        tau_s: float = 30.0,
        prefill_weight: float = 0.01,
        default_decode_tokens: float = 64.0,
        min_rate_steps: int = 20,
        forecaster: ArrivalForecaster | None = None,
        idle_end_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        now = clock()
        self.tau_s = tau_s
        self.prefill_weight = prefill_weight
        self.default_decode_tokens = default_decode_tokens
        self.min_rate_steps = min_rate_steps
        self.idle_end_s = idle_end_s
        self.clock, self.wall = clock, wall
        self.forecaster = forecaster or ArrivalForecaster()
        self.replicas = {r: ReplicaLoad(r, DecayingRate(tau_s, now)) for r in replicas}
        self.runs: dict[str, ActiveRun] = {}
        self._work = DecayingRate(tau_s, now)
        self._active = DecayingMean(tau_s, now)
        self._local_steps = 0
        self.step_cycle_s: float | None = None  # EWMA of the time between a run's consecutive steps
        self.run_duration_s: float | None = None  # EWMA of admitted runs' durations

    # ------------------------------------------------------------------ runs
    def run_arrived(self) -> None:
        """A new run started (whatever the verdict): one arrival for the forecaster."""
        self.forecaster.observe(self.wall())

    def admitted(self, run_id: str, priority: str, tenant: str | None) -> None:
        now = self.clock()
        self.runs[run_id] = ActiveRun(run_id, now, now, priority, tenant)
        self._active.set(now, len(self.runs))

    def release(self, run_id: str) -> bool:
        """Forget an admitted run; True when this router was tracking it."""
        r = self.runs.pop(run_id, None)
        if r is None:
            return False
        now = self.clock()
        self._active.set(now, len(self.runs))
        d = max(now - r.admitted_s, 0.0)
        self.run_duration_s = d if self.run_duration_s is None else 0.9 * self.run_duration_s + 0.1 * d
        return True

    def idle_runs(self, idle_s: float) -> list[str]:
        now = self.clock()
        return [r.run_id for r in self.runs.values() if now - r.last_s > idle_s]

    def touch(self, run_id: str) -> None:
        r = self.runs.get(run_id)
        if r is not None:
            r.last_s = self.clock()

    # ------------------------------------------------------------------ steps
    def step_started(
        self,
        replica: str | None,
        run_id: str,
        prompt_tokens: int,
        reuse_tokens: float,
        predictions: Predictions | None,
    ) -> StepToken:
        """Charge an in-flight step to ``replica`` (None: not local): ``prompt_tokens`` minus the
        expected prefix-cache ``reuse_tokens`` of prefill, the run's mean output of decode; update
        the run's remaining-work predictions."""
        now = self.clock()
        r = self.runs.get(run_id)
        decode = self.default_decode_tokens
        if r is not None:
            if r.steps:
                self._cycle(now - r.last_s)
                decode = r.completion_sum / r.steps
            r.last_s = now
            if predictions is not None:
                r.remaining_tokens = max(float(predictions.remaining_tokens_p50), 0.0)
                r.remaining_steps = max(float(predictions.remaining_steps_p50), 0.0)
        rep = self.replicas.get(replica) if replica is not None else None
        if rep is None:
            return StepToken(None, run_id, 0.0, 0.0)
        prefill = max(prompt_tokens - reuse_tokens, 0.0)
        rep.inflight_steps += 1
        rep.prefill_tokens += prefill
        rep.decode_tokens += decode
        context = prompt_tokens + decode
        rep.context_tokens += context
        return StepToken(replica, run_id, prefill, decode, context=context)

    def _cycle(self, dt: float) -> None:
        if dt > 0:
            self.step_cycle_s = dt if self.step_cycle_s is None else 0.9 * self.step_cycle_s + 0.1 * dt

    def step_finished(
        self,
        token: StepToken | None,
        replica: str | None,
        prompt: int,
        cached: int,
        completion: int,
        ok: bool,
    ) -> None:
        """Undo the in-flight charge; count the served work when the step ended on a local replica."""
        if token is None or token.done:
            return
        token.done = True
        now = self.clock()
        if token.replica is not None:
            rep = self.replicas[token.replica]
            rep.inflight_steps -= 1
            rep.prefill_tokens = max(rep.prefill_tokens - token.prefill, 0.0)
            rep.decode_tokens = max(rep.decode_tokens - token.decode, 0.0)
            rep.context_tokens = max(rep.context_tokens - token.context, 0.0)
        r = self.runs.get(token.run_id)
        if r is not None:
            r.last_s = now
            if ok:
                r.steps += 1
                r.completion_sum += completion
        dst = self.replicas.get(replica) if replica is not None else None
        if ok and dst is not None:
            w = completion + self.prefill_weight * max(prompt - cached, 0)
            dst.work.add(now, w)
            self._work.add(now, w)
            self._local_steps += 1

    # ------------------------------------------------------------------ estimates
    def run_token_rate(self) -> float | None:
        """Work tokens/s one active local run puts on the local tier (None before enough history)."""
        if self._local_steps < self.min_rate_steps:
            return None
        now = self.clock()
        active = self._active.mean(now)
        if active < 0.5:
            return None
        return self._work.rate(now) / active

    def replica_work_rate(self, name: str) -> float:
        rep = self.replicas.get(name)
        return rep.work.rate(self.clock()) if rep is not None else 0.0

    def mean_remaining_run_s(self) -> float | None:
        """Predicted seconds until an average active run ends.

        The larger of two estimates (so Retry-After does not invite retries too early): the bundle's
        ``remaining_steps_p50`` x the step cycle, and the history's ``run duration - age`` (at least
        one step cycle). None before either is known.
        """
        if not self.runs:
            return None
        now = self.clock()
        est: list[float] = []
        if self.step_cycle_s is not None:
            steps = [r.remaining_steps for r in self.runs.values() if r.remaining_steps > 0]
            if steps:
                est.append((sum(steps) / len(steps)) * self.step_cycle_s)
        if self.run_duration_s is not None:
            floor = self.step_cycle_s or 0.0
            left = [max(self.run_duration_s - (now - r.admitted_s), floor) for r in self.runs.values()]
            est.append(sum(left) / len(left))
        return max(est) if est else None

    def slot_free_s(self) -> tuple[float, ...]:
        """Predicted seconds until each active run's slot frees, soonest first.

        Per run, the earliest of: its predicted end (``remaining_steps_p50`` x the step cycle, else
        the mean run duration - its age) and its idle expiry (``idle_end_s`` - time since its last
        step: the sidecar ends it then). Runs with neither are left out."""
        now = self.clock()
        out = []
        for r in self.runs.values():
            cands = []
            if self.step_cycle_s is not None and r.remaining_steps > 0:
                cands.append(r.remaining_steps * self.step_cycle_s)
            elif self.run_duration_s is not None:
                cands.append(max(self.run_duration_s - (now - r.admitted_s), self.step_cycle_s or 0.0))
            if self.idle_end_s is not None:
                cands.append(max(self.idle_end_s - (now - r.last_s), 0.0))
            if cands:
                out.append(min(cands))
        return tuple(sorted(out))

    def predicted_remaining_tokens(self) -> float:
        return float(sum(r.remaining_tokens for r in self.runs.values()))
