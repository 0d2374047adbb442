"""/v1/completions' echo and suffix through the real server (SmolLM2, which has
StarCoder's fill-in-the-middle tokens), with the openai client."""

from __future__ import annotations

import httpx
import openai

from tests.server.conftest import MODEL

PROMPT = "The capital of France is"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def test_echo_puts_the_prompt_and_its_logprobs_first(server) -> None:
    c = client(server)
    plain = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    echoed = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                  echo=True, logprobs=2)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    lp = echoed.choices[0].logprobs
    assert "".join(lp.tokens) == echoed.choices[0].text
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert len(lp.tokens) == echoed.usage.prompt_tokens + echoed.usage.completion_tokens
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, echo=True, stream=True))
    assert streamed == echoed.choices[0].text
    r = httpx.post(server + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_suffix_without_fim_tokens_is_a_400_naming_them(server) -> None:
    """SmolLM2's vocabulary has no fill-in-the-middle tokens: a precise 400."""
    r = httpx.post(server + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "def add(a, b):", "suffix": "print(add(1, 2))"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "suffix", r.text
    assert "<fim_prefix>, <fim_suffix>, <fim_middle>" in err["message"]
    r = httpx.post(server + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": [1, 2, 3], "suffix": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


def test_fim_tokens_are_read_from_the_vocabulary() -> None:
    import pytest

    from radixjax.api.errors import APIError
    from radixjax.server.openai_routes import fim_tokens

    class Tok:
        def __init__(self, vocab: dict) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict:
            return self.vocab

    assert fim_tokens(Tok({"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3})) == (
        1, 2, 3)
    with pytest.raises(APIError, match="no <fim_middle>"):
        fim_tokens(Tok({"<fim_prefix>": 1, "<fim_suffix>": 2}))
