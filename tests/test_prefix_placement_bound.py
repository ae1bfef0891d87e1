"""The KV bound of bench/prefix_placement.py: Belady's MIN on the pooled KV holds at least what an
LRU cache of the same size holds (the node cache model, ``training.dataset.lru_replay``), and it
keeps the block needed soonest where LRU loses it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from training.dataset import lru_replay

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _belady():
    sys.path.insert(0, str(BENCH))
    try:
        import prefix_placement as mod
    finally:
        sys.path.remove(str(BENCH))
    return mod.belady_hits


belady = _belady()


def test_belady_keeps_the_block_needed_soonest() -> None:
    p = np.array([1100, 1100, 1100])
    # capacity 2: [3] is never needed again, so MIN keeps 1 and 2; LRU evicts 1 for 3
    assert belady([[1, 2], [3], [1, 2]], p, 2, 512).tolist() == [0.0, 0.0, 1024.0]
    lru, _ = lru_replay([[1, 2], [3], [1, 2]], ["a", "b", "c"], p, 2, 512)
    assert lru.tolist() == [0.0, 0.0, 0.0]
    # capped like the node's count: at most prompt - 1 tokens in whole blocks
    assert belady([[1, 2], [1, 2]], np.array([1100, 1024]), 4, 512).tolist() == [0.0, 512.0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=30),
    st.integers(2, 12),
)
def test_belady_never_below_lru(steps, cap) -> None:
    # prefix-closed chains, as the trace's: family f, length n -> ids f*100 + 0..n-1
    chains = [[f * 100 + j for j in range(n)] for f, n in steps]
    prompts = np.array([n * 512 + 1 for _, n in steps])
    lru, _ = lru_replay(chains, [str(i) for i in range(len(chains))], prompts, cap, 512)
    assert belady(chains, prompts, cap, 512).sum() >= lru.sum()
