"""KVCacheManager: the allocator and the radix cache wired for the request lifecycle.

new request   m = match_and_lock(prompt)            m.slots: cached prefix, now locked
              new = alloc(round_up(len(prompt) - m.num_tokens))   evicts if free is short
              slots = concat(m.slots, new)  ->  req_to_token row
finished      cache_finished(all_tokens, slots, m.last_node)   insert, free dups + tail,
                                                                unlock
retracted     release(slots, m.last_node, m.num_tokens)        free private slots, unlock
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from radixjax.cache.allocator import KVSlotAllocator
from radixjax.cache.errors import OutOfKVSlots, require
from radixjax.cache.radix_cache import RadixCache, TokenIds
from radixjax.cache.tree_node import InsertResult, MatchResult, TreeNode


class KVCacheManager:
    """Owns a `KVSlotAllocator` and the `RadixCache` that frees into it.

    Every slot is in exactly one place: free, in the tree (evictable or protected), or
    held privately by a running request (`num_held`: allocated here, not yet cached or
    released). Invariant, checked by `check_integrity`:
    ``num_free + evictable + protected + num_held == num_usable`` — with no request
    running, ``free + evictable + protected == total``.

    Use these methods for the request flow; calling `tree.insert` directly with private
    slots bypasses the `num_held` count.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        self.allocator = KVSlotAllocator(num_slots, page_size)
        self.tree = RadixCache(self.allocator)
        self._num_held = 0

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    @property
    def num_held(self) -> int:
        return self._num_held

    def available_size(self) -> int:
        """Slots an `alloc` could get now: free plus evictable."""
        return self.allocator.num_free_slots + self.tree.evictable_size()

    def round_up(self, num_tokens: int) -> int:
        """Slots to allocate for `num_tokens` new tokens: whole pages."""
        return -(-num_tokens // self.page_size) * self.page_size

    # -- request lifecycle ----------------------------------------------------------------

    def match_and_lock(self, tokens: TokenIds, namespace: Hashable | None = None) -> MatchResult:
        """`match_prefix` and lock the match until `cache_finished` or `release`."""
        match = self.tree.match_prefix(tokens, namespace)
        self.tree.inc_lock_ref(match.last_node)
        return match

    def alloc(self, num_slots: int) -> np.ndarray:
        """`num_slots` (a multiple of the page size) slots, evicting LRU cache if needed.

        Raises `OutOfKVSlots` without evicting anything when free + evictable is short.
        """
        available = self.available_size()
        if num_slots > available:
            raise OutOfKVSlots(num_slots, available)
        shortfall = num_slots - self.allocator.num_free_slots
        if shortfall > 0:
            self.tree.evict(shortfall)
        slots = self.allocator.alloc(num_slots)
        self._num_held += num_slots
        return slots

    def cache_finished(
        self,
        tokens: TokenIds,
        slots: np.ndarray,
        last_node: TreeNode,
        namespace: Hashable | None = None,
    ) -> InsertResult:
        """Finish a request: cache its KV, free what the tree does not keep, unlock.

        `slots` is every slot the request owns, its locked prefix first
        (``len(slots) >= len(tokens)``; a page-rounded allocation may run past the last
        token). Duplicates of slots the tree already holds and the unaligned tail are
        freed; `last_node` is the node `match_and_lock` returned.
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size < tokens.size:
            raise ValueError(f"{tokens.size} tokens but only {slots.size} slots")
        result = self.tree.insert(tokens, slots[: tokens.size], namespace)
        num_cached = result.num_existing + result.num_inserted
        self.allocator.free(slots[num_cached:])
        self.tree.dec_lock_ref(last_node)
        # Slots equal to the tree's were the locked prefix, never held by the request.
        num_shared = result.num_existing - result.num_duplicates_freed
        self._num_held -= slots.size - num_shared
        return result

    def cache_unfinished(
        self,
        tokens: TokenIds,
        slots: np.ndarray,
        last_node: TreeNode,
        num_cached: int,
        namespace: Hashable | None = None,
    ) -> tuple[np.ndarray, TreeNode, int]:
        """Cache a running request's computed tokens so others can share them now.

        Returns (slots, last_node, num_cached) to continue with: the tree's slots for the
        cached (page-aligned) prefix — where the tree already held other slots for the
        same tokens, the request's duplicates are freed and the tree's are used — then
        the request's private rest. The new last node is locked, the old one unlocked.
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int64)
        self.tree.insert(tokens, slots[: tokens.size], namespace)
        match = self.tree.match_prefix(tokens, namespace)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(last_node)
        new_cached = match.slots.size
        # Slots for [num_cached, new_cached) are now the tree's, or were freed as dups.
        self._num_held -= new_cached - num_cached
        return np.concatenate([match.slots, slots[new_cached:]]), match.last_node, new_cached

    def release(self, slots: np.ndarray, last_node: TreeNode, num_cached: int) -> None:
        """Retract a request without caching it: free its private slots (everything after
        the `num_cached` locked prefix slots) and unlock its prefix."""
        slots = np.asarray(slots, dtype=np.int64)
        self.allocator.free(slots[num_cached:])
        self.tree.dec_lock_ref(last_node)
        self._num_held -= slots.size - num_cached

    def give_back(self, slots: np.ndarray) -> None:
        """Free slots a running request held privately at the end of its list (a verify
        step's rejected drafts: whole pages, past anything the tree holds)."""
        self.allocator.free(np.asarray(slots, dtype=np.int64))
        self._num_held -= len(slots)

    def check_integrity(self) -> None:
        """Check the allocator, the tree, and that every usable slot is counted once."""
        self.allocator.check_integrity()
        self.tree.check_integrity()
        num_counted = (
            self.allocator.num_free_slots
            + self.tree.evictable_size()
            + self.tree.protected_size()
            + self._num_held
        )
        require(
            num_counted == self.allocator.num_usable_slots,
            f"free + evictable + protected + held = {num_counted} != "
            f"{self.allocator.num_usable_slots} usable slots",
        )
