"""One flattened evaluator of several LightGBM boosters: one row through all their trees at once.

Why: the sidecar predicts one row per request through six boosters (escalation, cache reuse, two
remaining-steps and two remaining-tokens quantiles), one C call each. Each call walks ~100 small
trees whose nodes LightGBM allocated separately; in the server, between requests, they are out of
the cache, and a call cost ~15 us against ~2 us in a hot loop. Here all trees of all boosters sit in
a few contiguous arrays, read front to back, and one row is predicted with a fixed sequence of
vectorised numpy operations (no per-tree or per-booster Python).

Algorithm (QuickScorer, vectorised): the leaves of each tree are numbered left to right (bit ``i``
of a 64-bit word = leaf ``i``); each internal node carries the mask of the leaves that stay reachable
when the row goes *right* there (all bits but those of its left subtree). For a row, every node's
decision is computed at once; the AND of the masks of the nodes that go right leaves, per tree, a
word whose lowest set bit is the leaf the row reaches (the leftmost leaf none of whose ancestors
sent the row away from it). The tree's output is that leaf's value; each booster's raw score is
the sum of its trees' outputs in tree order (``np.cumsum`` along a row: sequential, the order of
LightGBM's ``GBDT::PredictRaw``, so the sum is the same double), then the objective's transform.

Decisions reproduce LightGBM's ``Tree::NumericalDecision`` on the row as the C API's single-row
path hands it over (``|x| <= kZeroThreshold`` read as 0.0, NaN kept): with ``missing_type`` None a
NaN is read as 0.0; ``Zero`` with ``|x| <= kZeroThreshold`` (NaN included, read as 0.0) or ``NaN``
with a NaN goes the node's default side; else left iff ``x <= threshold``. These are folded into
the value each node compares: per row, up to five versions of the row are built (as read by
None-nodes, by Zero-nodes defaulting left/right, by NaN-nodes defaulting left/right) where a
default-left case reads ``-inf`` and a default-right case ``+inf``, so every node is one ``<=``.

What it does not evaluate (:class:`Unsupported`, the caller keeps LightGBM's own path): categorical
splits, linear trees, multi-class or several trees per iteration, ``average_output`` (random
forest), trees of more than 64 leaves, non-finite thresholds, objectives other than the identity
ones (regression, regression_l1, quantile, huber, fair, mape without ``sqrt``) and binary (sigmoid).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FlatForest", "Unsupported", "K_ZERO_THRESHOLD"]

#: LightGBM's ``kZeroThreshold`` (``const double kZeroThreshold = 1e-35f``: the float's value)
K_ZERO_THRESHOLD = float(np.float32(1e-35))

_IDENTITY = frozenset({"regression", "regression_l1", "quantile", "huber", "fair", "mape"})
# node kinds: which version of the row a node reads (see the module docstring)
_NONE, _ZERO_L, _ZERO_R, _NAN_L, _NAN_R = range(5)
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


class Unsupported(ValueError):
    """The boosters hold something the flat evaluator does not reproduce; the message says what."""


def _transform(objective: str) -> float | None:
    """``None`` for the identity, else the sigmoid's scale (binary); :class:`Unsupported` otherwise."""
    parts = objective.split()
    name = parts[0] if parts else ""
    opts = dict(p.split(":", 1) if ":" in p else (p, "") for p in parts[1:])
    if name in _IDENTITY:
        if "sqrt" in opts:
            raise Unsupported(f"objective {objective!r}: the sqrt transform is not reproduced")
        return None
    if name == "binary":
        try:
            s = float(opts.get("sigmoid", "1"))
        except ValueError:
            raise Unsupported(f"objective {objective!r}: unreadable sigmoid") from None
        if not (math.isfinite(s) and s > 0.0):
            raise Unsupported(f"objective {objective!r}: sigmoid must be > 0")
        return s
    raise Unsupported(f"objective {objective!r} is not reproduced")


class _Tree:
    """One dumped tree flattened: its nodes (feature, threshold, kind, mask) and its leaf values."""

    __slots__ = ("feat", "thr", "kind", "mask", "leaves")

    def __init__(self, root: Mapping_) -> None:
        self.feat: list[int] = []
        self.thr: list[float] = []
        self.kind: list[int] = []
        self.mask: list[int] = []
        self.leaves: list[float] = []
        self._walk(root)
        if len(self.leaves) > 64:
            raise Unsupported(f"a tree of {len(self.leaves)} leaves (at most 64 are evaluated)")

    def _walk(self, node: Mapping_) -> tuple[int, int]:
        """Appends ``node``'s subtree; returns its leaves' range [lo, hi)."""
        if "leaf_value" in node:
            if node.get("leaf_coeff") or node.get("leaf_features"):
                raise Unsupported("a linear tree")
            self.leaves.append(float(node["leaf_value"]))
            return len(self.leaves) - 1, len(self.leaves)
        if node.get("decision_type") != "<=":
            raise Unsupported(f"a {node.get('decision_type')!r} split (categorical)")
        thr = float(node["threshold"])
        if not math.isfinite(thr):
            raise Unsupported(f"a non-finite threshold {thr!r}")
        miss, left = node.get("missing_type"), bool(node["default_left"])
        if miss == "None":
            kind = _NONE
        elif miss == "Zero":
            kind = _ZERO_L if left else _ZERO_R
        elif miss == "NaN":
            kind = _NAN_L if left else _NAN_R
        else:
            raise Unsupported(f"missing type {miss!r}")
        i = len(self.feat)
        self.feat.append(int(node["split_feature"]))
        self.thr.append(thr)
        self.kind.append(kind)
        self.mask.append(0)
        lo, mid = self._walk(node["left_child"])
        _, hi = self._walk(node["right_child"])
        # going right there removes the left subtree's leaves [lo, mid)
        self.mask[i] = ((1 << 64) - 1) ^ (((1 << (mid - lo)) - 1) << lo)
        return lo, hi


Mapping_ = dict[str, Any]


class FlatForest:
    """The trees of ``boosters`` (LightGBM ``Booster`` objects) as contiguous arrays; calling it on
    a float64 row returns each booster's prediction (transformed: a probability for binary) as a
    list of Python floats, the same values as LightGBM's. Raises :class:`Unsupported` at build time
    for what it does not reproduce (module docstring). Not thread-safe (scratch buffers)."""

    def __init__(self, boosters: Sequence[Any], n_features: int) -> None:
        if not boosters:
            raise Unsupported("no boosters")
        self.n_features = int(n_features)
        dumps = [b.dump_model(num_iteration=-1) for b in boosters]
        self.sigmoid: list[float | None] = []
        per_model: list[list[_Tree]] = []
        for b, d in zip(boosters, dumps, strict=True):
            if int(d.get("num_class", 1)) != 1 or int(d.get("num_tree_per_iteration", 1)) != 1:
                raise Unsupported("more than one tree per iteration (multi-class)")
            if d.get("average_output"):
                raise Unsupported("average_output (random forest)")
            if int(d.get("max_feature_idx", -1)) >= self.n_features:
                raise Unsupported(f"a booster reads feature {d['max_feature_idx']}, the row has {n_features}")
            self.sigmoid.append(_transform(str(d.get("objective", ""))))
            info = d.get("tree_info", [])
            if len(info) != b.num_trees():
                raise Unsupported(f"dumped {len(info)} trees of {b.num_trees()}")
            trees = []
            for t in info:
                if t.get("num_cat", 0) or t.get("is_linear"):
                    raise Unsupported("categorical splits or a linear tree")
                trees.append(_Tree(t["tree_structure"]))
            per_model.append(trees)
        n_models = len(per_model)
        width = max(1, max(len(ts) for ts in per_model))
        # the tree grid: (n_models, width), models padded at the end with trees of one 0.0 leaf
        # (x + 0.0 == x: the sums are unchanged); every tree gets at least one node (a leaf-only
        # tree: a node with an all-ones mask, whatever its decision)
        feat: list[int] = []
        thr: list[float] = []
        kind: list[int] = []
        mask: list[int] = []
        starts: list[int] = []
        leaf_base: list[int] = []
        leaves: list[float] = []
        for trees in per_model:
            for j in range(width):
                t = trees[j] if j < len(trees) else None
                starts.append(len(feat))
                leaf_base.append(len(leaves))
                if t is None or not t.feat:
                    feat.append(0)
                    thr.append(0.0)
                    kind.append(_NONE)
                    mask.append((1 << 64) - 1)
                    leaves.append(t.leaves[0] if t is not None else 0.0)
                    continue
                feat.extend(t.feat)
                thr.extend(t.thr)
                kind.extend(t.kind)
                mask.extend(t.mask)
                leaves.extend(t.leaves)
        nf = self.n_features
        # the value a node compares sits at version[kind] * nf + feature of the (5, nf) scratch
        self._col = np.asarray(kind, dtype=np.intp) * nf + np.asarray(feat, dtype=np.intp)
        self._thr = np.asarray(thr, dtype=np.float64)
        self._mask = np.asarray(mask, dtype=np.uint64)
        self._starts = np.asarray(starts, dtype=np.intp)
        # a leaf's bit 2**i read back as a double's biased exponent 1023 + i: index = that + base
        self._leaf_off = np.asarray(leaf_base, dtype=np.int64) - 1023
        self._leaves = np.asarray(leaves, dtype=np.float64)
        self.shape = (n_models, width)
        self.n_nodes = len(feat)
        self.n_leaves = len(leaves)
        # scratch
        self._u = np.empty((5, nf), dtype=np.float64)
        self._big = np.empty(nf, dtype=bool)
        self._nan = np.empty(nf, dtype=bool)
        self._v = np.empty(self.n_nodes, dtype=np.float64)
        self._right = np.empty(self.n_nodes, dtype=bool)
        self._m = np.empty(self.n_nodes, dtype=np.uint64)
        n_trees = n_models * width
        self._w = np.empty(n_trees, dtype=np.uint64)
        self._low = np.empty(n_trees, dtype=np.uint64)
        self._e = np.empty(n_trees, dtype=np.float64)
        self._idx = np.empty(n_trees, dtype=np.int64)
        self._out = np.empty(n_trees, dtype=np.float64).reshape(n_models, width)
        self._ones = np.full(self.n_nodes, _ONES, dtype=np.uint64)

    def raw(self, row: np.ndarray) -> np.ndarray:
        """Each booster's raw score (before the objective's transform) for one float64 row."""
        u, big, nan = self._u, self._big, self._nan
        x = row.reshape(-1)
        np.abs(x, out=u[0])
        np.greater(u[0], K_ZERO_THRESHOLD, out=big)  # False for |x| <= kZero and for NaN
        np.isnan(x, out=nan)
        np.copyto(u[0], 0.0)
        np.copyto(u[0], x, where=big)  # None: NaN and |x| <= kZero read as 0.0
        np.copyto(u[1], -math.inf)
        np.copyto(u[1], x, where=big)  # Zero, default left: a zero (or NaN) reads -inf
        np.copyto(u[2], math.inf)
        np.copyto(u[2], x, where=big)  # Zero, default right: +inf
        np.copyto(u[3], u[0])
        np.copyto(u[3], -math.inf, where=nan)  # NaN, default left
        np.copyto(u[4], u[0])
        np.copyto(u[4], math.inf, where=nan)  # NaN, default right
        v = self._v
        np.take(u.reshape(-1), self._col, out=v)
        np.greater(v, self._thr, out=self._right)  # no NaN left: > is "not <="
        m = self._m
        np.copyto(m, self._ones)
        np.copyto(m, self._mask, where=self._right)
        w = self._w
        np.bitwise_and.reduceat(m, self._starts, out=w)
        low = self._low
        np.negative(w, out=low)
        np.bitwise_and(w, low, out=low)  # the lowest set bit: the exit leaf
        e = self._e
        np.copyto(e, low, casting="unsafe")  # a power of two: exact as a double
        idx = self._idx
        np.right_shift(e.view(np.int64), 52, out=idx)
        np.add(idx, self._leaf_off, out=idx)
        out = self._out
        np.take(self._leaves, idx, out=out.reshape(-1))
        return np.cumsum(out, axis=1)[:, -1]

    def __call__(self, row: np.ndarray) -> list[float]:
        raw: list[float] = self.raw(row).tolist()
        for i, s in enumerate(self.sigmoid):
            if s is not None:
                raw[i] = 1.0 / (1.0 + math.exp(-s * raw[i]))
        return raw
