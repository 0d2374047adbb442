"""An HF folder's tokenizer: a generic fast tokenizer (what tests/tiny_models.py saves)
loads without AutoTokenizer, and encodes, decodes and templates as AutoTokenizer does."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from radixjax.loaders.tokenizer import _generic_fast_tokenizer, load_hf_tokenizer
from tests.tiny_models import PLAIN_CHAT_TEMPLATE, save_char_tokenizer


def test_generic_fast_tokenizer_equals_autotokenizer(tmp_path) -> None:
    save_char_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {**config, "chat_template": PLAIN_CHAT_TEMPLATE, "eos_token": "~"}))
    assert _generic_fast_tokenizer(tmp_path)  # the path without AutoTokenizer
    ours, ref = load_hf_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(ours) is type(ref)
    text = "Hello, wörld ~ ÿ!"
    assert ours(text).input_ids == ref(text).input_ids
    assert ours.decode(list(range(120))) == ref.decode(list(range(120)))
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.eos_token_id == ref.eos_token_id == ref.convert_tokens_to_ids("~")


def test_a_folder_without_tokenizer_files_has_none(tmp_path) -> None:
    assert load_hf_tokenizer(tmp_path) is None
