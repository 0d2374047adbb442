"""Draft proposals for speculative decoding (host side): a request's own n-grams, and
cached continuations of its whole context in the radix tree (read only)."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.cache import KVSlotAllocator, RadixCache
from radixjax.engine.drafts import NgramIndex, propose_draft


def tree_with(sequences: list[list[int]], page_size: int = 1) -> RadixCache:
    allocator = KVSlotAllocator(1024, page_size)
    tree = RadixCache(allocator)
    for seq in sequences:
        n = len(seq) - len(seq) % page_size
        tree.insert(seq[:n], allocator.alloc(n))
    return tree


def test_a_repeated_span_is_proposed_from_the_request_itself() -> None:
    doc = [10, 11, 12, 13, 14, 15, 16]
    index = NgramIndex([1, *doc, 2, 3, 10, 11], max_ngram=3, min_ngram=2)
    assert index.propose(4) == [12, 13, 14, 15]  # "10 11" was followed by 12 ...
    index.extend([12])
    assert index.propose(2) == [13, 14]  # the longest suffix "10 11 12" decides
    assert index.propose(100) == [13, 14, 15, 16, 2, 3, 10, 11, 12]  # up to the end


def test_the_latest_occurrence_wins_and_the_suffix_itself_never_matches() -> None:
    index = NgramIndex([5, 6, 7, 5, 6, 8, 5, 6], max_ngram=2, min_ngram=2)
    assert index.propose(1) == [8]  # "5 6" was last followed by 8
    assert NgramIndex([1, 2, 3, 4], max_ngram=2).propose(3) == []  # nothing repeats
    with pytest.raises(ValueError):
        NgramIndex(max_ngram=1, min_ngram=2)


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_cached_reply_to_the_whole_context_is_drafted(page_size: int) -> None:
    prompt, reply = [1, 2, 3, 4, 5, 6], [20, 21, 22, 23, 24, 25]
    tree = tree_with([prompt + reply, [1, 2, 3, 9, 9, 9]], page_size)
    assert list(tree.continuation(prompt, 4)) == [20, 21, 22, 23]
    assert list(tree.continuation(prompt + [20, 21, 22], 10)) == [23, 24, 25]
    assert list(tree.continuation([1, 2, 7], 4)) == []  # not all of it cached
    assert list(tree.continuation([1, 2, 3], 2)) in ([4, 5], [9, 9])
    before = [(n.node_id, n.key.size, n.last_access) for n in tree.iter_nodes()]
    tree.continuation(prompt + [20], 3)  # read only: nothing split or touched
    assert [(n.node_id, n.key.size, n.last_access) for n in tree.iter_nodes()] == before
    tree.check_integrity()


def test_the_most_recently_used_branch_is_followed() -> None:
    tree = tree_with([[1, 2, 3, 30, 31], [1, 2, 3, 40, 41]])
    assert list(tree.continuation([1, 2, 3], 2)) == [40, 41]
    tree.match_prefix([1, 2, 3, 30, 31])  # used again: now the most recent
    assert list(tree.continuation([1, 2, 3], 2)) == [30, 31]


def test_the_tree_comes_first_then_the_request_itself() -> None:
    tree = tree_with([[7, 8, 9, 7, 8, 50, 51]])
    index = NgramIndex([7, 8, 9, 7, 8], max_ngram=2)
    assert propose_draft(index, 2, tree) == ([50, 51], "tree")
    assert propose_draft(index, 2, None) == ([9, 7], "self")
    assert propose_draft(NgramIndex([1, 2]), 2, tree) == ([], "")
    assert propose_draft(index, 0, tree) == ([], "")
    assert np.asarray(index.tokens).tolist() == [7, 8, 9, 7, 8]
