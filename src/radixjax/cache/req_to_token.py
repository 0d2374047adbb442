"""ReqToTokenPool: the host table ``req_to_token[row, position] -> KV slot``.

    row r:  [ s0  s1  s2 ... s(len-1)   0   0 ...   0 ]     shape [max_context] int32
             └── cached prefix ─┘└ new ┘  └─ dummy slot 0 beyond the request's length

Each running request owns one row; the engine mirrors the rows of a batch to the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixjax.cache.errors import InvalidFree, OutOfRequestSlots, require


class ReqToTokenPool:
    """Row allocator over a ``[max_running_requests, max_context]`` int32 table.

    Mutates: `alloc` hands out a free row, `free` takes it back and zeroes it (so a stale
    row can only ever point at the dummy slot 0); `write` fills a row's slots. Invariant:
    the rows on the free stack are distinct, and exactly those are not in use.
    """

    def __init__(self, max_running_requests: int, max_context: int) -> None:
        if max_running_requests < 1 or max_context < 1:
            raise ValueError("max_running_requests and max_context must be >= 1")
        self.max_running_requests = max_running_requests
        self.max_context = max_context
        self.table = np.zeros((max_running_requests, max_context), dtype=np.int32)
        self._is_used = np.zeros(max_running_requests, dtype=bool)
        # Reversed so rows come out 0, 1, 2, ... (deterministic).
        self._free_rows = list(range(max_running_requests - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def can_alloc(self, num_rows: int = 1) -> bool:
        return num_rows <= len(self._free_rows)

    def alloc(self) -> int:
        """A free row index; raises `OutOfRequestSlots` when all rows are in use."""
        if not self._free_rows:
            raise OutOfRequestSlots(f"all {self.max_running_requests} request rows in use")
        row = self._free_rows.pop()
        self._is_used[row] = True
        return row

    def free(self, row: int) -> None:
        """Give `row` back and zero it; raises `InvalidFree` if it is not in use."""
        if not 0 <= row < self.max_running_requests:
            raise InvalidFree(f"request row {row} out of range")
        if not self._is_used[row]:
            raise InvalidFree(f"double free of request row {row}")
        self._is_used[row] = False
        self.table[row] = 0
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: Sequence[int] | np.ndarray) -> None:
        """``table[row, start : start + len(slots)] = slots`` on a row in use."""
        slots = np.asarray(slots)
        if not self._is_used[row]:
            raise InvalidFree(f"write to request row {row}, which is not allocated")
        if start < 0 or start + slots.size > self.max_context:
            raise ValueError(
                f"positions [{start}, {start + slots.size}) exceed max_context {self.max_context}"
            )
        self.table[row, start : start + slots.size] = slots

    def read(self, row: int, length: int) -> np.ndarray:
        """A copy of the first `length` slots of `row`: [length] int32."""
        return self.table[row, :length].copy()

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` if the free rows and the in-use mask disagree."""
        free = self._free_rows
        require(len(set(free)) == len(free), "a request row is on the free list twice")
        require(all(0 <= row < self.max_running_requests for row in free), "free row out of range")
        require(not self._is_used[free].any(), "a free row is marked in use")
        require(
            int(self._is_used.sum()) + len(free) == self.max_running_requests,
            "rows neither free nor in use",
        )
        require(not self.table[~self._is_used].any(), "a free row still points at KV slots")
