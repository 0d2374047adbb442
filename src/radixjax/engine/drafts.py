"""Draft tokens for speculative decoding without a draft model (issue 43, first part: the
proposer; the verify step that consumes them is not built yet, see docs/speculative.md).

Two sources, tried in this order for a request whose tokens so far are `seq`:

    the radix tree   a cached continuation of the *whole* of seq (RadixCache.continuation):
                     a regenerated answer, the usual reply to a shared prompt, the next
                     turn of a cached chat; what no peer drafts from
    seq itself       the tokens that followed the most recent earlier occurrence of seq's
                     last n tokens (n from max_ngram down to min_ngram): an answer quoting
                     its prompt's document, code rewriting a given function, JSON copying
                     field values ("prompt lookup decoding")

NgramIndex keeps the second source O(1) per token: for each n, the position after the
latest occurrence of every n-gram, updated as tokens are appended. Host side only (numpy
and dicts), like the rest of the scheduler's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from radixjax.cache.radix_cache import RadixCache


class NgramIndex:
    """The n-grams of one request's tokens (prompt, then outputs as they come)."""

    def __init__(self, tokens: Sequence[int] = (), max_ngram: int = 4,
                 min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, "
                             f"{max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self._after: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram + 1)]
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self._append(int(t))

    def _append(self, token: int) -> None:
        # the n-grams that end just before the new token now have a known follower; the
        # n-grams ending at the new token are indexed only when a token follows them, so
        # a lookup of the current suffix finds an *earlier* occurrence
        seq = self.tokens
        end = len(seq)
        for n in range(self.min_ngram, self.max_ngram + 1):
            if end >= n:
                self._after[n][tuple(seq[end - n:end])] = end
        seq.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest
        suffix of the tokens (max_ngram down to min_ngram) seen before; [] if none."""
        seq = self.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(seq) < n:
                continue
            start = self._after[n].get(tuple(seq[-n:]))
            if start is not None:
                return seq[start:start + k]
        return []


def propose_draft(index: NgramIndex, k: int, tree: RadixCache | None = None,
                  namespace: Hashable | None = None) -> tuple[list[int], str]:
    """Up to k draft tokens for the request `index` follows, and their source ("tree",
    "self" or "" for none)."""
    if k <= 0:
        return [], ""
    if tree is not None:
        cached = tree.continuation(np.asarray(index.tokens, np.int32), k, namespace)
        if cached.size:
            return [int(t) for t in cached], "tree"
    own = index.propose(k)
    return (own, "self") if own else ([], "")
