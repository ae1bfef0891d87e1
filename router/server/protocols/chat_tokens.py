"""Token chains of chat requests with the local model's own tokenizer (the prefix index's precise mode).

The prefix index compares a step's chain with the blocks a vLLM replica reports (KV events keyed
by token ids, :mod:`router.core.prefix_precise`), so the sidecar must form the same token blocks
vLLM forms: :class:`ChatTokenizer` renders the request as vLLM's OpenAI server does (the model's
chat template from ``tokenizer_config.json``, Jinja2 with ``trim_blocks`` / ``lstrip_blocks``,
``messages``, ``tools``, ``add_generation_prompt=True`` and the special tokens; ``tojson`` as
transformers defines it, not Jinja's HTML-safe one) and encodes the text with ``tokenizer.json``
(the ``tokenizers`` package) without adding special tokens (vLLM's chat default). Message content
given as parts is joined as text (vLLM's ``string`` content format: the text parts, one per line).

:class:`ChatTokenChainer` is the engine's text chainer in that mode: a step's chain = the token
blocks (:class:`~router.core.prefix_precise.TokenChainer`, the replicas' block size) of the
prompt's tokens *but the last* (vLLM recomputes a prompt's last token, so a prompt of exactly k
blocks hits at most k - 1; the chain then says so itself). Every step renders the whole body
(Jinja2, ~1 ms for 200 KB) but tokenises only what follows the run's previous prompt: the
tokenizer splits its input on added tokens before anything else, so the ids of a text cut just
after a special token (``<|im_end|>``, ...) are the ids of the part before it followed by those
of the rest; a run keeps (that cut, the xxh64 of the text before it, its ids) and a step whose
rendered text still starts with that text encodes only the rest (O(new text)). Off for a
tokenizer whose added tokens strip whitespace (the cut would move); the chain is hashed
incrementally too. A body the template cannot render (a
template error) gets an empty chain: no reuse predicted, nothing recorded.

Not modelled: requests with ``chat_template_kwargs``, a per-request ``chat_template``, images, or
a ``cache_salt`` (their blocks differ from the plain rendering; the index then under-states).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xxhash import xxh64_intdigest

from router.core.prefix_index import RunChain, Segments, TextChainer
from router.core.prefix_precise import TokenChainer

# a run's tokeniser state: (characters up to just after the last special token, their xxh64, the
# token ids up to and with that token)
TokenState = tuple[int, int, list[int]]

__all__ = ["ChatTokenizer", "ChatTokenChainer"]

log = logging.getLogger(__name__)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class ChatTokenizer:
    """The model's tokenizer and chat template from its folder (``tokenizer.json``,
    ``tokenizer_config.json``; module docstring)."""

    def __init__(self, model_dir: str | Path):
        import jinja2.sandbox
        from tokenizers import Tokenizer

        d = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        tmpl = cfg.get("chat_template")
        if not tmpl and (d / "chat_template.jinja").exists():
            tmpl = (d / "chat_template.jinja").read_text()
        if isinstance(tmpl, list):  # named templates: the default one
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), tmpl[0]["template"])
        if not isinstance(tmpl, str):
            raise ValueError(f"{d}: no chat template in tokenizer_config.json")

        def _raise(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(tmpl)
        self.special = {
            k: t
            for k in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (t := _token_text(cfg.get(k))) is not None
        }
        # incremental encoding splits the text after a special token: exact only when no added
        # token strips the whitespace around it (the tokenizer splits on added tokens first)
        added = self.tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self.split_safe = bool(self.special_ids) and not any(t.lstrip or t.rstrip for t in added.values())

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        msgs = [_plain(m) for m in messages]
        return self.template.render(
            messages=msgs, tools=tools or None, add_generation_prompt=True, **self.special
        )

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> list[int]:
        """The prompt token ids vLLM computes for this chat request."""
        return list(self.tokenizer.encode(self.render(messages, tools), add_special_tokens=False).ids)

    def encode_run(
        self,
        state: TokenState | None,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
    ) -> tuple[list[int], TokenState | None]:
        """:meth:`encode`, incremental per run: the tokens up to the last special token of the run's
        previous prompt are reused when this prompt's text still starts with that text (its
        length and xxh64 match), and only the rest is encoded (module docstring); returns the ids
        and the state to keep for the run's next step."""
        text = self.render(messages, tools)
        prefix: list[int] = []
        start = 0
        if state is not None and self.split_safe:
            cut, h, kept = state
            if len(text) >= cut and xxh64_intdigest(text[:cut].encode("utf-8", "surrogatepass")) == h:
                prefix, start = kept, cut
        enc = self.tokenizer.encode(text[start:], add_special_tokens=False)
        new = enc.ids
        ids = prefix + list(new)
        if not self.split_safe:
            return ids, None
        special = self.special_ids
        for j in range(len(new) - 1, -1, -1):  # the new cut: just after this text's last special token
            if new[j] in special:
                cut = start + enc.offsets[j][1]
                h = xxh64_intdigest(text[:cut].encode("utf-8", "surrogatepass"))
                return ids, (cut, h, ids[: len(prefix) + j + 1])
        return ids, state if prefix else None


def _plain(m: Mapping[str, Any]) -> Mapping[str, Any]:
    c = m.get("content")
    if isinstance(c, list):
        parts = [
            p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") in ("text", "input_text")
        ]
        return {**m, "content": "\n".join(parts)}
    return m


class ChatTokenChainer(TextChainer):
    """The engine's chainer for chat bodies in token blocks (module docstring). A segments view
    without the chat body (``msgs``, ``tools``) falls back to the character blocks."""

    __slots__ = ("tok", "tokens")
    exact = True  # the chain already stops at vLLM's (prompt - 1) // block: no cap from the estimate

    def __init__(self, tokenizer: ChatTokenizer, block_size: int):
        super().__init__(block_size * 4)
        self.tok = tokenizer
        self.tokens = TokenChainer(block_size)

    def extend(self, rc: RunChain, segments: Segments) -> list[int]:
        msgs = getattr(segments, "msgs", None)
        if msgs is None:
            return super().extend(rc, segments)
        try:
            state = rc.tokens if isinstance(rc.tokens, tuple) else None
            ids, rc.tokens = self.tok.encode_run(state, msgs, getattr(segments, "tools", None))
        except Exception:  # noqa: BLE001 - a body the template rejects: no chain, the step is served
            log.debug("chat template failed; no token chain for this step", exc_info=True)
            rc.chain, rc.data, rc.tokens = [], b"", None
            return rc.chain
        return self.tokens.extend(rc, ids[:-1])
