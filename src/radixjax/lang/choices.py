"""How `select` picks among choices from their logprobs (SGLang's three methods).

Each method gets, per choice, the logprobs of the choice's own tokens given the program's
text before it (`conditional`, [num_choices] lists) and, for the unconditional method, the
same tokens scored with no text before them (`unconditional`, the first entry None:
nothing predicts a first token). Pure numpy; `select` (lang/interpreter.py) fetches the
logprobs through the backend's native API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Decision:
    index: int  # the chosen choice
    scores: list[float]  # what each choice scored (higher is better)
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoiceMethod:
    needs_unconditional = False

    def __call__(self, conditional: list[list[float]],
                 unconditional: list[list[float | None]] | None = None) -> Decision:
        raise NotImplementedError


class TokenLengthNormalized(ChoiceMethod):
    """The highest mean logprob per token."""

    def __call__(self, conditional, unconditional=None) -> Decision:
        scores = [float(np.mean(lps)) for lps in conditional]
        return Decision(int(np.argmax(scores)), scores)


class GreedyTokenSelection(ChoiceMethod):
    """Token by token: keep the choices whose logprob at this token is the highest, until
    one is left. A choice shorter than the longest is padded with its own mean logprob."""

    def __call__(self, conditional, unconditional=None) -> Decision:
        width = max(len(lps) for lps in conditional)
        table = np.array([list(lps) + [float(np.mean(lps))] * (width - len(lps))
                          for lps in conditional])  # [choices, width]
        alive = np.arange(len(conditional))
        for j in range(width):
            column = table[alive, j]
            alive = alive[column == column.max()]
            if alive.size == 1:
                break
        scores = [float(np.mean(lps)) for lps in conditional]
        return Decision(int(alive[0]), scores, {"greedy_logprob_matrix": table.tolist()})


class UnconditionalLikelihoodNormalized(ChoiceMethod):
    """The highest mean of (conditional - unconditional) logprob per token: how much the
    context raises each token over its prior (a missing first prior counts as 0)."""

    needs_unconditional = True

    def __call__(self, conditional, unconditional=None) -> Decision:
        if unconditional is None:
            raise ValueError("this method needs the unconditional logprobs")
        scores = []
        for cond, prior in zip(conditional, unconditional, strict=True):
            prior = [0.0 if p is None else p for p in prior]
            scores.append(float(np.mean(np.subtract(cond, prior))))
        return Decision(int(np.argmax(scores)), scores)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
