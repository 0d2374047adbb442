"""select's three scoring methods: against numpy computations written out here, on fixed
logprobs and on the logprobs a real select fetched (both backends)."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax import lang as sgl
from radixjax.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)

METHODS = [token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized]


def reference(method, cond: list[list[float]], prior: list[list[float | None]]) -> int:
    """Each method from its definition, with plain numpy."""
    if method is token_length_normalized:
        return int(np.argmax([np.sum(c) / len(c) for c in cond]))
    if method is unconditional_likelihood_normalized:
        lifts = [np.mean(np.array(c) - np.array([p or 0.0 for p in q]))
                 for c, q in zip(cond, prior, strict=True)]
        return int(np.argmax(lifts))
    width = max(map(len, cond))
    rows = np.array([c + [np.mean(c)] * (width - len(c)) for c in cond])
    keep = list(range(len(cond)))
    for j in range(width):
        best = rows[keep, j].max()
        keep = [i for i in keep if rows[i, j] == best]
        if len(keep) == 1:
            break
    return keep[0]


def test_methods_on_fixed_logprobs() -> None:
    cond = [[-0.1, -5.0], [-0.5, -0.6, -0.4], [-0.2, -0.3]]
    prior = [[None, -6.0], [None, -0.1, -0.1], [None, -0.2]]
    picks = [m(cond, prior).index for m in METHODS]
    assert picks == [reference(m, cond, prior) for m in METHODS] == [2, 0, 0]
    # a shorter choice continues with its own mean when compared token by token
    tied = [[-0.3, -0.3], [-0.3, -0.3, -0.1]]
    assert greedy_token_selection(tied).index == reference(greedy_token_selection, tied,
                                                           []) == 1


@pytest.mark.parametrize("method", METHODS, ids=lambda m: type(m).__name__)
def test_select_scores_equal_numpy_on_fetched_logprobs(backend, method) -> None:
    question = "Q: Where is the Eiffel Tower?\nA: It is in"

    @sgl.function
    def where(s):
        s += question
        s += sgl.select("place", [" Paris, France", " the city of London", " Berlin"],
                        choices_method=method)

    s = where.run(backend=backend)
    meta = s.get_meta_info("place")
    cond = [[lp for lp, _, _ in e] for e in meta["choice_token_logprobs"]]
    prior = meta["unconditional_token_logprobs"] or [[None] * len(c) for c in cond]
    assert [len(c) for c in cond] == [3, 4, 1]  # each choice's own tokens
    assert s["place"] == [" Paris, France", " the city of London", " Berlin"][
        reference(method, cond, prior)]
    if method is not greedy_token_selection:
        assert s["place"] == " Paris, France"  # where the model is confident
    # A choice's logprobs are the prompt logprobs of the whole text scored from its
    # first token (no cache involved).
    full = backend.generate({"text": question + " Paris, France", "return_logprob": True,
                             "sampling_params": {"max_new_tokens": 0},
                             "logprob_start_len": 0})
    tail = [lp for lp, _, _ in full["meta_info"]["input_token_logprobs"][-len(cond[0]):]]
    np.testing.assert_allclose(tail, cond[0], atol=2e-3)
