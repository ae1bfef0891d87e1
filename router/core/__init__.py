"""The step engine and what it owns: run tracking, the traffic/load model, the prefix-cache model.

Synchronous, no I/O, clock injected; the sidecar, the simulator and replay are thin adapters."""

from router.native import prefer

prefer(__name__, __path__)  # compiled per-step modules, when built from this source
