"""Workloads: lists of sessions, each a list of turns sent one after another.

A single-shot workload (shared prefix, random, JSON schema) is a list of one-turn
sessions; a multi-turn chat is a session per conversation whose turn i is sent with the
whole history (system, user 0, assistant 0, ..., user i), the assistant messages being
what the server actually answered. Generation is pure: a seed and a tokenizer in, the
same sessions out.

Prompt text of N tokens: random words from a fixed list, tokenized, cut at N tokens and
decoded, so its length with the model's tokenizer is N (+-1 at the cut)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

WORDS = ("time person year way day thing man world life hand part child eye woman place "
         "work week case point government company number group problem fact river stone "
         "garden window engine signal letter market answer question morning winter summer "
         "music paper story light water color table mountain city forest ocean bridge road "
         "history science planet animal language friend doctor teacher village island cloud "
         "quickly slowly bright quiet ancient modern simple careful gentle strong narrow "
         "build carry follow gather measure notice remember explain travel describe").split()

JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Turn:
    """One request. `prompt` for /v1/completions; `user` (+ the session's history) for
    /v1/chat/completions."""

    max_tokens: int
    prompt: str | None = None
    user: str | None = None
    ignore_eos: bool = True
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class Session:
    """Turns sent in order; chat sessions carry the system prompt and history."""

    turns: tuple[Turn, ...]
    system: str | None = None
    group: int = 0  # the shared-prefix group (or conversation) it belongs to

    @property
    def is_chat(self) -> bool:
        return self.turns[0].user is not None


@dataclass(frozen=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def random_text(tok: Tokenizer, num_tokens: int, rng: random.Random) -> str:
    """Text that tokenizes to about `num_tokens` tokens."""
    words = " ".join(rng.choice(WORDS) for _ in range(num_tokens + 8))
    ids = tok.encode(words, add_special_tokens=False)
    while len(ids) < num_tokens:  # words are >= 1 token, so this rarely runs
        ids += tok.encode(" " + rng.choice(WORDS), add_special_tokens=False)
    return tok.decode(ids[:num_tokens])


def generated_shared_prefix(tok: Tokenizer, *, num_groups: int, prompts_per_group: int,
                            system_len: int, question_len: int, output_len: int,
                            seed: int = 0, chat: bool = False) -> Workload:
    """SGLang's gsp: each group shares one long system prompt; questions are unique.
    Requests are interleaved across groups (group 0 q0, group 1 q0, ...), so a cache
    must keep several prefixes to hit. chat: chat requests (the system prompt as the
    system message, the question as the user's) instead of completions."""
    rng = random.Random(seed)
    systems = [random_text(tok, system_len, rng) for _ in range(num_groups)]
    questions = [[random_text(tok, question_len, rng) for _ in range(prompts_per_group)]
                 for _ in range(num_groups)]

    def session(g: int, q: int) -> Session:
        if chat:
            return Session((Turn(output_len, user=questions[g][q]),), system=systems[g],
                           group=g)
        prompt = systems[g] + "\n\nQuestion: " + questions[g][q] + "\nAnswer:"
        return Session((Turn(output_len, prompt=prompt),), group=g)

    sessions = tuple(session(g, q) for q in range(prompts_per_group) for g in range(num_groups))
    return Workload("generated-shared-prefix", sessions, dict(
        num_groups=num_groups, prompts_per_group=prompts_per_group, system_len=system_len,
        question_len=question_len, output_len=output_len, seed=seed, chat=chat))


def multi_turn(tok: Tokenizer, *, num_conversations: int, num_turns: int, system_len: int,
               message_len: int, output_len: int, seed: int = 0) -> Workload:
    """Chats: each turn re-sends the history, so turn i's prompt extends turn i-1's."""
    rng = random.Random(seed)
    sessions = tuple(
        Session(tuple(Turn(output_len, user=random_text(tok, message_len, rng))
                      for _ in range(num_turns)),
                system=random_text(tok, system_len, rng), group=c)
        for c in range(num_conversations))
    return Workload("multi-turn", sessions, dict(
        num_conversations=num_conversations, num_turns=num_turns, system_len=system_len,
        message_len=message_len, output_len=output_len, seed=seed))


def random_prompts(tok: Tokenizer, *, num_prompts: int, input_len: int, output_len: int,
                   seed: int = 0) -> Workload:
    """Unrelated prompts: nothing to share beyond chance."""
    rng = random.Random(seed)
    sessions = tuple(Session((Turn(output_len, prompt=random_text(tok, input_len, rng)),),
                             group=i) for i in range(num_prompts))
    return Workload("random", sessions, dict(num_prompts=num_prompts, input_len=input_len,
                                             output_len=output_len, seed=seed))


def json_schema(tok: Tokenizer, *, num_prompts: int, output_len: int,
                seed: int = 0) -> Workload:
    """Chat requests constrained by `JSON_SCHEMA` (response_format json_schema); they stop
    when the object closes, so no ignore_eos and output lengths vary."""
    rng = random.Random(seed)
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": JSON_SCHEMA, "strict": True}}
    sessions = tuple(
        Session((Turn(output_len, user="Invent a person who likes "
                      + random_text(tok, 8, rng) + ". Reply with JSON: name, age, city.",
                      ignore_eos=False, response_format=fmt),),
                system="You are a helpful assistant.", group=i)
        for i in range(num_prompts))
    return Workload("json-schema", sessions, dict(num_prompts=num_prompts,
                                                  output_len=output_len, seed=seed))


def chat_messages(session: Session, turn: int, answers: list[str]) -> list[dict[str, str]]:
    """The messages for `turn`: system, then every earlier user message and the answer
    the server gave to it, then this turn's user message."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs {turn} earlier answers, got {len(answers)}")
    messages = [{"role": "system", "content": session.system}] if session.system else []
    for i in range(turn):
        messages += [{"role": "user", "content": session.turns[i].user},
                     {"role": "assistant", "content": answers[i]}]
    messages.append({"role": "user", "content": session.turns[turn].user})
    return messages
