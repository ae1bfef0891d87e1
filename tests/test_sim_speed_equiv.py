"""The simulator's speed changes keep what is simulated: the hand-written copies equal the generic
ones they replace (a new field would otherwise be dropped silently)."""

from __future__ import annotations

from dataclasses import fields, replace

from models.types import Predictions


def test_with_cache_index_equals_replace_for_every_field() -> None:
    vals = {}
    for i, f in enumerate(fields(Predictions)):
        vals[f.name] = f"v{i}" if f.name.startswith("domain_") else float(i + 1)
    p = Predictions(**vals)
    assert p.with_cache_index(123.0) == replace(p, cache_index_tokens=123.0)
    assert p.with_cache_index(123.0).cache_index_tokens == 123.0
