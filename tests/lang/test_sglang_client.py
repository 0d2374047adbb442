"""SGLang's own frontend (`sglang`'s RuntimeEndpoint, PyPI sglang 0.5.23) runs SGLang's
classic programs against our server unchanged; with the model's template (ChatML) its
greedy text equals radixjax.lang's over HTTP."""

from __future__ import annotations

import pytest
import sglang  # a test dependency: scripts/setup.sh test installs it (--no-deps)

from radixjax import lang
from tests.lang.programs import CITIES, build

OURS, THEIRS = build(lang), build(sglang)
GREEDY = dict(temperature=0)
RUNS = [
    ("few_shot_qa", dict(question="What is the capital of Spain?")),
    ("multi_turn_chat", dict(question_1="What is 2+2?", question_2="And 3+3?")),
    ("capital", dict(country="France", choices=[" Paris", " London", " Berlin"])),
    ("tip_suggestion", dict(topic="health")),
    ("regex_and_json", {}),
]


@pytest.fixture(scope="module")
def endpoint(server):
    return sglang.RuntimeEndpoint(server, chat_template_name="chatml")


@pytest.mark.parametrize(("name", "kwargs"), RUNS, ids=[r[0] for r in RUNS])
def test_sglang_programs_equal_ours(endpoint, http_backend, name, kwargs) -> None:
    theirs = getattr(THEIRS, name).run(backend=endpoint, **GREEDY, **kwargs)
    ours = getattr(OURS, name).run(backend=http_backend, **GREEDY, **kwargs)
    assert theirs.error() is None, theirs.error()
    assert theirs.text() == ours.text()


def test_sglang_run_batch_and_stream(endpoint) -> None:
    questions = [{"question": f"What is the capital of {c}?"} for c in CITIES]
    states = THEIRS.few_shot_qa.run_batch(questions, backend=endpoint, **GREEDY)
    assert [s["answer"].strip() for s in states] == list(CITIES.values())
    s = THEIRS.few_shot_qa.run(question="What is the capital of Japan?", backend=endpoint,
                               stream=True, **GREEDY)
    assert "".join(s.text_iter()).endswith("Tokyo")
    s = THEIRS.parallel_branches.run(countries=list(CITIES), backend=endpoint, **GREEDY)
    assert [a.strip() for a in s["answer"]] == list(CITIES.values())
