"""Where the local-node tooling finds the checkout (no vLLM needed): ``make test-vllm`` builds the
tiny test model's tokenizer from the project's own Markdown and sources, found from
:func:`router.localnode.launch.project_root`. A root one level off (``router/``, after a package
move) found no Markdown at the top and failed CI with "corpus too small"."""

from __future__ import annotations

from router.localnode.launch import project_root
from router.localnode.testmodel import default_corpus_files


def test_project_root_is_the_checkout_and_the_test_model_corpus_is_found() -> None:
    root = project_root()
    assert (root / "pyproject.toml").is_file() and (root / "router" / "localnode").is_dir()
    files = default_corpus_files()
    assert root / "README.md" in files
    assert any(p.is_relative_to(root / "training") for p in files)
    assert sum(p.stat().st_size for p in files) > 100_000
