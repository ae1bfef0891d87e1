"""Precise mode's per-step chain cost: chat template + tokeniser + token blocks, vs body size.

Usage::

    .venv/bin/python bench/prefix_tokens_cost.py [--model .runroute/test-model] [--bodies-kb 20,200]
                                                  [--steps 20] [--block 32] [--full]

Algorithm: one run whose chat body (a system prompt, then user / assistant turns of ~700
characters) is grown to ``--bodies-kb`` untimed; then ``--steps`` steps, each adding one user
message, timed (``perf_counter``) for exactly what the sidecar's
:class:`router.server.protocols.chat_tokens.ChatTokenChainer` does per step (render the model's chat
template, encode what follows the run's previous prompt, hash the new token blocks). ``--full``
times a whole-body encode per step instead (the cost before the incremental encode). The last
chain is checked against a full encode. The model folder needs ``tokenizer.json`` and
``tokenizer_config.json`` (``make test-vllm`` builds the test model into .runroute/test-model).
Prints p50 / max in milliseconds per body size; the machine's other load shows in them.
"""

from __future__ import annotations

import argparse
import time

from router.core.prefix_index import RunChain
from router.core.prefix_precise import token_block_ids
from router.server.protocols.chat import MessageSegments
from router.server.protocols.chat_tokens import ChatTokenChainer, ChatTokenizer


def words(tag: str, n: int) -> str:
    w = ("route", "replica", "prefix", "cache", "token", "policy", "frontier", "local", "step", "tool")
    return f"Task {tag}. " + " ".join(f"{w[i % len(w)]}{i % 97}" for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=".runroute/test-model")
    ap.add_argument("--bodies-kb", default="20,200")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--full", action="store_true", help="encode the whole body every step")
    a = ap.parse_args()
    ct = ChatTokenizer(a.model)
    tc = ChatTokenChainer(ct, a.block)
    for kb in (int(x) for x in a.bodies_kb.split(",")):
        msgs: list[dict[str, str]] = [{"role": "system", "content": words("s", 300)}]
        while sum(len(m["content"]) for m in msgs) < kb * 1000:
            msgs += [
                {"role": "user", "content": words(f"u{len(msgs)}", 100)},
                {"role": "assistant", "content": "ok"},
            ]
        rc = RunChain()
        tc.extend(rc, MessageSegments({"messages": msgs}))
        ts = []
        for i in range(a.steps):
            msgs = msgs + [{"role": "user", "content": f"new {i}"}]
            t0 = time.perf_counter()
            if a.full:
                rc = RunChain()
            chain = tc.extend(rc, MessageSegments({"messages": msgs}))
            ts.append(time.perf_counter() - t0)
            msgs = msgs + [{"role": "assistant", "content": "ok"}]
        last = msgs[:-1]
        assert list(chain) == token_block_ids(ct.encode(last)[:-1], a.block), (
            "chain differs from a full encode"
        )
        ts.sort()
        print(
            f"{kb} KB ({len(rc.data) // 4} tokens): p50 {ts[len(ts) // 2] * 1e3:.2f} ms, "
            f"max {ts[-1] * 1e3:.2f} ms{' (full encode)' if a.full else ''}"
        )


if __name__ == "__main__":
    main()
