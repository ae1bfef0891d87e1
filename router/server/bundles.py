"""Model-bundle hot reload from a path or the MLflow registry, with an atomic swap.

Algorithm: the serving pair (predictor, policy) lives in one immutable :class:`Serving` object that
the proxy reads once per request (``holder.current``). A reload loads the bundle in a worker thread
through the one loader :func:`load_bundle` (a path: ``ModelBundle.load``; a registry URI
``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``: the version it points at is resolved first,
then that version is fetched and verified by ``ModelBundle.load_registered``; either refuses a
corrupt or mismatched bundle with ``BundleError``), builds the policy from the same config with
the new bundle, exercises every part of the new pair the request path uses (:func:`exercise`: the
predictor with and without each domain, the benefit model's modes), and only then replaces
``current`` in one assignment. Requests already running keep
the pair they read; a failed load leaves the old pair serving, counts
``runroute_bundle_reloads_total{result="refused"}``, keeps the reason in ``last_error`` (shown by
``GET /ready``) and logs it.

Following a source (``watch_s`` seconds between probes; 0 turns it off), the same refusal rules for
both kinds:

- a path: the newest mtime of the path (and, for a directory, its direct children);
- a registry alias: the version the alias points at (one registry call per probe, no download);
  when it differs from the version last tried, that version is loaded. A refused version is not
  retried on every probe: the holder waits until the alias moves again (or ``POST /admin/reload``,
  which always tries). A fixed ``models:/NAME/VERSION`` never changes, so it is not probed.

mlflow is imported only when a registry source is configured (in the worker thread), never on the
request path.

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
from typing import TYPE_CHECKING, Any

from router.server.background import BackgroundTask

if TYPE_CHECKING:
    from models.predictor import Predictor
    from router.policy.types import Policy
    from router.server.metrics.registry import RouterMetrics

__all__ = ["Serving", "BundleHolder", "load_bundle", "resolve_source", "exercise"]

log = logging.getLogger("runroute.bundle")


@dataclass(frozen=True)
class Serving:
    predictor: Any  # ModelBundle or any object with .predict(prefix) -> Predictions
    policy: Any  # router.policy.types.Policy
    version: str
    registry_version: str | None = None  # the MLflow model version, for a registry source


def resolve_source(mlflow_uri: str, tracking_uri: str | None = None) -> str:
    """The registry version ``mlflow_uri`` points at now (``BundleError`` when it cannot be resolved)."""
    from models.bundle import resolve_registered

    return resolve_registered(mlflow_uri, tracking_uri)


def load_bundle(
    path: str | Path | None = None,
    mlflow_uri: str | None = None,
    tracking_uri: str | None = None,
    *,
    version: str | None = None,
) -> Any:
    """The one loader: a ModelBundle from a path, or from a registry URI (``version``: the registry
    version the URI was resolved to; resolved here when None)."""
    from models.bundle import ModelBundle

    if mlflow_uri is not None:
        if version is None:
            version = resolve_source(mlflow_uri, tracking_uri)
        return ModelBundle.load_registered(mlflow_uri, tracking_uri, version=version)
    if path is None:
        raise ValueError("no bundle source")
    return ModelBundle.load(path)


def exercise(serving: Serving) -> None:
    """Use every part of a new serving pair the request path uses, before it serves: the
    predictor on a run prefix without a domain and on one of each domain its benefit model knows
    (and one it does not), the benefit model's ``mode`` for each of them and its ``domains``
    table (``GET /v1/runs/{id}``, ``/metrics``). Raises (``BundleError``) on the first failure,
    so a broken part is refused at reload instead of answering 500 on the request path."""
    from features.prefix import RunPrefix
    from models.bundle import BundleError

    pred = serving.predictor
    benefit = getattr(pred, "benefit", None)
    domains: list[str | None] = [None]
    try:
        if benefit is not None:
            table = benefit.domains
            for d, dm in table.items():
                if not isinstance(d, str) or not isinstance(dm.mode, str) or not isinstance(dm.reason, str):
                    raise TypeError(f"benefit domain {d!r} has no mode/reason")
            domains += [*table, "runroute-unseen-domain"]
            for d in domains[1:]:
                mode, reason = benefit.mode(d)
                if not isinstance(mode, str) or not isinstance(reason, str):
                    raise TypeError(f"benefit.mode({d!r}) is not (mode, reason)")
        for d in domains:
            pred.predict(RunPrefix(run_id="runroute-reload-check", new_prompt_tokens=1000, domain=d))
    except BundleError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the new bundle is a refusal
        raise BundleError(f"bundle fails when used ({type(e).__name__}: {e})") from e


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
        policy_factory: Callable[[Predictor], Policy],
        *,
        path: Path | None = None,
        mlflow_uri: str | None = None,
        tracking_uri: str | None = None,
        watch_s: float = 0.0,
        loader: Callable[[], Predictor] | None = None,
        metrics: RouterMetrics | None = None,
    ):
        self.policy_factory = policy_factory
        self.path = Path(path) if path is not None else None
        self.mlflow_uri, self.tracking_uri = mlflow_uri, tracking_uri
        self.watch_s = watch_s
        self._loader = loader
        self.metrics = metrics
        self.current: Serving | None = None
        self.last_error: str | None = None  # why the last reload was refused (None: it was not)
        self.probe_error: str | None = None  # why the source cannot be probed now (registry down)
        self._sig: Any = None  # file mtime, or the registry version last tried
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def has_source(self) -> bool:
        return self._loader is not None or self.path is not None or self.mlflow_uri is not None

    @property
    def follows(self) -> bool:
        """Whether the watcher has something that can change (a path or a registry alias)."""
        if self.path is not None:
            return True
        return self.mlflow_uri is not None and "@" in self.mlflow_uri

    def install(self, predictor: Predictor, registry_version: str | None = None) -> Serving:
        """Build the policy for ``predictor``, exercise every part of the new pair
        (:func:`exercise`) and only then swap it in (also used for injected bundles); a pair that
        fails leaves the old one serving (the exception propagates)."""
        policy = self.policy_factory(predictor)
        version = str(getattr(predictor, "version", "unknown"))
        serving = Serving(predictor, policy, version, registry_version)
        exercise(serving)
        self.current = serving
        if self.metrics is not None:
            self.metrics.set_bundle(version, registry_version)
            self.metrics.set_domains(getattr(predictor, "benefit", None))
        return self.current

    def _probe_sync(self) -> Any:
        """The source's current signature (mtime / registry version); None when unknown."""
        if self.path is not None:
            return _signature(self.path)
        if self.mlflow_uri is not None:
            return resolve_source(self.mlflow_uri, self.tracking_uri)
        return None

    def _load_sync(self, sig: Any) -> Any:
        if self._loader is not None:
            return self._loader()
        if self.mlflow_uri is not None:
            return load_bundle(mlflow_uri=self.mlflow_uri, tracking_uri=self.tracking_uri, version=sig)
        return load_bundle(self.path)

    async def reload(self) -> Serving:
        """Resolve, load and swap; on failure keep the old pair and re-raise (BundleError / OSError)."""
        async with self._lock:
            sig = None
            try:
                sig = await asyncio.to_thread(self._probe_sync)
                predictor = await asyncio.to_thread(self._load_sync, sig)
                serving = self.install(predictor, sig if self.mlflow_uri is not None else None)
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                if self.metrics is not None:
                    self.metrics.bundle_reloaded(False)
                log.error(
                    "bundle reload refused, still serving %s: %s",
                    self.current.version if self.current else "nothing",
                    self.last_error,
                )
                if sig is not None:
                    self._sig = sig  # do not retry the same bad file / version on every probe
                raise
            self._sig = sig
            self.last_error = None
            if self.metrics is not None:
                self.metrics.bundle_reloaded(True)
            log.info(
                "bundle %s serving%s",
                serving.version,
                f" (registry version {sig})" if self.mlflow_uri is not None else "",
            )
            return serving

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                sig = await asyncio.to_thread(self._probe_sync)
            except Exception as e:  # noqa: BLE001 - a registry outage: keep serving, say so once
                msg = f"{type(e).__name__}: {e}"
                if msg != self.probe_error:
                    log.warning("bundle source cannot be probed, still serving: %s", msg)
                    self.probe_error = msg
                continue
            self.probe_error = None
            if sig is not None and sig != self._sig:
                with contextlib.suppress(Exception):
                    await self.reload()

    def start(self) -> None:
        if self.watch_s > 0 and self.follows:
            self._start_task(self._watch)
