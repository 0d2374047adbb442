"""SGLang's native API on the real server, as SGLang's own clients use it: batched
/generate (a list in, a list out), n samples, prefill-only requests, prompt and output
logprobs in SGLang's [logprob, token_id, text] form, streaming, and the info, load and
abort endpoints."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest

GREEDY = {"max_new_tokens": 6, "temperature": 0}


def generate(server: str, **body) -> dict | list:
    r = httpx.post(server + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def prompt_ids(server: str, text: str) -> list[int]:
    """The server's tokens for `text` (its scored prompt, from position 0)."""
    r = generate(server, text=text, sampling_params={"max_new_tokens": 0},
                 return_logprob=True, logprob_start_len=0)
    return [t for _, t, _ in r["meta_info"]["input_token_logprobs"]]


def test_batched_and_n_samples_are_lists_equal_to_single_requests(server) -> None:
    texts = ["The capital of France is", "One, two, three,"]
    singles = [generate(server, text=t, sampling_params=GREEDY)["text"] for t in texts]
    batch = generate(server, text=texts, sampling_params=GREEDY)
    assert [b["text"] for b in batch] == singles
    ids = [prompt_ids(server, t) for t in texts]
    by_ids = generate(server, input_ids=ids, sampling_params=[GREEDY, GREEDY])
    assert [b["text"] for b in by_ids] == singles
    sampled = generate(server, text=texts[0], sampling_params={
        "max_new_tokens": 8, "temperature": 1.0, "n": 3, "seed": 7})
    assert len(sampled) == 3 and len({s["text"] for s in sampled}) > 1
    assert [s["meta_info"]["id"][-2:] for s in sampled] == ["-0", "-1", "-2"]
    assert [s["meta_info"]["seed"] for s in sampled] == [7, 8, 9]  # the seed each used


def test_prefill_only_caches_the_prefix(server) -> None:
    prefix = "A long shared instruction about geography and capital cities. " * 4
    first = generate(server, text=prefix, sampling_params={"max_new_tokens": 0})
    meta = first["meta_info"]
    assert first["text"] == "" and first["output_ids"] == []
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    after = generate(server, text=prefix + "Paris is in", sampling_params=GREEDY)
    assert after["meta_info"]["cached_tokens"] >= meta["prompt_tokens"] - 1


def test_prompt_logprobs_agree_with_output_logprobs(server) -> None:
    """The logprob of each generated token, scored again as part of a prompt (from the
    step's prompt-logprob path), equals the logprob it had when it was generated (the
    default CPU form runs every token's attention through the same handler,
    model/cpu_decode.py, as a prompt token or a decode)."""
    text = "The three primary colors are"
    ids = prompt_ids(server, text)
    out = generate(server, input_ids=ids, sampling_params=GREEDY, return_logprob=True,
                   top_logprobs_num=2, return_text_in_logprobs=True)
    meta = out["meta_info"]
    lps = meta["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out["output_ids"]
    assert "".join(s for _, _, s in lps) == out["text"]
    assert meta["input_token_logprobs"] == []  # logprob_start_len -1: outputs only
    assert all(top[0][1] == t for top, (_, t, _) in zip(meta["output_top_logprobs"], lps,
                                                         strict=True))  # greedy = top 1
    scored = generate(server, input_ids=ids + out["output_ids"],
                      sampling_params={"max_new_tokens": 0}, return_logprob=True,
                      logprob_start_len=len(ids), top_logprobs_num=2)["meta_info"]
    got = scored["input_token_logprobs"]
    assert [t for _, t, _ in got] == out["output_ids"]
    np.testing.assert_allclose([lp for lp, _, _ in got], [lp for lp, _, _ in lps],
                               atol=2e-3)
    assert [top[0][1] for top in scored["input_top_logprobs"]] == out["output_ids"]
    whole = generate(server, input_ids=ids, sampling_params={"max_new_tokens": 0},
                     return_logprob=True, logprob_start_len=0)["meta_info"]
    first = whole["input_token_logprobs"]
    assert len(first) == len(ids) and first[0][0] is None
    assert all(lp <= 0 for lp, _, _ in first[1:])


def test_stream_is_cumulative_and_batched_streams_carry_an_index(server) -> None:
    body = {"text": "The capital of France is", "sampling_params": GREEDY}
    want = generate(server, **body)["text"]
    with httpx.stream("POST", server + "/generate", json=dict(body, stream=True),
                      timeout=60) as s:
        events = [e[6:] for e in s.iter_lines() if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert texts[-1] == want and chunks[-1]["meta_info"]["finish_reason"] is not None
    # the prompt was just cached by the same request: every event knows it
    assert {c["meta_info"]["cached_tokens"] for c in chunks} == {
        chunks[-1]["meta_info"]["cached_tokens"]} != {0}
    with httpx.stream("POST", server + "/generate", timeout=60, json={
            "text": [body["text"]] * 2, "sampling_params": GREEDY, "stream": True}) as s:
        events = [json.loads(e[6:]) for e in s.iter_lines()
                  if e.startswith("data: ") and e != "data: [DONE]"]
    last = {e["index"]: e["text"] for e in events}
    assert last == {0: want, 1: want}


def test_info_load_and_abort(server) -> None:
    info = httpx.get(server + "/get_model_info", timeout=10).json()
    assert info["is_generation"] is True and info["model_path"].endswith(".gguf")
    assert httpx.get(server + "/server_info", timeout=10).json()["engine"]["policy"] == "lpm"
    (load,) = httpx.get(server + "/get_load", timeout=10).json()
    assert {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"} <= set(load)
    result = {}

    def long_request() -> None:
        result["out"] = generate(server, text="Count to one thousand:", rid="to-abort",
                                 sampling_params={"max_new_tokens": 400, "temperature": 0,
                                                  "ignore_eos": True})

    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.post(server + "/abort_request", json={"rid": "to-abort"}, timeout=10)
        if r.json()["aborted"]:
            break
        time.sleep(0.2)
    worker.join(timeout=60)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"] == {"type": "abort"} and meta["completion_tokens"] < 400


@pytest.mark.parametrize(("body", "needle"), [
    ({"text": "a", "sampling_params": {"repetition_penalty": 1.3}}, "repetition_penalty"),
    ({"text": "a", "sampling_params": {"stop_regex": ["x+"]}}, "stop_regex"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "a b c", "return_logprob": True, "logprob_start_len": 50}, "logprob_start_len"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"input_ids": [[1, 2], []]}, "input_ids"),
    ({"text": "a", "bogus": 1}, "bogus"),
    ({"text": "a", "return_hidden_states": True}, "return_hidden_states"),
])
def test_bad_native_requests_are_400(server, body, needle) -> None:
    r = httpx.post(server + "/generate", json=body, timeout=30)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_skip_special_tokens(server) -> None:
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    sp = {"max_new_tokens": 64, "temperature": 0}
    plain = generate(server, text=chat, sampling_params=sp)
    raw = generate(server, text=chat, sampling_params=dict(sp, skip_special_tokens=False))
    assert plain["meta_info"]["finish_reason"]["type"] == "stop"  # at <|im_end|>
    assert plain["output_ids"] == raw["output_ids"]
    assert raw["text"] == plain["text"] + "<|im_end|>"
