"""Model-bundle hot reload: ``POST /admin/reload`` and a file watcher, with an atomic swap.

Algorithm: the serving pair (predictor, policy) lives in one immutable :class:`Serving` object that
the proxy reads once per request (``holder.current``). A reload loads the bundle in a worker thread
(``ModelBundle.load`` refuses a corrupt or mismatched bundle with ``BundleError``), builds the
policy from the same config with the new bundle, and only then replaces ``current`` in one
assignment. Requests already running keep the pair they read; a failed load leaves the old pair
serving, counts ``runroute_bundle_reloads_total{result="refused"}`` and logs the reason.

The watcher polls the bundle path every ``watch_s`` seconds and reloads when the newest mtime
of the path (and, for a directory, its direct children) changes. ``watch_s = 0`` turns it off.
An MLflow source (``models:/name@alias``) is reloaded on ``/admin/reload`` only.

With no bundle source (a baseline policy without a model), the predictor is
:class:`models.predictor.ConstantPredictor` (``p_frontier = 0``) so snapshots and logs still carry
predictions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.server.background import BackgroundTask

__all__ = ["Serving", "BundleHolder", "load_bundle"]

log = logging.getLogger("runroute.bundle")


@dataclass(frozen=True)
class Serving:
    predictor: Any  # ModelBundle or any object with .predict(prefix) -> Predictions
    policy: Any  # router.policy.types.Policy
    version: str


def load_bundle(
    path: str | Path | None = None, mlflow_uri: str | None = None, tracking_uri: str | None = None
) -> Any:
    """Load a ModelBundle from a path, or from an MLflow registry URI (downloads its artifacts)."""
    from models.bundle import ModelBundle

    if mlflow_uri is not None:
        import mlflow  # heavy: only when the registry is used

        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        local = mlflow.artifacts.download_artifacts(artifact_uri=mlflow_uri)
        return ModelBundle.load(local)
    if path is None:
        raise ValueError("no bundle source")
    return ModelBundle.load(path)


def _signature(p: Path) -> float | None:
    try:
        m = p.stat().st_mtime
        if p.is_dir():
            for c in p.iterdir():
                m = max(m, c.stat().st_mtime)
        return m
    except OSError:
        return None


class BundleHolder(BackgroundTask):
    """Owns the serving (predictor, policy) pair; see the module docstring."""

    def __init__(
        self,
        policy_factory: Callable[[Any], Any],
        *,
        path: Path | None = None,
        mlflow_uri: str | None = None,
        tracking_uri: str | None = None,
        watch_s: float = 0.0,
        loader: Callable[[], Any] | None = None,
        metrics: Any = None,
    ):
        self.policy_factory = policy_factory
        self.path = Path(path) if path is not None else None
        self.mlflow_uri, self.tracking_uri = mlflow_uri, tracking_uri
        self.watch_s = watch_s
        self._loader = loader
        self.metrics = metrics
        self.current: Serving | None = None
        self.last_error: str | None = None
        self._sig: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def has_source(self) -> bool:
        return self._loader is not None or self.path is not None or self.mlflow_uri is not None

    def install(self, predictor: Any) -> Serving:
        """Build the policy for ``predictor`` and swap it in (also used for injected bundles)."""
        policy = self.policy_factory(predictor)
        version = str(getattr(predictor, "version", "unknown"))
        self.current = Serving(predictor, policy, version)
        if self.metrics is not None:
            self.metrics.set_bundle(version)
        return self.current

    def _load_sync(self) -> Any:
        if self._loader is not None:
            return self._loader()
        return load_bundle(self.path, self.mlflow_uri, self.tracking_uri)

    async def reload(self) -> Serving:
        """Load + swap; on failure keep the old pair and re-raise (BundleError / OSError / ...)."""
        async with self._lock:
            sig = _signature(self.path) if self.path is not None else None
            try:
                predictor = await asyncio.to_thread(self._load_sync)
                serving = self.install(predictor)
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                if self.metrics is not None:
                    self.metrics.bundle_reloads.labels("refused").inc()
                log.error(
                    "bundle reload refused, still serving %s: %s",
                    self.current.version if self.current else "nothing",
                    self.last_error,
                )
                self._sig = sig  # do not retry the same bad file on every poll
                raise
            self._sig = sig
            self.last_error = None
            if self.metrics is not None:
                self.metrics.bundle_reloads.labels("ok").inc()
            log.info("bundle %s serving", serving.version)
            return serving

    async def _watch(self) -> None:
        assert self.path is not None
        while True:
            await asyncio.sleep(self.watch_s)
            sig = _signature(self.path)
            if sig is not None and sig != self._sig:
                with contextlib.suppress(Exception):
                    await self.reload()

    def start(self) -> None:
        if self.watch_s > 0 and self.path is not None:
            self._start_task(self._watch)
