"""`ModelBundle`: the fitted predictors + feature-spec version + thresholds + manifest, as one artifact.

On disk a bundle is a directory with two files:

- ``bundle.joblib``: a dict of the fitted estimators (escalation, cache reuse, remaining steps,
  remaining tokens, the per-domain benefit model; all but the first optional) and the thresholds.
- ``manifest.json``: ``schema`` (:data:`MANIFEST_SCHEMA`), ``feature_spec_version``,
  ``feature_names``, ``bundle_sha256`` (of ``bundle.joblib``), ``thresholds``, ``libraries``
  (versions it was trained with), ``training_data_sha256``, ``metrics``, ``params``,
  ``created_at``.

:meth:`ModelBundle.load` checks, in order: the manifest parses and has this schema; the feature
spec version and names equal :mod:`features.extract`'s (a bundle trained on another layout would
silently mispredict); the sha256 of ``bundle.joblib`` equals the manifest's (a truncated or altered
file); the file unpickles into the expected objects. Any failure raises :class:`BundleError` with a
one-line reason. Library version differences only warn. The hash guards against corruption, not
against a malicious file: load bundles only from places you trust (joblib is pickle).

Registry (:meth:`ModelBundle.load_registered`): a bundle logged by ``training.mlflow_log`` is an
MLflow model whose artifacts hold the bundle directory; ``models:/NAME@ALIAS`` or
``models:/NAME/VERSION`` is fetched into a temporary directory and verified exactly like a path
(:func:`resolve_registered` tells which version an alias points at without downloading).
:func:`default_tracking_uri` is the one default tracking URI of training and serving.

Serving fast path (:meth:`ModelBundle.predict`): features are written into a pre-allocated (1, n)
float64 buffer and the boosters predict it through LightGBM's single-row C API (the scikit-learn
wrappers' input validation costs ~20x more per row); calibration is one ``np.interp``. By default
(``merge_boosters=True``) the six boosters are merged into one booster of six outputs
(:mod:`models.forest`: one C call per row, the same values); bundles it cannot merge (categorical
splits, linear trees, other objectives' transforms) keep one call per booster, said in a log line,
as does ``merge_boosters=False``. The buffer makes :meth:`predict` not thread-safe: use one bundle
per thread (asyncio is fine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from features.extract import FEATURE_NAMES, FEATURE_SPEC_VERSION, N_FEATURES, extract
from features.prefix import RunPrefix
from models.forest import MergedPredictor, Unsupported, fast_row_config
from models.types import Predictions

__all__ = [
    "BundleError",
    "ModelBundle",
    "MANIFEST_SCHEMA",
    "BUNDLE_FILE",
    "MANIFEST_FILE",
    "file_sha256",
    "parse_model_uri",
    "resolve_registered",
    "default_tracking_uri",
]

MANIFEST_SCHEMA = "runroute-bundle/1"
BUNDLE_FILE = "bundle.joblib"
MANIFEST_FILE = "manifest.json"
_REQUIRED = ("schema", "feature_spec_version", "feature_names", "bundle_sha256", "thresholds", "libraries")
_THRESHOLD_KEYS = ("p_frontier_up", "p_frontier_down")
_log = logging.getLogger(__name__)


class _RowPredictor:
    """One LightGBM booster bound to one float64 row buffer through the C API's single-row fast path
    (``LGBM_BoosterPredictForMatSingleRowFast``: the prediction config is prepared once, each call is
    one C call, ~10x less overhead than ``Booster.predict``, which rebuilds a predictor per call).
    Output is the transformed prediction (probability for the binary objective). Not thread-safe."""

    def __init__(self, booster: Any, row: np.ndarray) -> None:
        import ctypes

        from lightgbm.basic import _safe_call
        from lightgbm.libpath import _LIB  # where lightgbm.basic takes it from (the same CDLL)

        if row.dtype != np.float64 or not row.flags.c_contiguous:
            raise TypeError("row buffer must be C-contiguous float64")
        self._lib, self._check = _LIB, _safe_call
        self._booster = booster  # keeps the handle alive
        self._row = row
        self._cfg = fast_row_config(booster, row, raw=False)
        self._out = ctypes.c_double(0.0)  # read back as a Python float (``.value``): no numpy scalar
        self._out_len = ctypes.c_int64(0)
        self._args = (
            self._cfg,
            ctypes.c_void_p(row.ctypes.data),
            ctypes.byref(self._out_len),
            ctypes.byref(self._out),
        )
        self._fn = _LIB.LGBM_BoosterPredictForMatSingleRowFast

    def __call__(self) -> float:
        if self._fn(*self._args):  # non-zero: LightGBM's error, raised as lightgbm raises it
            self._check(-1)
        return self._out.value

    def __del__(self) -> None:
        cfg = getattr(self, "_cfg", None)
        if cfg is not None and cfg.value:
            self._lib.LGBM_FastConfigFree(cfg)


class BundleError(ValueError):
    """A model bundle cannot be saved or loaded; the message is one line meant for a person."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    import joblib
    import lightgbm
    import sklearn

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scikit-learn": sklearn.__version__,
        "lightgbm": lightgbm.__version__,
        "joblib": joblib.__version__,
    }


@dataclass
class ModelBundle:
    """Fitted predictors with their thresholds and manifest. See the module docstring.

    ``escalation`` is required (an :class:`~models.escalation.EscalationClassifier`); the others
    may be None, in which case :class:`Predictions` defaults are returned for them.
    ``merge_boosters``: predict through one merged booster (:mod:`models.forest`; default) or one
    C call per booster (the form before it; also the fallback for a bundle it cannot merge).
    """

    escalation: Any
    cache_reuse: Any = None
    remaining_steps: Any = None
    remaining_tokens: Any = None
    benefit: Any = None  # models.benefit.BenefitModel (per-domain, gated) or None
    thresholds: dict[str, float] = field(
        default_factory=lambda: {"p_frontier_up": 0.5, "p_frontier_down": 0.4}
    )
    manifest: dict[str, Any] = field(default_factory=dict)
    merge_boosters: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        missing = [k for k in _THRESHOLD_KEYS if k not in self.thresholds]
        if missing:
            raise BundleError(f"thresholds lack {missing}")
        if self.thresholds["p_frontier_down"] > self.thresholds["p_frontier_up"]:
            raise BundleError("thresholds: p_frontier_down must be <= p_frontier_up (hysteresis)")
        self._buf = np.zeros((1, N_FEATURES), dtype=np.float64)
        self._fast: tuple[Any, ...] | None = None
        self._merged: MergedPredictor | None = None
        self._unmerged = False  # prepared as one call per booster (switched off, or cannot merge)

    def _boosters(self) -> list[Any]:
        """The boosters in the merged predictor's output order: escalation, cache reuse (if any),
        remaining steps' quantiles, remaining tokens' quantiles."""
        out = [self.escalation.booster_]
        if self.cache_reuse is not None:
            out.append(self.cache_reuse.booster_)
        for model in (self.remaining_steps, self.remaining_tokens):
            if model:
                out.extend(model.boosters_)
        return out

    def _prepare_merged(self) -> MergedPredictor | None:
        """The merged predictor bound to :attr:`_buf`, or None (one call per booster)."""
        merged = None
        if self.merge_boosters:
            try:
                merged = MergedPredictor(self._boosters(), self._buf)
            except Unsupported as e:
                _log.warning(
                    "bundle %s: one LightGBM call per booster (cannot merge them: %s)", self.version, e
                )
        self._merged = merged
        self._unmerged = merged is None
        return merged

    def _prepare_fast(self) -> tuple[Any, ...]:
        """Row predictors bound to :attr:`_buf`: (escalation, cache, [steps...], [tokens...])."""
        row = self._buf
        esc = _RowPredictor(self.escalation.booster_, row)
        cache = _RowPredictor(self.cache_reuse.booster_, row) if self.cache_reuse is not None else None
        steps = (
            [_RowPredictor(b, row) for b in self.remaining_steps.boosters_] if self.remaining_steps else []
        )
        toks = (
            [_RowPredictor(b, row) for b in self.remaining_tokens.boosters_] if self.remaining_tokens else []
        )
        self._fast = (esc, cache, steps, toks)
        return self._fast

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fast"] = None  # C handles are per process
        state["_merged"] = None
        state["_unmerged"] = False
        return state

    # ------------------------------------------------------------------ serving

    @property
    def version(self) -> str:
        sha = str(self.manifest.get("bundle_sha256", "unsaved"))
        return f"{self.manifest.get('feature_spec_version', FEATURE_SPEC_VERSION)}-{sha[:12]}"

    needs_features: ClassVar[bool] = True  # models.predictor.Predictor: reads the feature vector

    #: the step engine asks :meth:`predict_context` (vector + the run's domain and task embedding)
    reads_run_context: ClassVar[bool] = True

    def predict(self, prefix: RunPrefix) -> Predictions:
        """Features + all predictions for one arriving step (the router's fast path)."""
        extract(prefix, out=self._buf[0])
        return self._predict_buf(self._benefit_fields(prefix))

    def predict_context(self, x: np.ndarray, prefix: RunPrefix) -> Predictions:
        """:meth:`predict_features` plus the benefit fields from the run's ``domain`` and
        ``task_embedding`` (:class:`models.benefit.BenefitModel`; a run without a domain keeps the
        escalation classifier's ``p_frontier`` alone)."""
        self._fill(x)
        return self._predict_buf(self._benefit_fields(prefix))

    def _benefit_fields(self, prefix: RunPrefix) -> dict[str, Any]:
        """The benefit model's fields of :class:`Predictions` for the row in :attr:`_buf` (none
        without a benefit model or a domain); set when the predictions are built, not by a copy."""
        if self.benefit is None or prefix.domain is None:
            return {}
        pl, pf, mode, reason = self.benefit.predict(self._buf[0], prefix.task_embedding, prefix.domain)
        if not self.benefit.uses_uplift(prefix.domain):  # prior policy = the escalation classifier
            return {"domain_mode": mode, "domain_reason": reason}
        return {
            "p_success_local": pl,
            "p_success_frontier": pf,
            "benefit": pf - pl,
            "domain_mode": mode,
            "domain_reason": reason,
        }

    def domain_mode(self, domain: str | None) -> tuple[str, str] | None:
        """``(mode, reason)`` a run of ``domain`` is served in; None without a benefit model."""
        return None if self.benefit is None else self.benefit.mode(domain)

    def predict_features(self, x: np.ndarray) -> Predictions:
        """Predictions for one feature vector (layout :data:`features.extract.FEATURE_NAMES`)."""
        self._fill(x)
        return self._predict_buf()

    def _fill(self, x: np.ndarray) -> None:
        row = np.asarray(x, dtype=np.float64).reshape(-1)
        if row.shape[0] != N_FEATURES:
            raise ValueError(f"expected {N_FEATURES} features ({FEATURE_SPEC_VERSION}), got {row.shape[0]}")
        self._buf[0, :] = row

    def predict_batch(self, X: np.ndarray) -> list[Predictions]:
        """Predictions for each row of ``X`` (same values as :meth:`predict_features` row by row)."""
        return [self.predict_features(row) for row in np.asarray(X, dtype=np.float64)]

    def _outputs(self) -> tuple[float, float | None, list[float], list[float]]:
        """The boosters' predictions for :attr:`_buf`: escalation (raw probability), cache reuse
        (None without the model), remaining steps' and tokens' quantiles (raw, unsorted)."""
        merged = self._merged
        if merged is None and not self._unmerged:
            merged = self._prepare_merged()
        if merged is not None:
            out = merged()
            i = 2 if self.cache_reuse is not None else 1
            n = len(self.remaining_steps.boosters_) + i if self.remaining_steps else i
            return out[0], out[1] if i == 2 else None, out[i:n], out[n:]
        esc, cache_p, steps_p, toks_p = self._fast or self._prepare_fast()
        return (
            esc(),
            cache_p() if cache_p is not None else None,
            [f() for f in steps_p],
            [f() for f in toks_p],
        )

    def _predict_buf(self, extra: Mapping[str, Any] | None = None) -> Predictions:
        e, raw, zs, zt = self._outputs()
        x = self._buf
        p = float(np.interp(e, self.escalation.calib_x_, self.escalation.calib_y_))
        cache = 0.0
        if raw is not None:
            col = self.cache_reuse.prompt_col
            cache = raw if col is None else min(max(raw, 0.0), 1.0) * max(float(x[0, col]), 0.0)
        s50 = s90 = 1.0
        t50 = t90 = 0.0
        if zs:
            qs = self.remaining_steps.finish_fast(zs)
            s50, s90 = max(qs[0], 1.0), max(qs[-1], 1.0)
        if zt:
            qt = self.remaining_tokens.finish_fast(zt)
            t50, t90 = max(qt[0], 0.0), max(qt[-1], 0.0)
        if extra:
            return Predictions(
                p_frontier=min(max(p, 0.0), 1.0),
                cache_reuse_tokens=max(cache, 0.0),
                remaining_steps_p50=s50,
                remaining_steps_p90=s90,
                remaining_tokens_p50=t50,
                remaining_tokens_p90=t90,
                **extra,
            )
        # positional (Predictions' field order): no keyword dict per step
        return Predictions(min(max(p, 0.0), 1.0), max(cache, 0.0), s50, s90, t50, t90)

    # ------------------------------------------------------------------ persistence

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        metrics: Mapping[str, Any] | None = None,
        training_data_sha256: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``bundle.joblib`` + ``manifest.json`` into directory ``path`` (created; files replaced
        atomically). Returns the directory. Updates :attr:`manifest`."""
        import joblib

        d = Path(path)
        if d.exists() and not d.is_dir():
            raise BundleError(f"{d}: exists and is not a directory")
        d.mkdir(parents=True, exist_ok=True)
        payload = {
            "escalation": self.escalation,
            "cache_reuse": self.cache_reuse,
            "remaining_steps": self.remaining_steps,
            "remaining_tokens": self.remaining_tokens,
            "benefit": self.benefit,
            "thresholds": dict(self.thresholds),
        }
        fd, tmp = tempfile.mkstemp(prefix=".bundle.", suffix=".tmp", dir=d)
        os.close(fd)
        try:
            joblib.dump(payload, tmp, compress=3)
            sha = file_sha256(tmp)
            os.replace(tmp, d / BUNDLE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        man = dict(self.manifest)
        man.update(
            schema=MANIFEST_SCHEMA,
            feature_spec_version=FEATURE_SPEC_VERSION,
            feature_names=list(FEATURE_NAMES),
            bundle_file=BUNDLE_FILE,
            bundle_sha256=sha,
            thresholds={k: float(v) for k, v in self.thresholds.items()},
            libraries=library_versions(),
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        man["domains"] = self.benefit.summary() if self.benefit is not None else {}
        if metrics is not None:
            man["metrics"] = _jsonable(dict(metrics))
        if training_data_sha256 is not None:
            man["training_data_sha256"] = training_data_sha256
        if params is not None:
            man["params"] = _jsonable(dict(params))
        man.setdefault("metrics", {})
        man.setdefault("training_data_sha256", None)
        tmpm = d / f".{MANIFEST_FILE}.tmp"
        tmpm.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
        os.replace(tmpm, d / MANIFEST_FILE)
        self.manifest = man
        return d

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelBundle:
        """Load and verify a bundle directory (see the module docstring); raises :class:`BundleError`."""
        d = Path(path)
        if not d.exists():
            raise BundleError(f"{d}: no such bundle directory")
        if not d.is_dir():
            raise BundleError(f"{d}: a bundle is a directory holding {BUNDLE_FILE} and {MANIFEST_FILE}")
        mpath, bpath = d / MANIFEST_FILE, d / BUNDLE_FILE
        if not mpath.exists():
            raise BundleError(f"{d}: missing {MANIFEST_FILE}")
        if not bpath.exists():
            raise BundleError(f"{d}: missing {BUNDLE_FILE}")
        try:
            man = json.loads(mpath.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise BundleError(f"{mpath}: not valid JSON ({e})") from None
        if not isinstance(man, dict):
            raise BundleError(f"{mpath}: manifest must be a JSON object")
        if man.get("schema") != MANIFEST_SCHEMA:
            raise BundleError(f"{mpath}: manifest schema {man.get('schema')!r}, expected {MANIFEST_SCHEMA!r}")
        lacking = [k for k in _REQUIRED if k not in man]
        if lacking:
            raise BundleError(f"{mpath}: manifest lacks {lacking}")
        if man["feature_spec_version"] != FEATURE_SPEC_VERSION:
            raise BundleError(
                f"{d}: trained on feature spec {man['feature_spec_version']!r}, this runroute extracts "
                f"{FEATURE_SPEC_VERSION!r}; retrain the bundle (runroute train)"
            )
        if list(man["feature_names"]) != list(FEATURE_NAMES):
            raise BundleError(
                f"{d}: feature names differ from spec {FEATURE_SPEC_VERSION} although the version matches"
            )
        sha = file_sha256(bpath)
        if sha != man["bundle_sha256"]:
            raise BundleError(
                f"{bpath}: sha256 {sha[:12]}... does not match the manifest's {str(man['bundle_sha256'])[:12]}... "
                "(corrupt or altered file)"
            )
        import joblib

        try:
            payload = joblib.load(bpath)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt bundle
            raise BundleError(f"{bpath}: cannot be read ({type(e).__name__}: {e})") from None
        if not isinstance(payload, dict) or "escalation" not in payload:
            raise BundleError(f"{bpath}: not a runroute bundle payload")
        for name in ("escalation", "cache_reuse", "remaining_steps", "remaining_tokens"):
            est = payload.get(name)
            if est is None:
                continue
            n_in = getattr(est, "n_features_in_", None)
            if n_in != N_FEATURES:
                raise BundleError(f"{bpath}: {name} expects {n_in} features, spec has {N_FEATURES}")
        here = library_versions()
        for lib in ("scikit-learn", "lightgbm"):
            was = man["libraries"].get(lib)
            if was != here[lib]:
                warnings.warn(f"bundle {d} was trained with {lib} {was}, running {here[lib]}", stacklevel=2)
        try:
            bundle = cls(
                escalation=payload["escalation"],
                cache_reuse=payload.get("cache_reuse"),
                remaining_steps=payload.get("remaining_steps"),
                remaining_tokens=payload.get("remaining_tokens"),
                benefit=payload.get("benefit"),
                thresholds={k: float(v) for k, v in payload["thresholds"].items()},
                manifest=man,
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BundleError(f"{bpath}: malformed payload ({e})") from None
        try:  # the merged booster now, not on the first request (tens of ms)
            bundle._prepare_merged()
        except (KeyError, TypeError, AttributeError) as e:
            raise BundleError(f"{bpath}: malformed payload ({e})") from None
        return bundle

    @classmethod
    def load_registered(
        cls, uri: str, tracking_uri: str | None = None, *, version: str | None = None
    ) -> ModelBundle:
        """Load the bundle registered in MLflow as ``uri`` (``models:/NAME@ALIAS`` or
        ``models:/NAME/VERSION``; imports mlflow, ~1.4 s: for start-up and reloads, never for the
        request path). ``version``: the registry version ``uri`` resolved to (see
        :func:`resolve_registered`); when given, that version is fetched, so an alias that moves
        during the download cannot mix two versions. The artifacts go to a temporary directory
        (the bundle is read into memory) and are verified like :meth:`load`; the bundle's
        ``manifest["registry"]`` records the name, version and uri. Raises :class:`BundleError`."""
        name, ref = parse_model_uri(uri)
        import mlflow

        if version is None and not ref.startswith("@"):
            version = ref
        fetch = f"models:/{name}/{version}" if version is not None else uri
        with tempfile.TemporaryDirectory(prefix="runroute-registry-") as tmp:
            try:
                local = Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=fetch, dst_path=tmp, tracking_uri=tracking_uri, registry_uri=tracking_uri
                    )
                )
            except Exception as e:  # noqa: BLE001 - registry errors become one line
                raise BundleError(f"{uri}: cannot be fetched ({type(e).__name__}: {e})") from None
            hits = sorted(p.parent for p in local.rglob(MANIFEST_FILE))
            if len(hits) != 1:
                raise BundleError(
                    f"{uri}: the registered model holds {len(hits)} {MANIFEST_FILE} files, expected 1"
                )
            bundle = cls.load(hits[0])
        bundle.manifest = {**bundle.manifest, "registry": {"uri": uri, "name": name, "version": version}}
        return bundle


def default_tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working
    directory: the one default of the training job and the router's registry source."""
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def parse_model_uri(uri: str) -> tuple[str, str]:
    """``models:/NAME@ALIAS`` -> (NAME, "@ALIAS"); ``models:/NAME/VERSION`` -> (NAME, "VERSION").
    Anything else raises :class:`BundleError` (one line)."""
    if not isinstance(uri, str) or not uri.startswith("models:/"):
        raise BundleError(f"{uri!r}: a registry URI looks like models:/NAME@ALIAS or models:/NAME/VERSION")
    rest = uri[len("models:/") :]
    if "@" in rest:
        name, _, alias = rest.partition("@")
        if name and alias and "/" not in name and "/" not in alias:
            return name, "@" + alias
    else:
        name, _, ver = rest.partition("/")
        if name and ver.isdigit():
            return name, ver
    raise BundleError(f"{uri!r}: a registry URI looks like models:/NAME@ALIAS or models:/NAME/VERSION")


def resolve_registered(uri: str, tracking_uri: str | None = None) -> str:
    """The registry version ``uri`` points at now (one registry call, no download): the alias's
    current version, or the version itself. Raises :class:`BundleError` when it cannot be resolved."""
    name, ref = parse_model_uri(uri)
    if not ref.startswith("@"):
        return ref
    from mlflow import MlflowClient

    try:
        mv = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_by_alias(
            name, ref[1:]
        )
    except Exception as e:  # noqa: BLE001 - registry errors become one line
        raise BundleError(f"{uri}: cannot be resolved ({type(e).__name__}: {e})") from None
    return str(mv.version)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if f != f else f
    if isinstance(v, np.bool_):
        return bool(v)
    return v
