"""``runroute serve --workers N``: N sidecar processes behind one port.

Algorithm: uvicorn's process supervisor (``uvicorn.run(..., workers=N)``) binds the listening socket
once and spawns N worker processes that accept on it; the kernel hands each new connection to one
of them. Each worker builds its own app with :func:`app_from_env` (the factory uvicorn imports by
name in the child): the settings are loaded again there from the same config file and the same
``server`` overrides (passed through the environment: :data:`ENV_CONFIG`, :data:`ENV_SERVER`), so
every worker serves exactly what one process would. The supervisor restarts a worker that dies.

What the workers share, and how:

- **Run state** (pins, step numbers, the admission budget) lives in the run-state store. With
  ``store.kind: redis`` every worker reads and writes the same keys, exactly like several router
  replicas (set-if-absent pins, atomic step numbers): a run's steps stay on one replica whichever
  worker serves them. The single-host default store (``memory``) lives inside one process, so two
  workers would each pin a run on their own (a run split over two replicas, step numbers counted
  twice): :func:`check_workers` refuses N > 1 without Redis rather than serve that.
- **Run logs**: one file per worker (the writer names its files ``runlog-<pid>-...``), in the same
  directory; the readers (``features.runlog``, ``runroute summarize``, training) merge the files of
  a directory.
- **Metrics**: one view. Each worker writes its series to a folder the supervisor made
  (:data:`ENV_METRICS`) every second; the worker a scrape reaches answers the merge (counters and
  histograms summed, gauges per worker with a ``pid`` label: :mod:`router.server.metrics.workers`).

Knobs: ``N`` (``--workers``; 1 = one process, no supervisor, as before).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.server.settings import RouterSettings

__all__ = [
    "ENV_CONFIG",
    "ENV_METRICS",
    "ENV_SERVER",
    "WorkersError",
    "check_workers",
    "worker_env",
    "app_from_env",
]

ENV_CONFIG = "_RUNROUTE_WORKER_CONFIG"  # not RUNROUTE_*: the settings would read it as a field
ENV_SERVER = "_RUNROUTE_WORKER_SERVER"
ENV_METRICS = "_RUNROUTE_WORKER_METRICS"  # the folder the workers share their series through


class WorkersError(ValueError):
    """A setting that N worker processes cannot serve correctly."""


def check_workers(settings: RouterSettings, n: int) -> None:
    """Refuse ``n`` workers where they would not share run state (module docstring)."""
    if n < 1:
        raise WorkersError(f"--workers must be >= 1, got {n}")
    if n > 1 and settings.store.kind != "redis":
        raise WorkersError(
            f"--workers {n} needs store.kind: redis (run pins and step numbers must be shared between "
            "the worker processes; the memory store lives inside one process). Set store.kind: redis "
            "and store.redis_url, or serve with --workers 1."
        )


def worker_env(config: Path | None, server: dict[str, object], metrics_dir: Path) -> dict[str, str]:
    """The environment entries :func:`app_from_env` reads in each worker."""
    return {
        ENV_CONFIG: "" if config is None else str(Path(config).resolve()),
        ENV_SERVER: json.dumps(server),
        ENV_METRICS: str(metrics_dir),
    }


def app_from_env() -> Any:
    """uvicorn's app factory in a worker: the settings of :data:`ENV_CONFIG` + :data:`ENV_SERVER`."""
    from router.server.app import create_app
    from router.server.settings import RouterSettings

    path = os.environ.get(ENV_CONFIG) or None
    server = json.loads(os.environ.get(ENV_SERVER) or "{}")
    settings = RouterSettings.load(path, **({"server": server} if server else {}))
    app = create_app(settings)
    if os.environ.get(ENV_METRICS):
        from router.server.metrics.workers import WorkerMetrics

        share = WorkerMetrics(app.state.metrics, Path(os.environ[ENV_METRICS])).start()
        app.state.metrics.render = share.render  # the /metrics route answers the merged view
        app.state.metrics_share = share
    return app
