"""The sidecar: FastAPI app, proxy, SSE relay, upstream clients, run-state stores, run-log writer,
metrics, settings — the I/O around the step engine (:mod:`router.core`)."""
