"""A DeepSeek (MLA + MoE) server with DP attention, driven as a user would: the tiny
DeepSeek-V3 with the one-character tokenizer, `--tp 2 --enable-dp-attention` on two
CPU devices, 12 OpenAI completions at once (greedy and seeded at temperature 1, some
sharing a prefix, some streamed), chat, and a bad request. Outputs equal one device's
(an in-process Engine on the same folder); no late compiles, no KV held afterwards,
integrity on every rank."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch  # noqa: F401 - the tiny models are written with it (a test dependency)

from radixjax import Engine, SamplingParams
from tests.server.conftest import launch_server, wait_healthy, wait_idle
from tests.tiny_models import FAST_COMPILE, save_char_chat_model

FLAGS = ["--num-slots", "1024", "--max-running", "8", "--context-length", "256",
         "--max-prefill-tokens", "32", "--chunk-size", "32", "--enable-debug-endpoints"]
SHARED = "System: answer briefly and kindly, in one line. "
PROMPTS = [SHARED + q for q in ("What is a cat?", "Name a color.", "Say hello.",
                                "Count to three.")] + ["Why?", "Tell me a long story.",
                                                        "x" * 90, "Rain?"]
MAX_TOKENS = 10
MODEL = "tiny-deepseek"  # the folder's name: what the server calls the model


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory) -> Path:
    return save_char_chat_model(Path(tiny_model_dir("deepseek_v3")),
                                tmp_path_factory.mktemp("dpa") / MODEL)


def one_device_reference(model: Path) -> dict:
    """One device, in process: greedy and seeded (temperature 1) text per prompt."""
    with Engine(model, num_slots=1024, max_running=8, max_context=256,
                max_prefill_tokens=32, chunk_size=32, warmup=False, xla_options=FAST_COMPILE) as e:
        greedy = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        out = {"greedy": [o.text for o in e.generate(PROMPTS, greedy)]}
        out["seeded"] = [e.generate(p, SamplingParams(max_new_tokens=MAX_TOKENS, seed=i,
                                                      temperature=1.0, ignore_eos=True)).text
                         for i, p in enumerate(PROMPTS)]
    return out


@pytest.fixture(scope="module")
def served(model):
    """(server URL, the one-device reference), the reference computed while the server
    compiles."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                                     "--xla_backend_optimization_level=0")
    launched = launch_server(["--tp", "2", "--enable-dp-attention"],
                             ["--model", str(model), *FLAGS], env)
    try:
        reference = one_device_reference(model)
        yield wait_healthy(launched)[1], reference
    finally:
        launched.proc.terminate()
        launched.proc.wait(timeout=30)


def test_completions_equal_one_device_and_nothing_leaks(served) -> None:
    server, reference = served
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)

    def one(job: tuple[int, str, bool]) -> str:
        i, kind, stream = job
        kw = dict(model=MODEL, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                  extra_body={"ignore_eos": True})
        if kind == "greedy":
            kw["temperature"] = 0.0
        else:  # OpenAI's default temperature 1, seeded
            kw["seed"] = i
        if not stream:
            return client.completions.create(**kw).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))

    jobs = [(i, kind, i % 3 == 0) for kind in ("greedy", "seeded") for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(one, jobs))
    assert got[:len(PROMPTS)] == reference["greedy"]
    assert got[len(PROMPTS):] == reference["seeded"]

    chat = client.chat.completions.create(
        model=MODEL, max_tokens=4, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-1)

    stats = wait_idle(server)
    assert stats["kv_held"] == 0 and stats["num_late_compiles"] == 0, stats
    assert httpx.get(server + "/debug/check_integrity", timeout=30).status_code == 200
    # the dashboard's data: a part per DP rank, the prompts cached across the ranks
    ranks = httpx.get(server + "/dashboard/data", timeout=30).json()["ranks"]
    assert len(ranks) == 2 and sum(r["tree"]["cached_tokens"] for r in ranks) > 0
    assert all(r["running"] == [] and r["pool"]["held"] == 0 for r in ranks)
