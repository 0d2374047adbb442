"""SGLang's classic programs on radixjax.lang, on both backends: what each program
writes, and greedy outputs equal between the in-process engine and HTTP."""

from __future__ import annotations

import asyncio
import ipaddress
import json

import jsonschema
import pytest

from radixjax import lang as sgl
from tests.lang.programs import CITIES, FEW_SHOT, PERSON, build

P = build(sgl)
GREEDY = dict(temperature=0)


def test_few_shot_qa(backend) -> None:
    s = P.few_shot_qa.run(question="What is the capital of Spain?", backend=backend, **GREEDY)
    assert s["answer"].strip() == "Madrid"
    assert s.text().endswith("Q: What is the capital of Spain?\nA:" + s["answer"])
    meta = s.get_meta_info("answer")
    assert meta["finish_reason"]["type"] == "stop" and meta["prompt_tokens"] > 40


def test_multi_turn_chat_writes_the_models_chat_template(backend, lang_engine) -> None:
    s = P.multi_turn_chat.run(question_1="What is 2+2?", question_2="And 3+3?",
                              backend=backend, **GREEDY)
    messages = s.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user",
                                             "assistant"]
    assert messages[2]["content"] == s["answer_1"] and s["answer_1"]
    # The text is exactly what the model's own template renders for these messages.
    tok = lang_engine.tokenizer
    assert s.text() == tok.apply_chat_template(messages, tokenize=False)


def test_select_picks_the_confident_answer(backend) -> None:
    s = P.capital.run(country="France", choices=[" Paris", " London", " Berlin"],
                      backend=backend)
    assert s["city"] == " Paris" and s.text() == "The capital of France is Paris"
    scores = s.get_meta_info("city")["scores"]
    assert scores[0] == max(scores)


def test_fork_join_tip_suggestion(backend) -> None:
    s = P.tip_suggestion.run(topic="health", backend=backend, **GREEDY)
    text = s.text()
    assert "Tip 1:" in text and "Tip 2:" in text and s["summary"]
    assert "detailed_tip" not in s  # branches keep their variables until a join


def test_fork_computes_the_shared_prefix_once(backend) -> None:
    countries = list(CITIES)
    backend.flush_cache()
    s = P.parallel_branches.run(countries=countries, backend=backend, **GREEDY)
    assert [a.strip() for a in s["answer"]] == list(CITIES.values())
    # The branches' requests all start with the few-shot prefix (nothing was cached
    # before them): it is computed once, the other branches find it in the radix cache.
    cached = [m["cached_tokens"] for m in s.get_meta_info("answer")]
    prefix = backend.generate({"text": FEW_SHOT, "sampling_params": {"max_new_tokens": 0}})
    shared = prefix["meta_info"]["prompt_tokens"]
    assert sorted(cached)[1:] == [c for c in sorted(cached)[1:] if c >= shared], cached


def test_regex_json_and_dtype(backend) -> None:
    s = P.regex_and_json.run(backend=backend, **GREEDY)
    ipaddress.ip_address(s["ip"].strip())
    jsonschema.validate(json.loads(s["person"]), PERSON)
    total = P.arithmetic.run(backend=backend, **GREEDY)["sum"]
    assert str(int(total)) == total.strip()  # an integer literal, whatever its value


def test_run_batch_equals_one_by_one(backend) -> None:
    questions = [{"question": f"What is the capital of {c}?"} for c in CITIES]
    states = P.few_shot_qa.run_batch(questions, backend=backend, progress_bar=True, **GREEDY)
    assert [st["answer"].strip() for st in states] == list(CITIES.values())
    one = P.few_shot_qa.run(**questions[1], backend=backend, **GREEDY)
    assert states[1]["answer"] == one["answer"]


def test_streaming(backend) -> None:
    s = P.multi_turn_chat.run(question_1="Name a color.", question_2="Another one?",
                              backend=backend, stream=True, **GREEDY)
    pieces = list(s.text_iter())
    assert len(pieces) > 6 and "".join(pieces) == s.text()
    s = P.few_shot_qa.run(question="What is the capital of Japan?", backend=backend,
                          stream=True, **GREEDY)

    async def collect() -> str:
        return "".join([t async for t in s.text_async_iter(var_name="answer")])

    assert asyncio.run(collect()) == s["answer"] and s["answer"].strip() == "Tokyo"


def test_both_backends_write_the_same_text(engine_backend, http_backend) -> None:
    runs = [
        (P.few_shot_qa, dict(question="What is the capital of Egypt?")),
        (P.multi_turn_chat, dict(question_1="Hi!", question_2="How are you?")),
        (P.capital, dict(country="Japan", choices=[" Tokyo", " Kyoto", " Osaka"])),
        (P.tip_suggestion, dict(topic="sleep")),
        (P.regex_and_json, {}),
    ]
    for program, kwargs in runs:
        texts = [program.run(backend=b, **GREEDY, **kwargs).text()
                 for b in (engine_backend, http_backend)]
        assert texts[0] == texts[1], program.__name__


def test_a_failing_request_is_reported_not_hung(backend) -> None:
    @sgl.function
    def bad(s):
        s += "x" + sgl.gen("y", max_tokens=-3)

    s = bad.run(backend=backend)
    with pytest.raises(sgl.ProgramError, match="max_new_tokens"):
        s.text()
