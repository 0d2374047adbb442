"""ReqToTokenPool: free-row management, typed errors, zeroed rows."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.cache import CacheIntegrityError, InvalidFree, OutOfRequestSlots, ReqToTokenPool


def test_rows_are_handed_out_until_full() -> None:
    pool = ReqToTokenPool(max_running_requests=3, max_context=8)
    assert pool.table.shape == (3, 8) and pool.table.dtype == np.int32
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2]
    assert not pool.can_alloc()
    with pytest.raises(OutOfRequestSlots):
        pool.alloc()
    pool.free(rows[1])
    assert pool.alloc() == rows[1]
    pool.check_integrity()


def test_free_zeroes_the_row_and_double_free_raises() -> None:
    pool = ReqToTokenPool(2, 6)
    row = pool.alloc()
    pool.write(row, 0, [5, 6, 7])
    pool.write(row, 3, np.array([8], dtype=np.int64))
    assert pool.read(row, 5).tolist() == [5, 6, 7, 8, 0]
    pool.free(row)
    assert not pool.table[row].any()
    with pytest.raises(InvalidFree):
        pool.free(row)
    with pytest.raises(InvalidFree):
        pool.free(7)
    pool.check_integrity()


def test_write_checks_bounds_and_ownership() -> None:
    pool = ReqToTokenPool(2, 4)
    row = pool.alloc()
    with pytest.raises(ValueError):
        pool.write(row, 2, [1, 2, 3])
    with pytest.raises(InvalidFree):
        pool.write(1 - row, 0, [1])  # the other row is not allocated
    assert not pool.table.any()


def test_check_integrity_catches_a_stale_row() -> None:
    pool = ReqToTokenPool(2, 4)
    pool.check_integrity()
    pool.table[1, 0] = 3  # a free row pointing at a KV slot
    with pytest.raises(CacheIntegrityError):
        pool.check_integrity()
