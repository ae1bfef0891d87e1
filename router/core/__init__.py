"""The step engine and what it owns: run tracking, the traffic/load model, the prefix-cache model.

Synchronous, no I/O, clock injected; the sidecar, the simulator and replay are thin adapters."""
