"""Tokenizers without torch: an HF folder's tokenizer files, or one rebuilt from GGUF
metadata with transformers' own GGUF-to-tokenizers converter (its file reader imports
torch, so we read the metadata ourselves, loaders/gguf_reader.py, and hand it over)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_hf_tokenizer(path: Path) -> PreTrainedTokenizerBase | None:
    """The folder's tokenizer, or None when it ships none (then prompts are token ids)."""
    if not any((path / f).exists() for f in TOKENIZER_FILES):
        return None
    if _generic_fast_tokenizer(path):
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    # imported here: AutoTokenizer's import pulls in torch when it is installed (~3 s)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _generic_fast_tokenizer(path: Path) -> bool:
    """The folder names transformers' generic fast tokenizer (no model-specific class):
    loaded without AutoTokenizer, which would import torch when it is installed."""
    import json

    config = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").exists() or not config.exists():
        return False
    name = json.loads(config.read_text()).get("tokenizer_class")
    return name in ("PreTrainedTokenizerFast", "TokenizersBackend")


def tokenizer_from_gguf_metadata(md: dict[str, Any]) -> PreTrainedTokenizerFast:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tok_dict = {
        name: md[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in md
    }
    backend, extra = convert_gguf_tokenizer(md["general.architecture"], tok_dict)
    tokens = tok_dict["tokens"]

    def special(key: str) -> str | None:
        idx = md.get(f"tokenizer.ggml.{key}")
        return tokens[idx] if idx is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=special("bos_token_id"),
        eos_token=special("eos_token_id"),
        unk_token=special("unknown_token_id"),
        pad_token=special("padding_token_id"),
        chat_template=md.get("tokenizer.chat_template"),
        add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", False)),
        **extra,
    )
