"""Unit tests of RadixCache: split, duplicate-free insert, eviction order, locks, pages,
namespaces, integrity checking."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.cache import (
    CacheIntegrityError,
    KVSlotAllocator,
    LockError,
    RadixCache,
)


def make_cache(num_slots: int = 256, page_size: int = 1) -> RadixCache:
    return RadixCache(KVSlotAllocator(num_slots, page_size))


def cache_tokens(cache: RadixCache, tokens: list[int], namespace=None) -> np.ndarray:
    """Allocate slots for `tokens` and insert them as one finished request would."""
    slots = cache.allocator.alloc(len(tokens))
    result = cache.insert(tokens, slots, namespace)
    assert result.num_existing == 0 and result.num_inserted == len(tokens)
    return slots


def cache_branch(cache: RadixCache, tokens: list[int]) -> None:
    """Cache `tokens` reusing whatever prefix is cached, as the engine does."""
    match = cache.match_prefix(tokens)
    new = cache.allocator.alloc(len(tokens) - match.num_tokens)
    result = cache.insert(tokens, np.concatenate([match.slots, new]))
    assert result.num_duplicates_freed == 0


def assert_accounting(cache: RadixCache, num_held: int = 0) -> None:
    cache.check_integrity()
    cache.allocator.check_integrity()
    counted = (
        cache.allocator.num_free_slots + cache.evictable_size() + cache.protected_size() + num_held
    )
    assert counted == cache.allocator.num_usable_slots


def sorted_keys(cache: RadixCache) -> list[list[int]]:
    return sorted(node.key.tolist() for node in cache.iter_nodes())


def test_empty_cache_matches_nothing() -> None:
    cache = make_cache()
    match = cache.match_prefix([1, 2, 3])
    assert match.num_tokens == 0 and match.slots.dtype == np.int64
    assert match.last_node.is_root
    assert cache.total_size() == 0
    assert_accounting(cache)


def test_match_full_and_partial_prefix() -> None:
    cache = make_cache()
    slots = cache_tokens(cache, [5, 6, 7, 8])
    assert cache.match_prefix([5, 6, 7, 8, 9]).slots.tolist() == slots.tolist()
    assert cache.match_prefix([5, 6, 7, 8]).slots.tolist() == slots.tolist()
    assert cache.match_prefix([6, 7]).num_tokens == 0
    assert_accounting(cache)


def test_match_ending_inside_a_node_splits_it() -> None:
    cache = make_cache()
    slots = cache_tokens(cache, list(range(10, 20)))
    match = cache.match_prefix([10, 11, 12, 13, 99])
    assert match.slots.tolist() == slots[:4].tolist()
    assert match.last_node.key.tolist() == [10, 11, 12, 13]
    (lower,) = match.last_node.children.values()
    assert lower.key.tolist() == list(range(14, 20))
    assert lower.value.tolist() == slots[4:].tolist()
    assert lower.parent is match.last_node and match.last_node.parent.is_root
    assert sorted_keys(cache) == [[10, 11, 12, 13], list(range(14, 20))]
    assert cache.total_size() == 10
    assert_accounting(cache)


@pytest.mark.parametrize("page_size", [1, 2])
def test_match_len_is_match_prefix_length_without_touching_the_tree(page_size) -> None:
    cache = make_cache(page_size=page_size)
    cache_tokens(cache, list(range(10, 20)))
    cache_branch(cache, list(range(10, 14)) + [50, 51, 52, 53])
    before = (sorted_keys(cache), [n.last_access for n in cache.iter_nodes()])
    queries = [[10, 11, 12], list(range(10, 20)) + [7], [10, 11, 12, 13, 50, 51, 9], [99],
               [10, 11, 12, 13, 60]]
    lens = [cache.match_len(q) for q in queries]
    assert (sorted_keys(cache), [n.last_access for n in cache.iter_nodes()]) == before
    assert lens == [cache.match_prefix(q).num_tokens for q in queries]
    assert cache.match_len([10, 11, 12], namespace="other") == 0
    assert_accounting(cache)


def test_split_keeps_a_lock_holder_valid() -> None:
    cache = make_cache()
    cache_tokens(cache, list(range(10)))
    holder = cache.match_prefix(list(range(10))).last_node
    cache.inc_lock_ref(holder)
    assert cache.protected_size() == 10
    upper = cache.match_prefix([0, 1, 2, 3]).last_node  # splits the locked node
    assert upper.lock_ref == 1 and holder.parent is upper
    assert cache.protected_size() == 10 and cache.evictable_size() == 0
    assert_accounting(cache)
    cache.dec_lock_ref(holder)
    assert upper.lock_ref == 0 and holder.lock_ref == 0
    assert cache.evictable_size() == 10
    assert_accounting(cache)


def test_insert_diverging_inside_a_node_adds_a_sibling() -> None:
    cache = make_cache()
    first = cache_tokens(cache, [1, 2, 3, 4, 5])
    second = cache.allocator.alloc(6)
    result = cache.insert([1, 2, 3, 9, 9, 9], second)
    assert (result.num_existing, result.num_inserted, result.num_duplicates_freed) == (3, 3, 3)
    assert sorted_keys(cache) == [[1, 2, 3], [4, 5], [9, 9, 9]]
    assert result.last_node.key.tolist() == [9, 9, 9]
    assert result.last_node.value.tolist() == second[3:].tolist()
    # The shared prefix keeps the first request's slots; the second's copies were freed.
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == first[:3].tolist()
    assert cache.allocator.is_free(second[:3]).all()
    assert_accounting(cache)


def test_duplicate_insert_frees_only_the_duplicates() -> None:
    cache = make_cache()
    first = cache_tokens(cache, [1, 2, 3, 4])
    duplicate = cache.allocator.alloc(4)
    result = cache.insert([1, 2, 3, 4], duplicate)
    assert (result.num_existing, result.num_inserted, result.num_duplicates_freed) == (4, 0, 4)
    assert cache.allocator.is_free(duplicate).all()
    assert not cache.allocator.is_free(first).any()
    assert cache.total_size() == 4
    assert_accounting(cache)


def test_insert_with_the_matched_prefix_frees_nothing() -> None:
    cache = make_cache()
    first = cache_tokens(cache, [1, 2, 3])
    match = cache.match_prefix([1, 2, 3, 4, 5])
    new = cache.allocator.alloc(2)
    result = cache.insert([1, 2, 3, 4, 5], np.concatenate([match.slots, new]))
    assert (result.num_existing, result.num_inserted, result.num_duplicates_freed) == (3, 2, 0)
    assert not cache.allocator.is_free(np.concatenate([first, new])).any()
    assert_accounting(cache)


def test_tree_does_not_alias_caller_arrays() -> None:
    cache = make_cache()
    tokens = np.array([1, 2, 3], dtype=np.int32)
    slots = cache.allocator.alloc(3)
    cache.insert(tokens, slots)
    tokens[:] = 7
    slots[:] = 0
    match = cache.match_prefix([1, 2, 3])
    assert match.num_tokens == 3 and 0 not in match.slots.tolist()
    match.slots[:] = 0
    assert 0 not in cache.match_prefix([1, 2, 3]).slots.tolist()
    assert_accounting(cache)


def test_eviction_is_leaf_first_lru_and_shared_prefixes_survive() -> None:
    cache = make_cache()
    prefix = [1, 2, 3, 4]
    cache_tokens(cache, prefix)
    branches = {b: prefix + [b, b] for b in (10, 20, 30)}
    for tokens in branches.values():
        cache_branch(cache, tokens)
    cache.match_prefix(branches[10])  # touch order now: 20, 30, 10 (oldest first)
    assert cache.evict(2) == 2
    assert sorted_keys(cache) == [prefix, [10, 10], [30, 30]]
    assert cache.evict(2) == 2
    assert sorted_keys(cache) == [prefix, [10, 10]]
    # The prefix was touched with every branch, but only goes once it is a leaf.
    assert cache.evict(2) == 2
    assert sorted_keys(cache) == [prefix]
    assert cache.evict(4) == 4
    assert cache.total_size() == 0 and cache.namespaces() == [None]
    assert_accounting(cache)


def test_evict_trims_the_last_leaf_instead_of_dropping_it() -> None:
    cache = make_cache()
    old = cache_tokens(cache, [1] * 5)
    cache_tokens(cache, [2] * 7)
    assert cache.evict(0) == 0
    assert cache.evict(3) == 3  # the older leaf loses its last 3 tokens
    assert cache.match_prefix([1] * 5).slots.tolist() == old[:2].tolist()
    assert cache.allocator.is_free(old[2:]).all()
    assert_accounting(cache)
    assert cache.evict(4) == 4  # the match made [1, 1] recent: [2]*7 loses its tail now
    assert cache.match_prefix([2] * 7).num_tokens == 3
    assert cache.evict(100) == 5  # then only what is left
    assert cache.allocator.num_free_slots == cache.allocator.num_usable_slots
    assert_accounting(cache)


def test_evict_spans_several_leaves_in_lru_order() -> None:
    cache = make_cache()
    a = cache_tokens(cache, [1] * 3)
    b = cache_tokens(cache, [2] * 3)
    c = cache_tokens(cache, [3] * 3)
    assert cache.evict(4) == 4  # all of a, the tail token of b
    assert cache.allocator.is_free(np.concatenate([a, b[2:]])).all()
    assert cache.match_prefix([2] * 3).num_tokens == 2
    assert cache.match_prefix([3] * 3).slots.tolist() == c.tolist()
    assert_accounting(cache)


def test_pages_evict_whole_pages_only() -> None:
    cache = make_cache(num_slots=16 * 8, page_size=16)
    slots = cache_tokens(cache, list(range(48)))
    assert cache.evict(1) == 16
    assert cache.match_prefix(list(range(48))).slots.tolist() == slots[:32].tolist()
    assert cache.evict(17) == 32
    assert cache.total_size() == 0
    assert_accounting(cache)


def test_locked_nodes_are_never_evicted() -> None:
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4, 5, 6])
    cache_tokens(cache, [7, 8])
    locked = cache.match_prefix([1, 2, 3]).last_node  # splits: [1,2,3] locked, [4,5,6] not
    cache.inc_lock_ref(locked)
    cache.inc_lock_ref(locked)  # two holders
    assert cache.protected_size() == 3 and cache.evictable_size() == 5
    assert cache.evict(100) == 5
    assert sorted_keys(cache) == [[1, 2, 3]]
    assert_accounting(cache)
    cache.dec_lock_ref(locked)
    assert cache.evict(100) == 0  # one holder left
    cache.dec_lock_ref(locked)
    assert cache.evictable_size() == 3
    assert cache.evict(3) == 3  # became a leaf candidate when its lock dropped
    assert_accounting(cache)


def test_unbalanced_unlock_raises() -> None:
    cache = make_cache()
    cache_tokens(cache, [1, 2])
    node = cache.match_prefix([1, 2]).last_node
    with pytest.raises(LockError):
        cache.dec_lock_ref(node)
    cache.dec_lock_ref(cache.match_prefix([9]).last_node)  # a root: no-op, never raises
    assert_accounting(cache)


def test_heap_stays_bounded_under_repeated_locking() -> None:
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    for _ in range(1000):
        cache.inc_lock_ref(node)
        cache.dec_lock_ref(node)
        cache.match_prefix([1, 2, 3])
    assert len(cache._heap) <= 1
    assert_accounting(cache)


def test_namespaces_never_share_kv() -> None:
    cache = make_cache()
    tokens = [1, 2, 3, 4]
    plain = cache_tokens(cache, tokens)
    adapter = cache_tokens(cache, tokens, namespace="lora-7")
    assert set(plain.tolist()).isdisjoint(adapter.tolist())
    assert cache.match_prefix(tokens).slots.tolist() == plain.tolist()
    assert cache.match_prefix(tokens, "lora-7").slots.tolist() == adapter.tolist()
    assert cache.match_prefix(tokens, ("salt", 3)).num_tokens == 0
    assert cache.namespaces() == [None, "lora-7"]
    assert_accounting(cache)
    # Evicting a namespace's last node prunes its root.
    cache.match_prefix(tokens)  # touch the default namespace: the adapter's is older
    assert cache.evict(4) == 4
    assert cache.namespaces() == [None]
    assert cache.match_prefix(tokens).num_tokens == 4
    assert_accounting(cache)


@pytest.mark.parametrize("num_tokens", [15, 16, 17, 40])
def test_pages_only_whole_pages_are_cached(num_tokens: int) -> None:
    cache = make_cache(num_slots=16 * 8, page_size=16)
    tokens = list(range(num_tokens))
    slots = cache.allocator.alloc(-(-num_tokens // 16) * 16)
    result = cache.insert(tokens, slots[:num_tokens])
    aligned = num_tokens // 16 * 16
    assert result.num_inserted == aligned
    assert cache.total_size() == aligned
    assert cache.match_prefix(tokens).slots.tolist() == slots[:aligned].tolist()
    cache.allocator.free(slots[aligned:])  # the tail stays with the caller
    assert_accounting(cache)


def test_pages_mismatch_mid_page_splits_on_the_page_boundary() -> None:
    cache = make_cache(num_slots=16 * 8, page_size=16)
    tokens = list(range(48))
    slots = cache_tokens(cache, tokens)
    query = tokens[:20] + [999] * 28  # diverges 4 tokens into the second page
    match = cache.match_prefix(query)
    assert match.num_tokens == 16 and match.slots.tolist() == slots[:16].tolist()
    assert sorted(len(k) for k in sorted_keys(cache)) == [16, 32]
    assert cache.match_prefix(tokens[:15]).num_tokens == 0  # a partial page never matches
    # A different first page is a different child even if 15 of 16 tokens agree.
    other = tokens[:15] + [999] + tokens[16:]
    new = cache.allocator.alloc(48)
    result = cache.insert(other, new)
    assert (result.num_existing, result.num_inserted) == (0, 48)
    assert len(cache.root().children) == 2
    assert_accounting(cache)


def test_reset_frees_everything_and_refuses_while_locked() -> None:
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3])
    cache_tokens(cache, [4, 5], namespace="x")
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    with pytest.raises(LockError):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert cache.total_size() == 0 and cache.namespaces() == [None]
    assert cache.allocator.num_free_slots == cache.allocator.num_usable_slots
    assert cache.match_prefix([1, 2, 3]).num_tokens == 0
    assert_accounting(cache)


def test_input_validation() -> None:
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], np.array([5, 6]))
    with pytest.raises(ValueError):
        cache.match_prefix([[1, 2], [3, 4]])
    assert cache.insert([], np.zeros(0, dtype=np.int64)).num_inserted == 0


def _corrupt_sizes(cache: RadixCache) -> None:
    cache._evictable_size += 1


def _corrupt_parent(cache: RadixCache) -> None:
    leaf = next(n for n in cache.iter_nodes() if n.is_leaf and not n.parent.is_root)
    leaf.parent = cache.root()


def _corrupt_lock(cache: RadixCache) -> None:
    leaf = next(n for n in cache.iter_nodes() if n.is_leaf)
    leaf.lock_ref = 1  # a lock without its path, and not moved to protected


def _corrupt_child_key(cache: RadixCache) -> None:
    root = cache.root()
    key, child = next(iter(root.children.items()))
    del root.children[key]
    root.children[12345] = child


def _corrupt_empty_key(cache: RadixCache) -> None:
    leaf = next(n for n in cache.iter_nodes() if n.is_leaf)
    cache._evictable_size -= leaf.key.size
    leaf.key = leaf.key[:0]
    leaf.value = leaf.value[:0]


def _corrupt_freed_slot(cache: RadixCache) -> None:
    leaf = next(n for n in cache.iter_nodes() if n.is_leaf)
    cache.allocator.free(leaf.value)


def _corrupt_shared_slot(cache: RadixCache) -> None:
    leaves = [n for n in cache.iter_nodes() if n.is_leaf]
    leaves[0].value = leaves[1].value[: leaves[0].value.size].copy()


def _corrupt_heap(cache: RadixCache) -> None:
    cache._heap.clear()


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_sizes,
        _corrupt_parent,
        _corrupt_lock,
        _corrupt_child_key,
        _corrupt_empty_key,
        _corrupt_freed_slot,
        _corrupt_shared_slot,
        _corrupt_heap,
    ],
)
def test_check_integrity_catches_corruption(corrupt) -> None:
    cache = make_cache()
    cache_tokens(cache, [1, 2, 3, 4])
    cache_branch(cache, [1, 2, 7, 8])
    cache_tokens(cache, [9, 9])
    cache.check_integrity()
    corrupt(cache)
    with pytest.raises(CacheIntegrityError):
        cache.check_integrity()


def test_check_integrity_catches_unaligned_page_node() -> None:
    cache = make_cache(num_slots=16 * 8, page_size=16)
    cache_tokens(cache, list(range(32)))
    cache.check_integrity()
    node = next(cache.iter_nodes())
    node.key, node.value = node.key[:24].copy(), node.value[:24].copy()
    cache._evictable_size -= 8
    with pytest.raises(CacheIntegrityError, match="page"):
        cache.check_integrity()
