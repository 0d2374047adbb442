"""SGLang's classic programs on radixjax.lang: each runs on both backends (the
in-process engine and HTTP to the server), their greedy text must be equal, and what the
program wrote is checked."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re

import jsonschema
import pytest

from radixjax import lang as sgl
from tests.lang.programs import CITIES, FEW_SHOT, PERSON, build

P = build(sgl)
GREEDY = dict(temperature=0)


@pytest.fixture(scope="module")
def run_both(engine_backend, http_backend):
    """run_both(program, **kwargs) -> its state on the engine backend, after checking the
    HTTP backend writes the same text."""
    def run(program: sgl.Program, **kwargs) -> sgl.ProgramState:
        states = [program.run(backend=b, **kwargs) for b in (engine_backend, http_backend)]
        assert states[0].text() == states[1].text(), program.__name__
        return states[0]
    return run


def test_few_shot_qa(run_both) -> None:
    s = run_both(P.few_shot_qa, question="What is the capital of Spain?", **GREEDY)
    assert s["answer"].strip() == "Madrid"
    assert s.text().endswith("Q: What is the capital of Spain?\nA:" + s["answer"])
    meta = s.get_meta_info("answer")
    assert meta["finish_reason"]["type"] == "stop" and meta["prompt_tokens"] > 40


def test_multi_turn_chat_writes_the_models_chat_template(run_both, lang_engine) -> None:
    s = run_both(P.multi_turn_chat, question_1="What is 2+2?", question_2="And 3+3?",
                 **GREEDY)
    messages = s.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user",
                                             "assistant"]
    assert messages[2]["content"] == s["answer_1"] and s["answer_1"]
    # The text is exactly what the model's own template renders for these messages.
    tok = lang_engine.tokenizer
    assert s.text() == tok.apply_chat_template(messages, tokenize=False)


def test_select_picks_the_confident_answer(run_both) -> None:
    s = run_both(P.capital, country="France", choices=[" Paris", " London", " Berlin"])
    assert s["city"] == " Paris" and s.text() == "The capital of France is Paris"
    scores = s.get_meta_info("city")["scores"]
    assert scores[0] == max(scores)


def test_fork_tip_suggestion(run_both) -> None:
    s = run_both(P.tip_suggestion, topic="health", **GREEDY)
    text = s.text()
    assert "Tip 1:" in text and "Tip 2:" in text and s["summary"]
    assert "detailed_tip" not in s  # branches keep their variables until a join


@pytest.mark.parametrize("which", ["engine", "http"])
def test_fork_computes_the_shared_prefix_once(request, which) -> None:
    backend = request.getfixturevalue(f"{which}_backend")
    backend.flush_cache()
    s = P.parallel_branches.run(countries=list(CITIES), backend=backend, **GREEDY)
    assert [a.strip() for a in s["answer"]] == list(CITIES.values())
    # The branches' requests all start with the few-shot prefix (nothing was cached
    # before them): it is computed once, the other branches find it in the radix cache.
    cached = sorted(m["cached_tokens"] for m in s.get_meta_info("answer"))
    prefix = backend.generate({"text": FEW_SHOT, "sampling_params": {"max_new_tokens": 0}})
    shared = prefix["meta_info"]["prompt_tokens"]
    assert all(c >= shared for c in cached[1:]), (cached, shared)


def test_regex_json_and_dtype(run_both) -> None:
    s = run_both(P.regex_and_json, **GREEDY)
    ipaddress.ip_address(s["ip"].strip())
    jsonschema.validate(json.loads(s["person"]), PERSON)
    total = run_both(P.arithmetic, **GREEDY)["sum"]
    assert str(int(total)) == total.strip()  # an integer literal, whatever its value
    s = run_both(P.typed_answers, **GREEDY)
    assert re.fullmatch(r" ?-?[0-9]+(\.[0-9]+)?", s["pi"]) and float(s["pi"]) > 0
    assert s["wet"].strip() in ("True", "False")
    assert re.fullmatch(r' ?"[^"]*"', s["fruit"])
    assert s["colour"] == " red"  # gen(choices=...) is a select


def test_run_batch_equals_one_by_one(engine_backend, http_backend) -> None:
    questions = [{"question": f"What is the capital of {c}?"} for c in CITIES]
    answers = []
    for backend in (engine_backend, http_backend):
        states = P.few_shot_qa.run_batch(questions, backend=backend, progress_bar=True,
                                         **GREEDY)
        answers.append([st["answer"] for st in states])
    assert answers[0] == answers[1]
    assert [a.strip() for a in answers[0]] == list(CITIES.values())
    one = P.few_shot_qa.run(**questions[1], backend=engine_backend, **GREEDY)
    assert answers[0][1] == one["answer"]


@pytest.mark.parametrize("which", ["engine", "http"])
def test_streaming(request, which) -> None:
    backend = request.getfixturevalue(f"{which}_backend")
    s = P.multi_turn_chat.run(question_1="Name a color.", question_2="Another one?",
                              backend=backend, stream=True, **GREEDY)
    pieces = list(s.text_iter())
    assert len(pieces) > 6 and "".join(pieces) == s.text()
    s = P.few_shot_qa.run(question="What is the capital of Japan?", backend=backend,
                          stream=True, **GREEDY)

    async def collect() -> str:
        return "".join([t async for t in s.text_async_iter(var_name="answer")])

    assert asyncio.run(collect()) == s["answer"] and s["answer"].strip() == "Tokyo"


@pytest.mark.parametrize("which", ["engine", "http"])
def test_a_failing_request_is_reported_not_hung(request, which) -> None:
    @sgl.function
    def bad(s):
        s += "x" + sgl.gen("y", max_tokens=-3)

    s = bad.run(backend=request.getfixturevalue(f"{which}_backend"))
    with pytest.raises(sgl.ProgramError, match="max_new_tokens"):
        s.text()


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}


@sgl.function
def weather_agent(s, question, choice):
    s += sgl.system(sgl.tools_prompt([WEATHER_TOOL]))
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("call", max_tokens=60, tools=[WEATHER_TOOL],
                               tool_choice=choice))


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_gen_with_tools_makes_valid_calls_on_both_backends(run_both, choice) -> None:
    s = run_both(weather_agent, question="Weather in Rome?", choice=choice, **GREEDY)
    calls = s.get_meta_info("call")["tool_calls"]
    assert len(calls) >= 1 and calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]),
                        WEATHER_TOOL["function"]["parameters"])
    assert s["call"].startswith("<tool_call>")  # the text keeps what the model wrote
    with pytest.raises(ValueError, match="tool_choice"):
        sgl.gen("x", tools=[WEATHER_TOOL], tool_choice={"type": "function",
                                                        "function": {"name": "nope"}})
