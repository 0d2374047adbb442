"""--reasoning-parser through the real server, on a tiny random model whose template
opens the reasoning (DeepSeek-R1's way) and whose tokenizer has <think> / </think>: the
reasoning and the content split where the model wrote </think> (logit_bias brings it
early), streamed and not, whole with stream_reasoning false, kept in the content with
separate_reasoning false; a grammar applies after the reasoning."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.server.conftest import launch_server, stop_server, wait_healthy
from tests.tiny_models import THINK_IDS, save_thinking_chat_model

# small buckets (few step programs) and XLA's fast compile: this module's own server
FLAGS = ["--num-slots", "1024", "--max-running", "4", "--context-length", "256",
         "--max-prefill-tokens", "32", "--chunk-size", "32"]
MODEL = "tiny-thinker"
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
END = {str(THINK_IDS["</think>"]): 4.0}  # </think> comes after a few tokens


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    folder = save_thinking_chat_model(Path(tiny_model_dir("llama")),
                                      tmp_path_factory.mktemp("think") / MODEL)
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    proc, url = wait_healthy(launch_server(["--reasoning-parser", "deepseek-r1"],
                                           ["--model", str(folder), *FLAGS], env))
    yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    stop_server(proc)


def ask(client, seed: int, **kw):
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40,
                                          seed=seed, logit_bias=END, **kw)


def streamed(client, seed: int, **kw) -> tuple[list[str], str]:
    thought, content = [], ""
    for chunk in ask(client, seed, stream=True, **kw):
        for c in chunk.choices:
            piece = getattr(c.delta, "reasoning_content", None) or (c.delta.model_extra or {}
                                                                    ).get("reasoning_content")
            if piece:
                thought.append(piece)
            content += c.delta.content or ""
    return thought, content


def test_reasoning_and_content_split_at_the_end_of_thinking(client) -> None:
    split = 0
    for seed in range(4):
        whole = ask(client, seed, extra_body={"separate_reasoning": False}).choices[0]
        raw = whole.message.content
        apart = ask(client, seed).choices[0].message
        reasoning = apart.model_extra["reasoning_content"]
        if "</think>" in raw:  # the model ended its reasoning: split there
            split += 1
            assert raw == reasoning + "</think>" + apart.content, (raw, apart)
        else:  # cut off while thinking: all of it is reasoning
            assert (reasoning, apart.content) == (raw, ""), (raw, apart)
        pieces, content = streamed(client, seed)
        assert ("".join(pieces), content) == (reasoning or "", apart.content)
        whole_pieces, _ = streamed(client, seed, extra_body={"stream_reasoning": False})
        assert whole_pieces == ([reasoning] if reasoning else [])
    assert split, "the biased </think> never came"


def test_a_grammar_applies_after_the_reasoning(client) -> None:
    """SGLang's `regex` on chat (JSON is out of reach here: this tokenizer's EOS is '"')."""
    done = 0
    for seed in range(4):
        r = ask(client, seed, extra_body={"regex": "The answer is (four|five)[.]"}).choices[0]
        if r.finish_reason == "stop":
            done += 1
            # the EOS that ends it is '"', a plain character in this tokenizer
            assert r.message.content.removesuffix('"') in ("The answer is four.",
                                                            "The answer is five.")
        else:  # cut off while thinking, or in the answer
            assert r.finish_reason == "length"
            assert any(a.startswith(r.message.content) for a in (
                "The answer is four.", "The answer is five.")), r.message.content
    assert done, "no answer finished"
