"""KVCacheManager: the allocator and the radix cache wired for the request lifecycle.

new request   m = match_and_lock(prompt)            m.slots: cached prefix, now locked
              new = alloc(round_up(len(prompt) - m.num_tokens))   evicts if free is short
              slots = concat(m.slots, new)  ->  req_to_token row
finished      cache_finished(all_tokens, slots, m.last_node)   insert, free dups + tail,
                                                                unlock
retracted     release(slots, m.last_node, m.num_tokens)        free private slots, unlock

With a window pool (cache/window_kv.py, sliding-window models) a request also holds a
WindowClaim: claim_window at admission, advance_window and assign_window before each of
its steps, given up by cache_finished / release.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from radixjax.cache.allocator import KVSlotAllocator
from radixjax.cache.errors import OutOfKVSlots, require
from radixjax.cache.radix_cache import RadixCache, TokenIds
from radixjax.cache.tree_node import InsertResult, MatchResult, TreeNode
from radixjax.cache.window_kv import WindowClaim, WindowKV


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

    def __init__(self, num_slots: int, page_size: int = 1,
                 window: WindowKV | None = None) -> None:
        """window: the sliding-window layers' own pool (None: every layer in one)."""
        self.allocator = KVSlotAllocator(num_slots, page_size)
        self.tree = RadixCache(self.allocator)
        self._num_held = 0
        self.window = window
        if window is not None:
            self.allocator.on_free = window.on_full_free

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
        """`match_prefix` and lock the match until `cache_finished` or `release`. With a
        window pool: only as far as its window KV lets a request continue."""
        match = self.tree.match_prefix(tokens, namespace)
        if self.window is not None:
            usable = self.window.usable_prefix(match.slots)
            if usable < match.num_tokens:
                match = self.tree.match_prefix(tokens[:usable], namespace)
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

    # -- a request's window (window pool only) -----------------------------------------------

    def claim_window(self, slots: np.ndarray, num_cached: int) -> WindowClaim | None:
        """An admitted request's claim: its cached prefix's pages inside its window pinned."""
        if self.window is None:
            return None
        start = self.window.window_start(num_cached)
        self.window.pin(slots[start:num_cached])
        return WindowClaim(start, num_cached)

    def advance_window(self, claim: WindowClaim | None, slots: np.ndarray,
                       num_computed: int) -> None:
        """Before a request's next step: positions that fell behind its window are given
        up (its tree pages unpinned, its private pages' window KV freed)."""
        if claim is None:
            return
        start = self.window.window_start(num_computed)
        if start <= claim.start:
            return
        self.window.unpin(slots[claim.start:min(start, claim.pinned_end)])
        self.window.release(self.window.page_ids(
            slots[max(claim.start, claim.pinned_end):start]))
        claim.start = start

    def assign_window(self, slots: np.ndarray) -> np.ndarray | None:
        """A step's new tokens' window slots (pages lent where they have none)."""
        if self.window is None:
            return None
        self.window.assign(slots, self.tree.iter_nodes())
        return self.window.window_slots(slots)

    def _drop_window(self, claim: WindowClaim | None, slots: np.ndarray) -> None:
        if claim is not None:
            self.window.unpin(slots[claim.start:claim.pinned_end])
            claim.pinned_end = claim.start

    def _shares_gone_window(self, tokens: np.ndarray, slots: np.ndarray,
                            claim: WindowClaim | None, namespace: Hashable | None) -> bool:
        """Whether caching these tokens now would swap slots of the request's window for
        the tree's copies whose window KV is gone (then it waits until it finishes)."""
        if claim is None:
            return False
        tree_slots = self.tree.match_prefix(tokens, namespace).slots[claim.start:]
        own = slots[claim.start:claim.start + tree_slots.size]
        swapped = tree_slots[tree_slots != own]
        return not self.window.has_window(swapped).all()

    # -- the request's end ---------------------------------------------------------------------

    def cache_finished(
        self,
        tokens: TokenIds,
        slots: np.ndarray,
        last_node: TreeNode,
        namespace: Hashable | None = None,
        claim: WindowClaim | None = None,
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
        self._drop_window(claim, slots)
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
        claim: WindowClaim | None = None,
    ) -> tuple[np.ndarray, TreeNode, int]:
        """Cache a running request's computed tokens so others can share them now.

        Returns (slots, last_node, num_cached) to continue with: the tree's slots for the
        cached (page-aligned) prefix — where the tree already held other slots for the
        same tokens, the request's duplicates are freed and the tree's are used — then
        the request's private rest. The new last node is locked, the old one unlocked.
        With a window pool, nothing is cached where that would swap the request's window
        KV for the tree's copies without it (returned as they were); the tree's pages now
        inside the request's window are pinned.
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int64)
        if self._shares_gone_window(tokens, slots, claim, namespace):
            return slots, last_node, num_cached
        self.tree.insert(tokens, slots[: tokens.size], namespace)
        match = self.tree.match_prefix(tokens, namespace)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(last_node)
        new_cached = match.slots.size
        # Slots for [num_cached, new_cached) are now the tree's, or were freed as dups.
        self._num_held -= new_cached - num_cached
        if claim is not None:
            self.window.pin(match.slots[max(claim.start, claim.pinned_end):new_cached])
            claim.pinned_end = max(claim.pinned_end, new_cached)
        return np.concatenate([match.slots, slots[new_cached:]]), match.last_node, new_cached

    def release(self, slots: np.ndarray, last_node: TreeNode, num_cached: int,
                claim: WindowClaim | None = None) -> None:
        """Retract a request without caching it: free its private slots (everything after
        the `num_cached` locked prefix slots) and unlock its prefix."""
        slots = np.asarray(slots, dtype=np.int64)
        self._drop_window(claim, slots)
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
        if self.window is not None:
            self.window.check_integrity(self.allocator)
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
