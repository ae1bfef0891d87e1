"""Several single-output LightGBM boosters as one booster: one C call predicts a row through all.

Why: the sidecar predicts one row per request through six boosters (escalation, cache reuse, two
remaining-steps and two remaining-tokens quantiles), one ``LGBM_BoosterPredictForMatSingleRowFast``
call each. Merged into one booster of six outputs, the six walks are one call: one ctypes call, one
lock, one row conversion and one predictor set-up in LightGBM instead of six, and the trees of all
six models are allocated one after another when the merged model is loaded.

Algorithm: each booster's model text (``model_to_string``) is cut into its trees; the merged text
declares ``num_tree_per_iteration = K`` (K boosters) and interleaves the trees, tree ``i`` of booster
``k`` as tree ``i * K + k``, so LightGBM's ``GBDT::PredictRaw`` adds booster ``k``'s trees to output
``k`` in their own order: each raw output is the same double as the booster's own (the trees' text
is LightGBM's own round-trip format, copied as is). A booster with fewer trees is padded at the end
with one-leaf trees of value 0 (``x + 0.0 == x``). The row is predicted as raw scores
(``C_API_PREDICT_RAW_SCORE``) and each booster's objective transform is applied here: the identity
(regression, regression_l1, quantile, huber, fair, mape) or binary's sigmoid,
``1 / (1 + exp(-sigmoid * raw))`` as LightGBM computes it.

What it does not merge (:class:`Unsupported`; the caller keeps one call per booster): multi-class
boosters (several trees per iteration), ``average_output`` (random forest), linear trees,
categorical splits, boosters reading different numbers of features, objectives with another
transform (``sqrt``, poisson, gamma, tweedie, cross-entropy, ...).
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MergedPredictor", "Unsupported", "merged_model_string", "output_transform"]

_IDENTITY = frozenset({"regression", "regression_l1", "quantile", "huber", "fair", "mape"})
_TREE_START = re.compile(r"^Tree=\d+$", re.M)
# a padding tree: one leaf of value 0, written as LightGBM writes a one-leaf tree
_PAD_TREE = (
    "num_leaves=1\nnum_cat=0\nsplit_feature=\nsplit_gain=\nthreshold=\ndecision_type=\nleft_child=\n"
    "right_child=\nleaf_value=0\nleaf_weight=\nleaf_count=\ninternal_value=\ninternal_weight=\n"
    "internal_count=\nis_linear=0\nshrinkage=1"
)


class Unsupported(ValueError):
    """The boosters cannot be merged exactly; the message says why (one line)."""


def output_transform(objective: str) -> float | None:
    """``None`` for an objective whose output is the raw score, else binary's sigmoid scale;
    :class:`Unsupported` for any other transform."""
    parts = objective.split()
    name = parts[0] if parts else ""
    opts = {key: val for key, _, val in (p.partition(":") for p in parts[1:])}
    if name in _IDENTITY:
        if "sqrt" in opts:
            raise Unsupported(f"objective {objective!r}: its sqrt transform is not reproduced")
        return None
    if name == "binary":
        try:
            s = float(opts.get("sigmoid", "1"))
        except ValueError:
            raise Unsupported(f"objective {objective!r}: unreadable sigmoid") from None
        if not (math.isfinite(s) and s > 0.0):
            raise Unsupported(f"objective {objective!r}: sigmoid must be > 0")
        return s
    raise Unsupported(f"objective {objective!r}: its transform is not reproduced")


def _split(text: str) -> tuple[dict[str, str], list[str]]:
    """A model text's header (key -> value) and its trees' bodies (the lines after ``Tree=N``)."""
    end = text.find("\nend of trees")
    if end < 0:
        raise Unsupported("model text without 'end of trees'")
    starts = [m.start() for m in _TREE_START.finditer(text, 0, end)]
    head_end = starts[0] if starts else end
    header: dict[str, str] = {}
    for line in text[:head_end].splitlines():
        key, _, val = line.partition("=")  # a flag such as average_output has no value
        if key.strip():
            header[key.strip()] = val.strip()
    bodies = []
    for a, b in zip(starts, [*starts[1:], end], strict=True):
        body = text[a:b].split("\n", 1)[1].strip()
        fields = dict(ln.partition("=")[::2] for ln in body.splitlines())
        if fields.get("is_linear", "0") != "0":
            raise Unsupported("a linear tree")
        if fields.get("num_cat", "0") != "0" or any(
            int(d) & 1 for d in fields.get("decision_type", "").split()
        ):
            raise Unsupported("a categorical split")
        bodies.append(body)
    return header, bodies


def merged_model_string(boosters: Sequence[Any]) -> tuple[str, list[float | None]]:
    """The merged model text of ``boosters`` (LightGBM ``Booster`` objects, all iterations) and
    each booster's output transform (:func:`output_transform`). Raises :class:`Unsupported`."""
    if not boosters:
        raise Unsupported("no boosters")
    headers, trees, transforms = [], [], []
    for b in boosters:
        header, bodies = _split(b.model_to_string(num_iteration=-1))
        if header.get("num_class", "1") != "1" or header.get("num_tree_per_iteration", "1") != "1":
            raise Unsupported("a booster with several trees per iteration (multi-class)")
        if "average_output" in header:
            raise Unsupported("average_output (random forest)")
        if header.get("linear_tree", "0") not in ("0", "false"):
            raise Unsupported("a linear-tree booster")
        if len(bodies) != b.num_trees():
            raise Unsupported(f"read {len(bodies)} trees of {b.num_trees()}")
        transforms.append(output_transform(header.get("objective", "")))
        headers.append(header)
        trees.append(bodies)
    first = headers[0]
    if any(h.get("max_feature_idx") != first.get("max_feature_idx") for h in headers):
        raise Unsupported("boosters read different numbers of features")
    k, width = len(trees), max(len(t) for t in trees)
    out = [
        "tree",
        f"version={first.get('version', 'v4')}",
        f"num_class={k}",
        f"num_tree_per_iteration={k}",
        "label_index=0",
        f"max_feature_idx={first['max_feature_idx']}",
    ]
    out += [f"{key}={first[key]}" for key in ("feature_names", "feature_infos") if key in first]
    out.append("")
    n = 0
    for i in range(width):
        for bodies in trees:
            out += [f"Tree={n}", bodies[i] if i < len(bodies) else _PAD_TREE, "", ""]
            n += 1
    out += ["end of trees", ""]
    return "\n".join(out), transforms


def fast_row_config(booster: Any, row: np.ndarray, raw: bool) -> ctypes.c_void_p:
    """A prepared single-row prediction config of ``booster`` for ``row``'s width (float64, all
    iterations, one thread): ``LGBM_BoosterPredictForMatSingleRowFastInit``; ``raw`` predicts raw
    scores (C_API_PREDICT_RAW_SCORE), else the objective's transformed output
    (C_API_PREDICT_NORMAL). Free it with ``LGBM_FastConfigFree``."""
    from lightgbm.basic import _safe_call
    from lightgbm.libpath import _LIB  # where lightgbm.basic takes it from (the same CDLL)

    cfg = ctypes.c_void_p()
    _safe_call(
        _LIB.LGBM_BoosterPredictForMatSingleRowFastInit(
            booster._handle,
            ctypes.c_int(1 if raw else 0),  # C_API_PREDICT_RAW_SCORE / C_API_PREDICT_NORMAL
            ctypes.c_int(0),  # start iteration
            ctypes.c_int(-1),  # all iterations
            ctypes.c_int(1),  # C_API_DTYPE_FLOAT64
            ctypes.c_int32(row.shape[-1]),
            ctypes.c_char_p(b"num_threads=1"),
            ctypes.byref(cfg),
        )
    )
    return cfg


class MergedPredictor:
    """``boosters`` merged (:func:`merged_model_string`) and bound to one float64 row buffer
    through the C API's single-row fast path; a call returns each booster's prediction for the
    row (transformed: a probability for binary), as Python floats, in the boosters' order.
    Raises :class:`Unsupported` when the boosters cannot be merged. Not thread-safe."""

    def __init__(self, boosters: Sequence[Any], row: np.ndarray) -> None:
        import lightgbm as lgb
        from lightgbm.basic import _safe_call
        from lightgbm.libpath import _LIB  # where lightgbm.basic takes it from (the same CDLL)

        if row.dtype != np.float64 or not row.flags.c_contiguous:
            raise TypeError("row buffer must be C-contiguous float64")
        text, transforms = merged_model_string(boosters)
        self.n_outputs = len(boosters)
        self._sigmoid = tuple((i, s) for i, s in enumerate(transforms) if s is not None)
        self._lib, self._check = _LIB, _safe_call
        try:
            self.booster = lgb.Booster(model_str=text)  # keeps the handle alive
        except lgb.basic.LightGBMError as e:
            raise Unsupported(f"LightGBM refused the merged model ({e})") from None
        if self.booster.num_trees() != self.n_outputs * max(b.num_trees() for b in boosters):
            raise Unsupported(f"the merged booster holds {self.booster.num_trees()} trees")
        self._row = row
        self._cfg = fast_row_config(self.booster, row, raw=True)  # transforms applied here
        self._out = (ctypes.c_double * self.n_outputs)()  # sliced into a list of Python floats
        self._out_len = ctypes.c_int64(0)
        self._args = (
            self._cfg,
            ctypes.c_void_p(row.ctypes.data),
            ctypes.byref(self._out_len),
            self._out,
        )
        self._fn = _LIB.LGBM_BoosterPredictForMatSingleRowFast

    def __call__(self) -> list[float]:
        if self._fn(*self._args):  # non-zero: LightGBM's error, raised as lightgbm raises it
            self._check(-1)
        out: list[float] = self._out[:]
        for i, s in self._sigmoid:
            out[i] = 1.0 / (1.0 + math.exp(-s * out[i]))
        return out

    def __del__(self) -> None:
        cfg = getattr(self, "_cfg", None)
        if cfg is not None and cfg.value:
            self._lib.LGBM_FastConfigFree(cfg)
