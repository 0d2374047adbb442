"""KV slot allocator: which rows of the device KV pool are free.

Slot ``s`` is row ``s`` of the device pool ``[num_slots, kv_heads, head_dim]``; with page size
``P > 1`` the pool is viewed as ``[num_slots // P, P, ...]`` and the allocator hands out
whole pages, still named by their slot indices::

    page p  ->  slots [p*P, p*P + 1, ..., p*P + P - 1]
    page 0  ->  reserved: slot 0 is the dummy that padded tokens write into

This allocator only knows *free* slots. Evicting from the radix cache when free runs short
is `KVCacheManager.alloc`'s job (the allocator would otherwise need a back-reference to
the tree that frees into it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from radixjax.cache.errors import InvalidFree, OutOfKVSlots, require

DUMMY_SLOT = 0  # padded tokens write their KV here; never handed out


class KVSlotAllocator:
    """Free list of KV pages (a page is one slot when ``page_size == 1``).

    Mutates: `alloc` pops pages off a preallocated numpy stack, `free` pushes them back;
    both are O(pages moved), no reallocation. A boolean mask per page catches double
    frees, frees of never-allocated pages and of the dummy page.

    Invariant: the first `num_free_pages` entries of the stack are distinct usable pages
    (1 <= page < num_pages) and are exactly the pages whose mask bit is set.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots % page_size != 0:
            raise ValueError(f"num_slots {num_slots} is not a multiple of page_size {page_size}")
        if num_slots // page_size < 2:
            raise ValueError("need at least one usable page besides the dummy page 0")
        self.page_size = page_size
        self.num_slots = num_slots  # including the dummy page
        self.num_pages = num_slots // page_size
        self._stack = np.empty(self.num_pages - 1, dtype=np.int64)
        self._is_free = np.zeros(self.num_pages, dtype=bool)
        # called with the slots of every successful free (cache/window_kv.py: a freed
        # page gives its window page back)
        self.on_free: Callable[[np.ndarray], None] | None = None
        self.reset()

    # -- sizes (in slots, so they add up with the radix cache's sizes) --------------------

    @property
    def num_usable_slots(self) -> int:
        """All slots that can ever be handed out: everything but the dummy page."""
        return (self.num_pages - 1) * self.page_size

    @property
    def num_free_slots(self) -> int:
        return self._num_free_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._num_free_pages

    # -- alloc / free ---------------------------------------------------------------------

    def can_alloc(self, num_slots: int) -> bool:
        return num_slots <= self.num_free_slots

    def alloc(self, num_slots: int) -> np.ndarray:
        """Take `num_slots` free slots (a multiple of `page_size`): shape [num_slots] int64.

        With P > 1 the result is a run of whole pages, each page's slots consecutive.
        Raises `OutOfKVSlots` (allocating nothing) if fewer slots are free.
        """
        if num_slots < 0 or num_slots % self.page_size != 0:
            raise ValueError(
                f"alloc size {num_slots} must be a non-negative multiple of page_size "
                f"{self.page_size}"
            )
        num_pages = num_slots // self.page_size
        if num_pages > self._num_free_pages:
            raise OutOfKVSlots(num_slots, self.num_free_slots)
        top = self._num_free_pages
        pages = self._stack[top - num_pages : top][::-1].copy()  # pop order: lowest first
        self._num_free_pages = top - num_pages
        self._is_free[pages] = False
        return self.pages_to_slots(pages)

    def free(self, slots: Sequence[int] | np.ndarray) -> None:
        """Return slots to the free list; with P > 1 the pages they lie in.

        `slots` must be a sequence of page runs, as `alloc` and the radix cache produce:
        whole pages ``[p*P .. p*P+P-1]``, only the last one possibly cut short (a request's
        partial tail page). Raises `InvalidFree`, freeing nothing, on a double free, a free
        of the dummy page or of a slot out of range, or slots that are not page runs.
        """
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        pages = self._slots_to_pages(slots)
        if pages.min() < 1 or pages.max() >= self.num_pages:
            raise InvalidFree(
                f"slots outside the usable range [{self.page_size}, {self.num_slots})"
            )
        if np.unique(pages).size != pages.size:
            raise InvalidFree("the same page appears twice in one free()")
        if self._is_free[pages].any():
            double = pages[self._is_free[pages]]
            raise InvalidFree(f"double free of page(s) {double[:8].tolist()}")
        top = self._num_free_pages
        self._stack[top : top + pages.size] = pages[::-1]  # so a re-alloc pops them in order
        self._num_free_pages = top + pages.size
        self._is_free[pages] = True
        if self.on_free is not None:
            self.on_free(slots)

    def reset(self) -> None:
        """Mark every usable page free (pages 1..num_pages-1; page 0 stays reserved)."""
        # Reversed so the first alloc pops page 1, 2, ...: deterministic, low slots first.
        self._stack[:] = np.arange(self.num_pages - 1, 0, -1)
        self._num_free_pages = self.num_pages - 1
        self._is_free[:] = True
        self._is_free[DUMMY_SLOT] = False

    # -- helpers --------------------------------------------------------------------------

    def pages_to_slots(self, pages: np.ndarray) -> np.ndarray:
        """[n] page ids -> [n * P] slot ids, each page's slots consecutive."""
        if self.page_size == 1:
            return pages.astype(np.int64, copy=True)
        offsets = np.arange(self.page_size, dtype=np.int64)
        return (pages[:, None] * self.page_size + offsets[None, :]).reshape(-1)

    def _slots_to_pages(self, slots: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return slots
        pages = slots[:: self.page_size] // self.page_size
        expected = self.pages_to_slots(pages)[: slots.size]
        if not np.array_equal(slots, expected):
            raise InvalidFree("slots to free are not runs of whole pages (last may be partial)")
        return pages

    def is_free(self, slots: np.ndarray) -> np.ndarray:
        """[n] bool: whether the page of each slot is currently free."""
        return self._is_free[np.asarray(slots, dtype=np.int64) // self.page_size]

    def free_slots(self) -> np.ndarray:
        """A copy of the free slots, [num_free_slots] int64 (tests and debugging)."""
        return self.pages_to_slots(self._stack[: self._num_free_pages].copy())

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` if the free stack and the free mask disagree."""
        free = self._stack[: self._num_free_pages]
        require(0 <= self._num_free_pages <= self.num_pages - 1, "free page count out of range")
        require(bool(((free >= 1) & (free < self.num_pages)).all()), "free page out of range")
        require(np.unique(free).size == free.size, "a page is on the free stack twice")
        require(not self._is_free[DUMMY_SLOT], "the dummy page is marked free")
        require(int(self._is_free.sum()) == free.size, "free mask count != free stack size")
        require(bool(self._is_free[free].all()), "a page on the free stack is not marked free")
