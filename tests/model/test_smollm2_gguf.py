"""The default model from its GGUF: tokenizer and greedy continuation against HF
transformers reading the same file (torch path, float32)."""

from __future__ import annotations

import pytest

from radixjax.loaders import default_model_path
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig
from radixjax.runtime.simple_generate import generate_tokens
from radixjax.sampling.params import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnewlines\r\n",
    "naïve café — déjà vu; Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji: 😀🚀👩‍👩‍👧‍👦 🇫🇷 and ZWJ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "code: def f(x):\n    return x**2  # comment",
    "numbers 1234567890 3.14159 -42 1e-5",
    "<|endoftext|>special in the middle<|im_end|>",
]


@pytest.fixture(scope="module")
def hf_gguf():
    path = default_model_path()
    kw = dict(gguf_file=path.name)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, dtype=torch.float32, **kw
    ).eval()
    return tok, model


def test_tokenizer_matches_hf(smollm2, hf_gguf) -> None:
    ours, (ref, _) = smollm2.tokenizer, hf_gguf
    for text in TEXTS:
        assert ours(text).input_ids == ref(text).input_ids, text
        ids = ref(text).input_ids
        assert ours.decode(ids) == ref.decode(ids)
    messages = [{"role": "user", "content": "Hi 👋"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.eos_token == ref.eos_token == "<|im_end|>"


def test_greedy_continuation_matches_hf(smollm2, hf_gguf) -> None:
    tok, model = hf_gguf
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text).input_ids
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
            pad_token_id=tok.eos_token_id,
        )[0, len(ids):].tolist()
    runner = ModelRunner(smollm2.cfg, smollm2.params, RunnerConfig(
        num_slots=257, max_batch_tokens=128, max_running=1, max_context=256))
    ours = list(generate_tokens(runner, ids, SamplingParams(max_new_tokens=32, temperature=0)))
    assert len(ref) == 32
    assert ours == ref, (tok.decode(ours), tok.decode(ref))
