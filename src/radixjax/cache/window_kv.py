"""WindowKV: the sliding-window layers' own, smaller KV pool (SGLang's hybrid SWA cache).

A model with sliding-window layers (Gemma 2 / 3: most layers attend to the last W
positions only) keeps two pools on the device: the full-attention layers' pool, named by
the slots the allocator and the radix tree hand out ("full slots"), and the window
layers' pool, whose pages are lent to full pages only while someone needs their keys:

    full page f  --page_map[f]-->  window page w (0: none: its window KV is gone)
    window slot of full slot s  =  page_map[s // P] * P + s % P

Who holds a window page (host bookkeeping only; the device keeps its own copy of the map,
written by each step for its new tokens, model_runner.py):
- a running request's private pages (past its cached prefix): from the step that
  computes them until they fall behind its window, then freed at once;
- the radix tree's pages (cached prefixes): kept while any page of the tree may be
  reused; `pins` counts the running requests whose window covers a tree page; unpinned
  tree pages give their window KV up when the window pool runs short (`reclaim`, least
  recently used first), leaving the full KV cached;
- a full page freed (evicted, a duplicate, a retracted request's) frees its window page.

A cached prefix is usable only as far as its window KV reaches (`usable_prefix`): a
request continuing after position m needs the window layers' keys of m - W .. m - 1.

Sizing: `min_window_slots` is what running requests can hold at once (W plus two pages
each, and a step's new tokens); with that many window slots a step's allocation never
fails after `reclaim`, so admission needs no second check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from radixjax.cache.allocator import KVSlotAllocator
from radixjax.cache.errors import OutOfKVSlots, require
from radixjax.cache.tree_node import TreeNode


def min_window_slots(window: int, page_size: int, max_running: int,
                     max_batch_tokens: int) -> int:
    """Window slots (a multiple of the page size, the dummy page included) that running
    requests and one step's new tokens can never exceed."""
    pages = max_running * (-(-window // page_size) + 2) + -(-max_batch_tokens // page_size) + 2
    return pages * page_size


@dataclass
class WindowClaim:
    """What one running request holds of the window pool: positions below `start` are
    given up (tree pages unpinned, private pages freed); the tree's pages of positions
    start .. pinned_end - 1 are pinned (its cached prefix inside its window)."""

    start: int = 0
    pinned_end: int = 0


class WindowKV:
    """The window pool's pages, lent to full pages (see the module docstring)."""

    def __init__(self, window: int, num_full_slots: int, num_window_slots: int,
                 page_size: int = 1) -> None:
        self.window = window
        self.page_size = page_size
        self.allocator = KVSlotAllocator(num_window_slots, page_size)
        num_full_pages = num_full_slots // page_size
        self.page_map = np.zeros(num_full_pages, np.int64)  # [full pages] -> window page
        self.pins = np.zeros(num_full_pages, np.int32)  # [full pages] running requests
        self.num_reclaimed = 0  # tree pages whose window KV `reclaim` gave up (stats)

    @property
    def num_window_slots(self) -> int:
        return self.allocator.num_slots

    def num_used_slots(self) -> int:
        return self.allocator.num_usable_slots - self.allocator.num_free_slots

    # -- slots -----------------------------------------------------------------------------

    def window_slots(self, full_slots: np.ndarray) -> np.ndarray:
        """[n] full slots -> [n] window slots (the dummy slot 0 where a page has none)."""
        full_slots = np.asarray(full_slots, np.int64)
        p = self.page_size
        pages = self.page_map[full_slots // p]
        return np.where(pages > 0, pages * p + full_slots % p, 0)

    def has_window(self, full_slots: np.ndarray) -> np.ndarray:
        """[n] bool: the slot's page has window KV."""
        return self.page_map[np.asarray(full_slots, np.int64) // self.page_size] > 0

    def assign(self, full_slots: np.ndarray, tree_pages: Iterable[TreeNode] = ()) -> None:
        """Window pages for the full pages of `full_slots` that have none (a step's new
        tokens), reclaiming unpinned tree pages first if the free list is short."""
        pages = _pages(full_slots, self.page_size)
        pages = pages[self.page_map[pages] == 0]
        if pages.size == 0:
            return
        short = pages.size - self.allocator.num_free_pages
        if short > 0:
            self.reclaim(short, tree_pages)
        new = self.allocator.alloc(pages.size * self.page_size)[:: self.page_size]
        self.page_map[pages] = new // self.page_size

    def release(self, full_pages: np.ndarray) -> None:
        """The full pages no longer keep window KV (freed, or behind their request's
        window): their window pages go back to the free list."""
        full_pages = np.asarray(full_pages, np.int64)
        window = self.page_map[full_pages]
        held = window > 0
        if held.any():
            self.allocator.free(self.allocator.pages_to_slots(window[held]))
            self.page_map[full_pages[held]] = 0

    def on_full_free(self, full_slots: np.ndarray) -> None:
        """The full allocator's free hook: a freed full page keeps no window page."""
        pages = _pages(full_slots, self.page_size)
        require(not self.pins[pages].any(), "a pinned full page was freed")
        self.release(pages)

    def reclaim(self, num_pages: int, nodes: Iterable[TreeNode]) -> None:
        """Free at least `num_pages` window pages from unpinned tree pages, least recently
        used nodes first (their full KV stays cached). Raises OutOfKVSlots if the tree
        cannot give that many (the pool is smaller than `min_window_slots`)."""
        want = num_pages
        for node in sorted(nodes, key=lambda n: n.last_access):
            pages = _pages(node.value, self.page_size)
            pages = pages[(self.page_map[pages] > 0) & (self.pins[pages] == 0)]
            self.release(pages)
            self.num_reclaimed += pages.size
            want -= pages.size
            if want <= 0:
                return
        raise OutOfKVSlots(num_pages * self.page_size,
                           (num_pages - max(want, 0)) * self.page_size)

    # -- a request's window ----------------------------------------------------------------

    def usable_prefix(self, full_slots: np.ndarray) -> int:
        """A cached prefix's slots -> how many of its tokens (whole pages) a request can
        continue after: the window KV of the W positions before that point is all there."""
        p = self.page_size
        ok = self.has_window(np.asarray(full_slots, np.int64)[::p])  # [pages], in order
        need = -(-self.window // p)  # pages before the end whose window KV is read
        end = ok.size
        while end > 0:
            lo = max(0, end - need)
            missing = np.flatnonzero(~ok[lo:end])
            if missing.size == 0:
                break
            end = lo + int(missing[-1])
        return end * p

    def window_start(self, num_computed: int) -> int:
        """The first position (page-aligned) whose window KV a request that computed
        `num_computed` positions still reads."""
        start = max(0, num_computed - self.window)
        return start - start % self.page_size

    def page_ids(self, full_slots: np.ndarray) -> np.ndarray:
        """Slots -> their distinct full pages."""
        return _pages(full_slots, self.page_size)

    def pin(self, full_slots: np.ndarray) -> None:
        self.pins[_pages(full_slots, self.page_size)] += 1

    def unpin(self, full_slots: np.ndarray) -> None:
        pages = _pages(full_slots, self.page_size)
        require(bool((self.pins[pages] > 0).all()), "unpin of a page not pinned")
        self.pins[pages] -= 1

    def reset(self) -> None:
        self.allocator.reset()
        self.page_map[:] = 0
        self.pins[:] = 0

    def check_integrity(self, full: KVSlotAllocator) -> None:
        """Every lent window page belongs to one full page in use; lent + free = usable."""
        self.allocator.check_integrity()
        lent = np.flatnonzero(self.page_map)
        window = self.page_map[lent]
        require(np.unique(window).size == window.size, "a window page lent twice")
        require(not self.allocator.is_free(window * self.page_size).any(),
                "a lent window page is free")
        require(not full.is_free(lent * self.page_size).any(),
                "a free full page holds a window page")
        require(window.size * self.page_size + self.allocator.num_free_slots
                == self.allocator.num_usable_slots, "window pages: lent + free != usable")
        require(bool((self.pins >= 0).all()), "a negative pin count")


def _pages(full_slots: np.ndarray, page_size: int) -> np.ndarray:
    """Slots -> their distinct pages."""
    slots = np.asarray(full_slots, np.int64)
    return np.unique(slots // page_size) if page_size > 1 else slots
