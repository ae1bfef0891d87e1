"""Evaluation: how a routing policy would have done, scored the same way for every policy.

Modules (import them directly; this package imports nothing heavy itself):

- :mod:`training.eval.outcome`: the outcome model (weak / strong outcomes, variants) and the
  token-priced cost of a run's tiers; :mod:`training.eval.curves`: cost at a quality target, AIQ.
- :mod:`training.eval.config`: the simulated and the live deployment (``SimSettings``, ``LiveSettings``).
- :mod:`training.eval.compare`: every policy on a workload through the what-if simulator, threshold
  sweeps (``compare_policies``); :mod:`training.eval.split`: the demo's split by task.
- :mod:`training.eval.live`: a few runs per policy through the real sidecar with fake backends.
- :mod:`training.eval.bench`: ``runroute bench`` (``bench_runs``).
- :mod:`training.eval.scorecard`: the scorecard as typed models; :mod:`training.eval.readme_keys`
  generates docs/scorecard.md's key list from their field descriptions.
- :mod:`training.eval.report` (``write_report``, ``print_scorecard``) with
  :mod:`training.eval.markdown`, :mod:`training.eval.plots`, :mod:`training.eval.analysis` and
  :mod:`training.eval.format`.
"""

__all__ = [
    "outcome",
    "curves",
    "config",
    "compare",
    "split",
    "live",
    "bench",
    "scorecard",
    "readme_keys",
    "report",
    "markdown",
    "plots",
    "analysis",
    "format",
]
