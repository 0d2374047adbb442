"""OpenAI's logit_bias through the real server (a runtime value of the step programs
that already exist: nothing compiles late): a banned token never appears, +100 forces
one, bad maps are 400s naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL

PROMPT = "The capital of France is"


def native_ids(url: str, **sampling) -> list[int]:
    r = httpx.post(url + "/generate", timeout=60, json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": 12, **sampling}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_a_banned_token_never_appears_and_a_forced_one_always(server) -> None:
    greedy = native_ids(server, temperature=0)
    banned = {str(t): -100 for t in set(greedy[:3])}
    got = native_ids(server, temperature=0, logit_bias=banned)
    assert not set(got) & {int(t) for t in banned}, (greedy, got)
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    forced = greedy[-1]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0,
                                  logit_bias={str(forced): 100},
                                  extra_body={"ignore_eos": True})
    ids = native_ids(server, temperature=1.0, ignore_eos=True,
                     logit_bias={str(forced): 100})
    assert ids == [forced] * 12
    assert r.choices[0].text  # the OpenAI route takes it too
    # a request without a bias in the same batch is untouched
    assert native_ids(server, temperature=0) == greedy


@pytest.mark.parametrize("bias, says", [({"abc": 1}, "token ids"), ({"5": 101}, "[-100, 100]"),
                                        ({"10000000": 1}, "vocabulary"),
                                        ({str(i): 1 for i in range(301)}, "at most 300")])
def test_bad_logit_bias_is_a_400(server, bias, says) -> None:
    r = httpx.post(server + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "logit_bias": bias})
    assert r.status_code == 400 and says in r.text, r.text
