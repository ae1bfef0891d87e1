"""The prefix index (router.core.prefix_index) against its form before the sixth pass
(tests/prefix_index_reference.py): the same answers and the same state after any sequence of
operations.

Both indexes get the same random sequence of records (any hint, any ``n``), applies, clears, mode
switches, capacity changes, new replicas (across the count where the owners map starts to be kept),
lookups (warm, cold and partial hints), partial lookups and matches, over hash chains (families
sharing leading blocks) and over id lists that are not hash chains (ids reused under other parents,
repeated ids: the paths a hash chain never takes). After every operation the returned values, the
hints dictionaries, each replica's blocks, stamps, parents, children counts, leaf heap, eviction
count and the owners map must be equal."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prefix_index_reference import PrefixIndex as OldIndex
from prefix_index_reference import ReplicaIndex as OldReplica

from router.core.prefix_index import PrefixIndex, ReplicaIndex


def _chain(kind: int, a: int, b: int, k: int, ids: list[int]) -> list[int]:
    if kind == 0:  # a hash chain: 4 blocks shared by family a (a system prompt), then branch b's own
        return [a * 1000 + i if i < 4 else a * 1000 + b * 100 + i for i in range(k)]
    return [ids[(a + i * (b + 1)) % len(ids)] for i in range(k)]  # not a hash chain


def _state(idx: Any, replica_cls: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"modes": idx.modes(), "owners": idx.owners}
    for name, r in idx.replicas.items():
        if isinstance(r, replica_cls):
            out[name] = (
                r.capacity,
                list(r.stamp.items()),  # insertion order too
                dict(r.parent),
                dict(r.children),
                list(r._heap),
                r.evictions,
                r.bit,
            )
        else:  # precise
            out[name] = (type(r).__name__, r.capacity, getattr(r, "records", None))
    return out


op = st.tuples(
    st.integers(0, 11),  # operation
    st.integers(0, 7),  # replica
    st.integers(0, 1),  # chain kind
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(0, 14),  # chain length
    st.integers(-1, 16),  # n / hint / capacity
    st.integers(-1, 16),
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.integers(0, 40), min_size=3, max_size=12),
    st.lists(op, min_size=1, max_size=80),
)
def test_new_index_equals_the_reference_on_any_sequence(
    n_rep: int, ids: list[int], ops: list[tuple[int, int, int, int, int, int, int, int]]
) -> None:
    names = [f"r{i}" for i in range(n_rep)]
    new: Any = PrefixIndex(16, [(name, 10) for name in names])
    old: Any = OldIndex(16, [(name, 10) for name in names])
    hints_new: dict[str, dict[str, int]] = {}
    hints_old: dict[str, dict[str, int]] = {}
    for code, rep, kind, a, b, k, x, y in ops:
        name = f"r{rep}"
        chain = _chain(kind, a, b, k, ids)
        key = f"{kind}.{a}.{b}"
        if code <= 3:  # record: every hint, every n (None = all)
            n = None if x < 0 else x
            errors = []
            for idx in (new, old):
                try:
                    idx.record(name, chain, n, y)
                    errors.append("")
                except RuntimeError as e:  # ids that are not a hash chain can leave no leaf: alike
                    errors.append(str(e))
            assert errors[0] == errors[1]
        elif code == 4:
            errors = []
            for idx in (new, old):
                try:
                    idx.apply(name, chain)
                    errors.append("")
                except RuntimeError as e:
                    errors.append(str(e))
            assert errors[0] == errors[1]
        elif code == 5:
            new.clear(name)
            old.clear(name)
        elif code == 6:  # a new replica, or a capacity change (an empty index)
            cap = max(1, x)
            new.add_replica(name, cap)
            old.add_replica(name, cap)
        elif code == 7:
            if x % 2:
                assert type(new.set_precise(name)) is type(old.set_precise(name))
            else:
                new.set_approximate(name)
                old.set_approximate(name)
        elif code <= 9:  # lookup with the run's hints (cold the first time), or with stray ones
            hn = hints_new.setdefault(key, {})
            ho = hints_old.setdefault(key, {})
            if code == 9:
                hn[name] = ho[name] = y
            assert new.lookup(chain, x, hn) == old.lookup(chain, x, ho)
            assert hn == ho
        elif code == 10:
            hn = hints_new.setdefault(key, {})
            ho = hints_old.setdefault(key, {})
            hn[name] = ho[name] = y
            some = [name, f"r{(rep + 1) % 8}"]
            assert new.lookup_some(chain, x, hn, some) == old.lookup_some(chain, x, ho, some)
            assert hn == ho
        else:
            assert new.match(name, chain, x, y) == old.match(name, chain, x, y)
        assert _state(new, ReplicaIndex) == _state(old, OldReplica)
        assert new._cold == old._cold
        # every replica's partial lookup of this op's chain, whatever the hint (inside (0, n) or not)
        for m in (x, len(chain)):
            for h in (-1, 0, 1, m // 2, m - 1, m, m + 1):
                hn, ho = dict.fromkeys(names, h), dict.fromkeys(names, h)
                assert new.lookup_some(chain, m, hn, names) == old.lookup_some(chain, m, ho, names)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9), st.integers(-1, 10)), min_size=1, max_size=60),
)
def test_replica_records_equal_the_reference_under_eviction(
    cap: int, recs: list[tuple[int, int, int]]
) -> None:
    """One replica, small capacities (evictions at most records, chains peeled from the tip,
    parents handed their leaf's stamp, shared blocks with several children), runs that grow step by
    step with the previous match (or any value) as hint."""
    new, old = ReplicaIndex(cap), OldReplica(cap)
    grown: dict[int, int] = {}
    for stamp, (run, add, hint) in enumerate(recs, 1):
        n = grown[run] = grown.get(run, 0) + add
        # runs 0-2, 3-5 share their first 3 blocks (a system prompt): parents of several leaves
        chain = [(run // 3) * 10000 + i if i < 3 else run * 100 + i for i in range(n)]
        h = hint if hint >= 0 else old.match(chain, n)
        new.record(chain, n, stamp, h)
        old.record(chain, n, stamp, h)
        assert new.stamp == old.stamp and list(new.stamp) == list(old.stamp)
        assert (new.parent, new.children, new._heap) == (old.parent, old.children, old._heap)
        assert new.evictions == old.evictions
