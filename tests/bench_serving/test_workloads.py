from __future__ import annotations

import random

import pytest
from bench_serving import workloads as wl
from bench_serving.runner import arrival_delays, count_prompt_tokens

from tests.bench_serving.conftest import WordTokenizer

TOK = WordTokenizer()


def test_random_text_has_the_asked_length():
    rng = random.Random(0)
    for n in (1, 7, 64, 300):
        assert len(TOK.encode(wl.random_text(TOK, n, rng))) == n


def test_shared_prefix_groups_share_their_system_prompt_and_interleave():
    w = wl.generated_shared_prefix(TOK, num_groups=3, prompts_per_group=4, system_len=50,
                                   question_len=10, output_len=8, seed=1)
    assert w.num_requests == 12 and w.name == "generated-shared-prefix"
    assert [s.group for s in w.sessions[:6]] == [0, 1, 2, 0, 1, 2]  # interleaved
    by_group: dict[int, list[str]] = {}
    for s in w.sessions:
        (turn,) = s.turns
        assert turn.max_tokens == 8 and turn.ignore_eos and not s.is_chat
        by_group.setdefault(s.group, []).append(turn.prompt)
    for prompts in by_group.values():
        prefixes = {p.split("\n\nQuestion: ")[0] for p in prompts}
        assert len(prefixes) == 1 and len(TOK.encode(prefixes.pop())) == 50
        assert len(set(prompts)) == 4  # the questions differ
    systems = {ps[0].split("\n\n")[0] for ps in by_group.values()}
    assert len(systems) == 3


def test_shared_prefix_as_chat_puts_the_shared_prompt_in_the_system_message():
    args = dict(num_groups=2, prompts_per_group=3, system_len=40, question_len=6,
                output_len=8, seed=2)
    chat = wl.generated_shared_prefix(TOK, chat=True, **args)
    plain = wl.generated_shared_prefix(TOK, **args)
    assert chat.num_requests == 6 and all(s.is_chat for s in chat.sessions)
    for c, p in zip(chat.sessions, plain.sessions, strict=True):
        assert c.group == p.group and c.turns[0].max_tokens == 8
        assert p.turns[0].prompt == f"{c.system}\n\nQuestion: {c.turns[0].user}\nAnswer:"
    assert len({s.system for s in chat.sessions}) == 2
    assert len({s.turns[0].user for s in chat.sessions}) == 6


def test_workloads_are_deterministic_per_seed():
    def make(seed: int) -> wl.Workload:
        return wl.generated_shared_prefix(TOK, num_groups=2, prompts_per_group=2,
                                          system_len=20, question_len=5, output_len=4,
                                          seed=seed)
    assert make(3) == make(3)
    assert make(3) != make(4)


def test_multi_turn_history_grows_with_the_server_answers():
    w = wl.multi_turn(TOK, num_conversations=2, num_turns=3, system_len=16, message_len=8,
                      output_len=4)
    assert w.num_requests == 6
    s = w.sessions[0]
    assert s.is_chat and len(TOK.encode(s.system)) == 16
    first = wl.chat_messages(s, 0, [])
    assert [m["role"] for m in first] == ["system", "user"]
    third = wl.chat_messages(s, 2, ["answer one", "answer two"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user",
                                          "assistant", "user"]
    assert third[2]["content"] == "answer one" and third[-1]["content"] == s.turns[2].user
    assert third[:2] == first  # each turn's prompt extends the previous one
    assert count_prompt_tokens(TOK, None, third) > count_prompt_tokens(TOK, None, first)
    with pytest.raises(ValueError):
        wl.chat_messages(s, 2, ["only one"])


def test_random_and_json_workloads():
    r = wl.random_prompts(TOK, num_prompts=5, input_len=30, output_len=6)
    assert len({s.turns[0].prompt for s in r.sessions}) == 5
    assert all(count_prompt_tokens(TOK, s.turns[0].prompt, None) == 30 for s in r.sessions)
    j = wl.json_schema(TOK, num_prompts=3, output_len=50)
    turn = j.sessions[0].turns[0]
    assert not turn.ignore_eos and turn.response_format["type"] == "json_schema"
    assert turn.response_format["json_schema"]["schema"] == wl.JSON_SCHEMA


def test_arrival_delays():
    assert arrival_delays(4, float("inf"), random.Random(0)) == [0.0] * 4
    d = arrival_delays(2000, 50.0, random.Random(0))
    assert d[0] == 0.0 and all(b >= a for a, b in zip(d, d[1:], strict=False))
    assert d[-1] / len(d) == pytest.approx(1 / 50.0, rel=0.1)  # mean gap 1 / rate
