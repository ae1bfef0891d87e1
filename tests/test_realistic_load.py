"""bench/realistic_load.py: a run's streamed bodies carry the same conversation as its plain ones
(issue 26: the sidecar's parse cache, primed with plain bodies, then sees the same history)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from realistic_load import ChatBodies, MessagesBodies, ResponsesBodies  # noqa: E402


@pytest.mark.parametrize("cls", [ChatBodies, ResponsesBodies, MessagesBodies])
@pytest.mark.parametrize("id_via", ["header", "metadata"])
def test_streamed_bodies_carry_the_plain_bodies_history(cls, id_via):
    plain = cls("auto", 12, 2048, 40_000, False, id_via)
    stream = cls("auto", 12, 2048, 40_000, True, id_via)
    assert stream.history == plain.history
    for k in range(12):
        a, b = plain.body(3, 0, k, "rr-0003-g0"), stream.body(3, 0, k, "rr-0003-g0")
        cut = len(a) - len(plain.tail("rr-0003-g0"))
        assert a[:cut] == b[:cut]  # head + history: the same bytes
        ja, jb = orjson.loads(a), orjson.loads(b)
        assert ja.pop("stream") is False and jb.pop("stream") is True
        assert ja == jb  # nothing else differs
