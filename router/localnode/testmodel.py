"""Build a tiny Llama-architecture model for real-vLLM tests, from local text only (no model hub).

Algorithm:
1. Gather a corpus from local text: the project's own Markdown and Python sources (the folders
   beside this package) plus any extra files given; the files are read in sorted order so the
   corpus (and its sha256, kept in the manifest) is deterministic for a given tree.
2. Train a byte-level BPE tokenizer on it with ``tokenizers`` (every byte sequence encodes, so any
   prompt works), add the chat and tool-call markers (``<|im_start|>``, ``<|im_end|>``,
   ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``) as added tokens,
   and wrap it in transformers' ``PreTrainedTokenizerFast`` with a ChatML chat template that
   renders ``tools`` in a system block and assistant tool calls as hermes-style
   ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (what vLLM's ``hermes`` parser reads).
   The template only appends: a later turn never changes how earlier turns render, so step k+1's
   prompt starts with step k's prompt and vLLM's prefix cache can hit.
3. Make a ``LlamaForCausalLM`` from a small ``LlamaConfig`` with random weights (seeded), and
   save model, tokenizer and generation config with ``save_pretrained``; write
   ``runroute-testmodel.json`` (knobs, corpus hash, library versions).

Knobs (:class:`TestModelSpec`): ``vocab_size`` (BPE target size), ``hidden_size``,
``num_layers``, ``num_heads`` / ``num_kv_heads`` (head size = hidden / heads; vLLM's CPU attention
accepts 32, 64, 80, 96, 112, 128, ...), ``intermediate_size``, ``max_position`` (longest context
the model accepts), ``seed`` (weights), ``dtype`` ("float32" or "bfloat16").

transformers, tokenizers and torch are imported inside :func:`build_test_model`: they live in the
vLLM venv (``.venv-vllm``), not the router's. Run as ``python -m router.localnode.testmodel OUT_DIR``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from router.localnode.launch import project_root

__all__ = ["TestModelSpec", "CHAT_TEMPLATE", "SPECIAL_TOKENS", "default_corpus_files", "build_test_model"]

MANIFEST_NAME = "runroute-testmodel.json"
BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, "<|im_start|>", EOS, PAD)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# ChatML with hermes-style tools (the layout Qwen2.5 / Hermes models use), trimmed to what agents send.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    '{{- \'\\n</tools>\\n\\nFor each call return <tool_call>{"name": <function-name>, '
    '"arguments": <args-json-object>}</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- for tc in message.get('tool_calls') or [] %}"
    "{%- set f = tc['function'] if tc['function'] is defined else tc %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True, slots=True)
class TestModelSpec:
    """Size of the test model and tokenizer (see the module docstring for each knob)."""

    __test__ = False  # not a pytest class

    vocab_size: int = 4096
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    max_position: int = 8192
    seed: int = 0
    dtype: str = "float32"

    def check(self) -> None:
        """Raise ValueError for sizes the model or vLLM's CPU attention would refuse."""
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if (self.hidden_size // self.num_heads) % 32:
            raise ValueError("head size (hidden_size / num_heads) must be a multiple of 32 for vLLM on CPU")
        if self.vocab_size < 512:
            raise ValueError("vocab_size must be at least 512 (256 bytes + merges + special tokens)")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError("dtype must be float32 or bfloat16")


def default_corpus_files(root: Path | None = None) -> list[Path]:
    """The project's Markdown files and its packages' Python sources, sorted."""
    root = root or project_root()
    files = sorted(p for p in root.glob("*.md") if p.is_file())
    for pkg in ("runroute", "features", "models", "router", "training", "bench", "docs"):
        d = root / pkg
        if d.is_dir():
            files += sorted(p for p in d.rglob("*") if p.suffix in (".py", ".md") and p.is_file())
    return files


def _read_corpus(files: Iterable[Path]) -> tuple[list[str], str]:
    texts: list[str] = []
    h = hashlib.sha256()
    for p in files:
        t = p.read_text(encoding="utf-8", errors="replace")
        texts.append(t)
        h.update(p.name.encode())
        h.update(t.encode())
    return texts, h.hexdigest()


def build_test_model(
    out_dir: str | Path, spec: TestModelSpec | None = None, extra_corpus: Sequence[Path] = ()
) -> dict:
    """Train the tokenizer, make the random model, save both to ``out_dir``; return the manifest."""
    spec = spec or TestModelSpec()
    spec.check()
    t0 = time.perf_counter()
    import tokenizers
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = default_corpus_files() + [Path(p) for p in extra_corpus]
    texts, corpus_sha = _read_corpus(files)
    if sum(len(t) for t in texts) < 10_000:
        raise ValueError(f"corpus too small ({len(files)} files): pass more local text")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=spec.max_position
    )
    fast.add_tokens(list(TOOL_TOKENS))  # plain added tokens: kept in decoded text for the parser
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    t_tok = time.perf_counter() - t0

    torch.manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.bos_token_id = fast.bos_token_id
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    manifest = {
        "kind": "runroute-testmodel",
        "spec": asdict(spec),
        "vocab": len(fast),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_files": len(files),
        "corpus_sha256": corpus_sha,
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
        },
        "tokenizer_s": round(t_tok, 3),
        "total_s": round(time.perf_counter() - t0, 3),
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m router.localnode.testmodel OUT_DIR``: build and print the manifest as one JSON line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m router.localnode.testmodel OUT_DIR", file=sys.stderr)
        return 2
    try:
        manifest = build_test_model(args[0])
    except ValueError as e:
        print(f"make-test-model: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
