"""Incremental detokenization equals a full decode, pushed in any split; the stop matcher
finds stop strings across pushes, holds back a possible start, and emits the rest."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.engine.detokenizer import IncrementalDetokenizer, StopMatcher

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "  leading spaces,\ttabs\nand new lines\n\n  indented",
    "ünïcödé: 日本語のテキスト, emoji 🙂👍🏽, math ∑∫√",
    "def f(x):\n    return x ** 2  # code\n",
]


def _split(ids: list[int], rng: np.random.Generator) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = int(rng.integers(1, 4))
        out.append(ids[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_pushes_add_up_to_the_full_decode(smollm2, text) -> None:
    tok = smollm2.tokenizer
    ids = tok(text, add_special_tokens=False).input_ids
    for seed in range(3):
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push(p) for p in _split(ids, np.random.default_rng(seed))]
        assert "".join(pieces) + detok.flush() == tok.decode(ids, skip_special_tokens=True)
        assert all("\ufffd" not in p for p in pieces)  # a partial character is held back


def test_random_token_ids_add_up_to_the_full_decode(smollm2) -> None:
    tok = smollm2.tokenizer
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = [int(t) for t in rng.integers(0, len(tok), 40)]
        detok = IncrementalDetokenizer(tok)
        got = "".join(detok.push(p) for p in _split(ids, rng)) + detok.flush()
        assert got == tok.decode(ids, skip_special_tokens=True)


def test_stop_strings_across_pushes() -> None:
    m = StopMatcher(("STOP", "\n\n"))
    assert m.push("abc S") == ("abc ", False)  # "S" may start STOP: held
    assert m.push("T") == ("", False)
    assert m.push("OP and more") == ("", True)  # nothing of the stop string is emitted
    m = StopMatcher(("STOP",))
    assert m.push("ST") == ("", False)
    assert m.push("ART") == ("START", False)  # not a stop after all: released
    assert m.push("x\n") == ("x\n", False)
    assert m.push("ST") == ("", False)
    assert m.flush() == "ST"  # finished without a stop: the held tail is text
    m = StopMatcher(("ab", "b"))
    assert m.push("xab") == ("x", True)  # the earliest stop wins
    assert StopMatcher(()).push("anything") == ("anything", False)
