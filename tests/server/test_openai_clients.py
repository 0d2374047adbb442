"""The real server driven by the official `openai` client and by httpx: text equals
Engine.generate for the same greedy request; streaming, usage, n, logprobs, native API."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixjax import Engine, SamplingParams
from tests.conftest import SMOLLM2_ENGINE
from tests.server.conftest import MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def reference(smollm2_served):
    """The in-process engine's greedy text for the same requests (the model loaded in the
    same form as the server's)."""
    smollm2 = smollm2_served
    with Engine(params=smollm2.params, model_config=smollm2.cfg, tokenizer=smollm2.tokenizer,
                **SMOLLM2_ENGINE) as e:
        tok = smollm2.tokenizer
        chat = tok(tok.apply_chat_template(QUESTION, add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False).input_ids
        sp = SamplingParams(max_new_tokens=12, temperature=0.0)
        yield {"chat": e.generate(chat, sp).text,
               "completion": e.generate("The capital of France is", sp).text}


def test_models(client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_matches_engine(client, reference) -> None:
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,
                                       temperature=0)
    assert r.choices[0].message.content == reference["chat"]
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens <= 12
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference["chat"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    # the same prompt again: the radix cache supplied all but its last token
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def test_completion_matches_engine(client, reference) -> None:
    r = client.completions.create(model=MODEL, prompt="The capital of France is",
                                  max_tokens=12, temperature=0)
    assert r.choices[0].text == reference["completion"]
    stream = client.completions.create(model=MODEL, prompt="The capital of France is",
                                       max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == reference["completion"]


def test_n_seed_stop_and_logprobs(client) -> None:
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=8, temperature=1.0, seed=5, n=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1
    # a stop string from the middle of the greedy answer (whatever the form's answer is)
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,
                                          temperature=0).choices[0].message.content
    word = full.split()[len(full.split()) // 2]
    stop = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,
                                          temperature=0, stop=[word])
    assert stop.choices[0].finish_reason == "stop"
    assert word not in stop.choices[0].message.content
    assert full.startswith(stop.choices[0].message.content)
    # streamed with the same stop string: the same text (no piece of the word was sent)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION,
                                                 max_tokens=12, temperature=0, stop=[word],
                                                 stream=True))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == stop.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    lp = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                        temperature=0, logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-5  # greedy = the top one
    c = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                                  logprobs=2)
    assert len(c.choices[0].logprobs.token_logprobs) == 3
    assert all(len(t) == 2 for t in c.choices[0].logprobs.top_logprobs)


def test_native_endpoints(server, reference) -> None:
    body = {"text": "The capital of France is",
            "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    r = httpx.post(server + "/generate", json=body, timeout=60).json()
    assert r["text"] == reference["completion"]
    assert r["meta_info"]["completion_tokens"] == len(r["output_ids"])
    with httpx.stream("POST", server + "/generate", json=dict(body, stream=True),
                      timeout=60) as s:
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["text"] == reference["completion"]
    ids = httpx.post(server + "/generate", json={"input_ids": r["output_ids"][:3],
                                                 "sampling_params": {"max_new_tokens": 2}},
                     timeout=60).json()
    assert len(ids["output_ids"]) == 2
    assert httpx.get(server + "/health_generate", timeout=60).text == "ok"
    info = httpx.get(server + "/get_server_info", timeout=10).json()
    assert info["engine"]["policy"] == "lpm" and info["model_config"]["num_layers"] == 30
    metrics = httpx.get(server + "/metrics", timeout=10).text
    for name in ("radixjax_requests_total", "radixjax_prompt_tokens_total",
                 "radixjax_cached_tokens_total", "radixjax_cache_hit_rate",
                 "radixjax_time_to_first_token_seconds_bucket",
                 "radixjax_inter_token_latency_seconds_count", "radixjax_kv_cache_usage"):
        assert name in metrics
    assert httpx.post(server + "/flush_cache", timeout=10).status_code == 200
