"""Stateful property test: random request lifecycles against a page-level reference model.

The model is a dict ``(namespace, prefix tuple) -> KV slots of the prefix's last page``:
one entry per cached page (per token when P = 1; two pages that agree on all but their
last token are distinct entries), plus a last-touch tick per entry. Match, insert, lock
and free are predicted exactly; eviction is checked by its properties (only unlocked
entries go, what remains is prefix-closed, LRU among leaves, enough was freed) and then
adopted. After every step: the tree equals the model, lock counts equal the running
requests' prefixes, and every usable slot is in exactly one of free / tree / a request.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from radixjax.cache import InvalidFree, KVCacheManager, LockError, OutOfKVSlots, RadixCache
from tests.cache.profiles import cache_profile

Key = tuple[object, tuple[int, ...]]  # (namespace, tokens up to the end of a page)
Page = tuple[int, ...]  # the page's KV slots
NAMESPACES = [None, "lora-a"]
MAX_RUNNING = 4


def tree_snapshot(tree: RadixCache) -> tuple[dict[Key, Page], dict[Key, int]]:
    """(slots per cached page entry, lock_ref of the node holding it)."""
    page = tree.page_size
    slots: dict[Key, Page] = {}
    locks: dict[Key, int] = {}
    for namespace in tree.namespaces():
        root = tree.root(namespace)
        stack = [(child, ()) for child in root.children.values()]
        while stack:
            node, prefix = stack.pop()
            key, value = node.key.tolist(), node.value.tolist()
            for start in range(0, len(key), page):
                prefix = (*prefix, *key[start : start + page])
                slots[(namespace, prefix)] = tuple(value[start : start + page])
                locks[(namespace, prefix)] = node.lock_ref
            stack.extend((child, prefix) for child in node.children.values())
    return slots, locks


class Request:
    def __init__(self, tokens: list[int], namespace, slots: np.ndarray, match) -> None:
        self.tokens = tokens
        self.namespace = namespace
        self.slots = slots  # every slot it owns: locked prefix, then private (whole pages)
        self.num_cached = match.num_tokens
        self.last_node = match.last_node


class RadixMachine(RuleBasedStateMachine):
    page_size = 1
    num_slots = 1 + 40
    max_len = 32
    max_extension = 20
    stretch = 1  # each drawn extension token becomes this many tokens

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(self.num_slots, self.page_size)
        self.model: dict[Key, Page] = {}
        self.ticks: dict[Key, int] = {}
        self.clock = 0
        self.history: list[list[int]] = [[]]
        self.requests: list[Request] = []

    # -- model ----------------------------------------------------------------------------

    def make_tokens(self, base: int, cut: int, extension: list[int]) -> list[int]:
        """A prefix of an earlier sequence (often page aligned) plus fresh tokens.

        Counted from the newest sequence and from its end, because hypothesis favours
        small integers: the likely case is then "most of a recent sequence", a cache hit.
        """
        source = self.history[-1 - base % len(self.history)]
        keep = len(source) - cut // 2 % (len(source) + 1)
        if cut % 2:
            keep -= keep % self.page_size
        extension = [token for token in extension for _ in range(self.stretch)]
        tokens = (source[:keep] + extension)[: self.max_len]
        self.history.append(tokens)
        return tokens

    def page_keys(self, tokens: list[int], namespace, num_tokens: int) -> list[Key]:
        ends = range(self.page_size, num_tokens + 1, self.page_size)
        return [(namespace, tuple(tokens[:end])) for end in ends]

    def model_match(self, tokens: list[int], namespace) -> tuple[int, list[int]]:
        """(matched tokens, their slots) per the model."""
        slots: list[int] = []
        for key in self.page_keys(tokens, namespace, len(tokens)):
            if key not in self.model:
                break
            slots.extend(self.model[key])
        return len(slots), slots

    def touch(self, tokens: list[int], namespace, num_tokens: int) -> None:
        self.clock += 1
        for key in self.page_keys(tokens, namespace, num_tokens):
            self.ticks[key] = self.clock

    def model_locks(self) -> dict[Key, int]:
        locks: dict[Key, int] = {}
        for req in self.requests:
            for key in self.page_keys(req.tokens, req.namespace, req.num_cached):
                locks[key] = locks.get(key, 0) + 1
        return locks

    def adopt_eviction(self, num_requested: int, num_evictable_before: int) -> int:
        """Check what eviction removed from the model, then drop it; returns #evicted."""
        slots, _ = tree_snapshot(self.manager.tree)
        assert slots.keys() <= self.model.keys(), "eviction added entries"
        assert all(self.model[key] == slot for key, slot in slots.items())
        evicted = self.model.keys() - slots.keys()
        locks = self.model_locks()
        assert not evicted & locks.keys(), "a locked entry was evicted"
        page = self.page_size
        for namespace, prefix in slots:
            assert len(prefix) == page or (namespace, prefix[:-page]) in slots, "not prefix-closed"
        num_evicted = len(evicted) * page
        # Exactly the request rounded up to pages (the last leaf is trimmed, not dropped).
        assert num_evicted == min(num_requested + -num_requested % page, num_evictable_before)
        if evicted:
            parents = {(ns, prefix[:-page]) for ns, prefix in slots}
            leaves = [k for k in slots if k not in parents and k not in locks]
            newest_evicted = max(self.ticks[k] for k in evicted)
            assert all(self.ticks[k] >= newest_evicted for k in leaves), "not LRU"
        for key in evicted:
            del self.model[key]
            del self.ticks[key]
        return num_evicted

    def alloc(self, num_slots: int) -> np.ndarray | None:
        """manager.alloc, predicting failure and checking any eviction it does."""
        manager = self.manager
        num_free = manager.allocator.num_free_slots
        num_evictable = manager.tree.evictable_size()
        if num_slots > num_free + num_evictable:
            with pytest.raises(OutOfKVSlots):
                manager.alloc(num_slots)
            assert manager.allocator.num_free_slots == num_free, "failed alloc changed state"
            event("alloc: OutOfKVSlots")
            return None
        slots = manager.alloc(num_slots)
        assert slots.size == num_slots and not manager.allocator.is_free(slots).any()
        shortfall = max(0, num_slots - num_free)
        num_evicted = self.adopt_eviction(shortfall, num_evictable)
        if shortfall == 0:
            assert num_evicted == 0, "evicted although enough was free"
        else:
            event("alloc: evicted")
        return slots

    # -- rules ----------------------------------------------------------------------------

    @initialize(
        warm=st.lists(
            st.tuples(
                st.integers(0, 10**6),
                st.integers(0, 10**6),
                st.lists(st.integers(0, 2), min_size=4, max_size=40),
            ),
            max_size=6,
        )
    )
    def warm_up(self, warm) -> None:
        """Start from a full-ish cache, so that allocations have to evict."""
        for base, cut, extension in warm:
            self.start_request(base, cut, extension, None)
            if self.requests:
                self.finish_request(0)

    @precondition(lambda self: len(self.requests) < MAX_RUNNING)
    @rule(
        base=st.integers(0, 10**6),
        cut=st.integers(0, 10**6),
        extension=st.lists(st.integers(0, 2), max_size=40),
        namespace=st.sampled_from(NAMESPACES),
    )
    def start_request(self, base, cut, extension, namespace) -> None:
        tokens = self.make_tokens(base, cut, extension[: self.max_extension])
        num_expected, expected = self.model_match(tokens, namespace)
        match = self.manager.match_and_lock(tokens, namespace)
        assert match.slots.tolist() == expected
        event(f"start: matched={num_expected > 0}")
        self.touch(tokens, namespace, num_expected)
        need = self.manager.round_up(len(tokens) - match.num_tokens)
        req = Request(tokens, namespace, match.slots, match)
        self.requests.append(req)  # its lock counts during the alloc's eviction
        new = self.alloc(need)
        if new is None:
            self.requests.pop()
            self.manager.tree.dec_lock_ref(match.last_node)
            return
        req.slots = np.concatenate([match.slots, new])

    @precondition(lambda self: len(self.requests) <= MAX_RUNNING - 2)
    @rule(
        base=st.integers(0, 10**6),
        cut=st.integers(0, 10**6),
        extension=st.lists(st.integers(0, 2), min_size=1, max_size=12),
        namespace=st.sampled_from(NAMESPACES),
    )
    def start_twins(self, base, cut, extension, namespace) -> None:
        """Two requests with the same prompt: the later finisher's new slots are duplicates."""
        self.start_request(base, cut, extension, namespace)
        self.start_request(0, 0, [], namespace)  # newest history entry, kept whole

    @precondition(lambda self: self.requests)
    @rule(
        which=st.integers(0, MAX_RUNNING),
        new_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=20),
    )
    def decode(self, which, new_tokens) -> None:
        req = self.requests[which % len(self.requests)]
        tokens = (req.tokens + new_tokens)[: self.max_len + 20]
        if len(tokens) > req.slots.size:
            new = self.alloc(self.manager.round_up(len(tokens) - req.slots.size))
            if new is None:
                return
            req.slots = np.concatenate([req.slots, new])
        req.tokens = tokens
        self.history.append(tokens)

    @precondition(lambda self: self.requests)
    @rule(which=st.integers(0, MAX_RUNNING))
    def finish_request(self, which) -> None:
        req = self.requests.pop(which % len(self.requests))
        page = self.page_size
        aligned = len(req.tokens) - len(req.tokens) % page
        num_existing, _ = self.model_match(req.tokens, req.namespace)
        keys = self.page_keys(req.tokens, req.namespace, aligned)
        theirs = [tuple(req.slots[i * page : (i + 1) * page].tolist()) for i in range(len(keys))]
        duplicates = [
            slot
            for key, mine in zip(keys[: num_existing // page], theirs, strict=False)
            if self.model[key] != mine
            for slot in mine
        ]
        result = self.manager.cache_finished(req.tokens, req.slots, req.last_node, req.namespace)
        assert result.num_existing == num_existing
        assert result.num_inserted == aligned - num_existing
        assert result.num_duplicates_freed == len(duplicates)
        event(f"finish: duplicates={bool(duplicates)} existing={num_existing > 0}")
        for key, mine in zip(
            keys[num_existing // page :], theirs[num_existing // page :], strict=True
        ):
            self.model[key] = mine
        self.touch(req.tokens, req.namespace, aligned)
        freed = np.asarray(duplicates + req.slots[aligned:].tolist(), dtype=np.int64)
        assert self.manager.allocator.is_free(freed).all(), "duplicates or tail not freed"

    @precondition(lambda self: self.requests)
    @rule(which=st.integers(0, MAX_RUNNING))
    def retract_request(self, which) -> None:
        req = self.requests.pop(which % len(self.requests))
        self.manager.release(req.slots, req.last_node, req.num_cached)
        assert self.manager.allocator.is_free(req.slots[req.num_cached :]).all()

    @rule(
        tokens_from=st.integers(0, 10**6),
        cut=st.integers(0, 10**6),
        namespace=st.sampled_from(NAMESPACES),
    )
    def match_only(self, tokens_from, cut, namespace) -> None:
        tokens = self.make_tokens(tokens_from, cut, [])
        num_expected, expected = self.model_match(tokens, namespace)
        match = self.manager.tree.match_prefix(tokens, namespace)
        assert match.slots.tolist() == expected
        self.touch(tokens, namespace, num_expected)

    @rule(num=st.integers(0, 10**6))
    def evict(self, num) -> None:
        num %= self.num_slots // 4
        num_evictable = self.manager.tree.evictable_size()
        num_freed = self.manager.tree.evict(num)
        assert num_freed == self.adopt_eviction(num, num_evictable)

    @rule()
    def reset(self) -> None:
        if self.manager.tree.protected_size():
            with pytest.raises(LockError):
                self.manager.tree.reset()
            return
        cached = np.asarray([s for page in self.model.values() for s in page], dtype=np.int64)
        self.manager.tree.reset()
        assert self.manager.allocator.is_free(cached).all()
        self.model.clear()
        self.ticks.clear()

    @precondition(lambda self: self.manager.allocator.num_free_slots > 0)
    @rule()
    def double_free_is_rejected(self) -> None:
        free_slot = self.manager.allocator.free_slots()[: self.page_size]
        with pytest.raises(InvalidFree):
            self.manager.allocator.free(free_slot)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def integrity(self) -> None:
        self.manager.check_integrity()

    @invariant()
    def tree_equals_model(self) -> None:
        slots, locks = tree_snapshot(self.manager.tree)
        assert slots == self.model
        expected_locks = self.model_locks()
        assert {k: v for k, v in locks.items() if v} == expected_locks
        num_protected = len(expected_locks) * self.page_size
        assert self.manager.tree.protected_size() == num_protected
        num_cached = len(self.model) * self.page_size
        assert self.manager.tree.evictable_size() == num_cached - num_protected

    @invariant()
    def every_slot_in_exactly_one_place(self) -> None:
        allocator = self.manager.allocator
        private = [s for req in self.requests for s in req.slots[req.num_cached :].tolist()]
        free = allocator.free_slots().tolist()
        cached = [s for page in self.model.values() for s in page]
        places = free + cached + private
        assert sorted(places) == list(range(self.page_size, self.num_slots))
        assert self.manager.num_held == len(private)
        # The invariant, with request-held slots made explicit.
        assert (
            allocator.num_free_slots
            + self.manager.tree.evictable_size()
            + self.manager.tree.protected_size()
            + len(private)
            == allocator.num_usable_slots
        )


class PagedRadixMachine(RadixMachine):
    page_size = 16
    num_slots = 16 * (1 + 12)
    max_len = 96
    max_extension = 12
    stretch = 8  # half pages: divergences fall mid-page and on page boundaries

    @rule(
        base=st.integers(0, 10**6),
        cut=st.integers(0, 10**6),
        extension=st.lists(st.integers(0, 2), min_size=2, max_size=12),
        namespace=st.sampled_from(NAMESPACES),
    )
    def start_long_request(self, base, cut, extension, namespace) -> None:
        if len(self.requests) < MAX_RUNNING:
            self.start_request(base, cut, extension, namespace)


TestRadixCacheP1 = RadixMachine.TestCase
TestRadixCacheP1.settings = cache_profile()
TestRadixCacheP16 = PagedRadixMachine.TestCase
TestRadixCacheP16.settings = cache_profile()
