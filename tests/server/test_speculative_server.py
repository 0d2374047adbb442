"""--speculative-algorithm ngram through the real server with the openai client: mixed
sampling options at OpenAI's defaults (temperature 1, seeded), greedy, top_p, logprobs,
stop strings, a regex, a frequency penalty, streamed and not, concurrent, a regenerated
prompt (drafts from the radix tree) and a client that disconnects mid-stream. Each text
is the one plain decoding gives (an in-process engine without speculation on the same
model and form); drafts were verified and accepted; no late compile, no KV held at the
end."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
from tests.server.conftest import launch_server, stop_server, wait_healthy, wait_idle
from tests.tiny_models import FAST_COMPILE, save_char_chat_model

# small buckets (few step programs) and XLA's fast compile: this module's own server
ENGINE = dict(num_slots=1024, max_running=8, max_context=256, max_prefill_tokens=32,
              chunk_size=32)
FLAGS = ["--num-slots", "1024", "--max-running", "8", "--context-length", "256",
         "--max-prefill-tokens", "32", "--chunk-size", "32", "--speculative-algorithm",
         "ngram", "--random-seed", "0"]
MODEL = "tiny-spec"
PROMPTS = ["abcabcabcabcabc", "The cat sat. The cat sat. The", "xyz" * 6,
           "Copy this: 12345 12345 1234", "hello world"]
# (OpenAI's parameters, the engine's) for each request
OPTIONS = [
    (dict(seed=1), dict(seed=1)),  # OpenAI's defaults: temperature 1, top_p 1
    (dict(temperature=0), dict(temperature=0.0)),
    (dict(seed=2, top_p=0.8), dict(seed=2, top_p=0.8)),
    (dict(seed=3, logprobs=2), dict(seed=3, logprobs=True, top_logprobs=2)),
    (dict(temperature=0, stop=["c", "t s"]), dict(temperature=0.0, stop=("c", "t s"))),
    # a grammar's rows and a penalty beside drafting requests (neither drafts itself)
    (dict(temperature=0, extra_body={"regex": "[a-c ]+"}), dict(temperature=0.0,
                                                              regex="[a-c ]+")),
    (dict(seed=4, frequency_penalty=0.5), dict(seed=4, frequency_penalty=0.5)),
]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    folder = save_char_chat_model(Path(tiny_model_dir("llama_h64")),
                                  tmp_path_factory.mktemp("spec") / MODEL)
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    proc, url = wait_healthy(launch_server(FLAGS, ["--model", str(folder)], env))
    yield folder, url
    stop_server(proc)


@pytest.fixture(scope="module")
def reference(served):
    """Plain decoding's text of every (prompt, options) pair: an in-process engine with
    the server's model, buckets and form, without speculation."""
    m = load_model(served[0])
    with Engine(params=m.params, model_config=m.cfg, tokenizer=m.tokenizer,
                xla_options=FAST_COMPILE, **ENGINE) as e:
        return {(p, i): e.generate(p, SamplingParams(max_new_tokens=MAX_TOKENS, **opts[1])).text
                for p in PROMPTS for i, opts in enumerate(OPTIONS)}


def complete(client: openai.OpenAI, prompt: str, i: int, stream: bool) -> str:
    kw = dict(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, **OPTIONS[i][0])
    if not stream:
        return client.completions.create(**kw).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)
                   if c.choices)


def test_texts_are_plain_decodings_under_concurrency(served, reference) -> None:
    _, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    jobs = [(p, i, (n + i) % 2 == 0) for n, p in enumerate(PROMPTS)
            for i in range(len(OPTIONS))]
    for _ in range(2):  # the second round: the first's answers are in the radix tree
        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(lambda j: complete(client, *j), jobs))
        for (p, i, _), text in zip(jobs, texts, strict=True):
            assert text == reference[(p, i)], (p, OPTIONS[i])
    one = complete(client, PROMPTS[0], 0, stream=True)  # alone: drafts from the tree
    assert one == reference[(PROMPTS[0], 0)]
    stats = wait_idle(url)
    assert stats["num_verify_reqs"] > 0 and stats["num_accepted_tokens"] > 0, stats
    assert stats["mean_accepted_length"] > 1.0


def test_a_disconnect_mid_stream_leaves_nothing_held(served) -> None:
    _, url = served
    body = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=200, temperature=0,
                stream=True, ignore_eos=True)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n == 3:
                break  # the client goes away while the request decodes with drafts
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    assert client.completions.create(model=MODEL, prompt="abc", max_tokens=5).choices
    stats = wait_idle(url)
    assert stats["kv_held"] == 0 and stats["num_running"] == 0
    assert stats["num_late_compiles"] == 0
