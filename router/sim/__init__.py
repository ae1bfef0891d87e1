"""The what-if simulator: closed-loop replay of logged agent runs through the router's own policies.

Modules: :mod:`~router.sim.engine` (the discrete-event loop), :mod:`~router.sim.node` (a simulated
vLLM replica: continuous batching, chunked prefill, block-hash prefix cache, scale-to-zero),
:mod:`~router.sim.frontier` (latency, prices, rate limit, provider prompt cache),
:mod:`~router.sim.profiles` / :mod:`~router.sim.fit_profiles` (step-time coefficients fitted to
measured GPU tables), :mod:`~router.sim.arrivals` (run-start processes),
:mod:`~router.sim.whatif` (workload, simulator, scorecard, grid and answers),
:mod:`~router.sim.report` (table, JSON, plots) and :mod:`~router.sim.calibrate` (matching a fake vLLM);
the optional model elements :mod:`~router.sim.kvtier` (CPU/SSD KV tiers), :mod:`~router.sim.specdec`
(speculative decoding; rates measured by :mod:`~router.sim.spec_measure`), :mod:`~router.sim.disagg`
(prefill/decode pools) and KV formats (:mod:`~router.sim.simconfig`); the answers by search
(:mod:`~router.sim.search`, :mod:`~router.sim.precheck`, :mod:`~router.sim.search_report`), the
disaggregation sweep (:mod:`~router.sim.breakeven`) and the point loop (:mod:`~router.sim.points`).
The CLI is ``runroute whatif``. Nothing heavy is imported here.
"""

from router.native import prefer

__all__: list[str] = []

prefer(__name__, __path__)  # compiled per-step modules, when built from this source
