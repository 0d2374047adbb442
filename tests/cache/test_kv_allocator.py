"""KVSlotAllocator: dummy slot, pages, typed errors, double-free detection."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixjax.cache import (
    DUMMY_SLOT,
    CacheIntegrityError,
    InvalidFree,
    KVSlotAllocator,
    OutOfKVSlots,
)
from tests.cache.profiles import cache_profile


def test_dummy_slot_is_never_handed_out() -> None:
    allocator = KVSlotAllocator(9)
    slots = allocator.alloc(8)
    assert sorted(slots.tolist()) == list(range(1, 9))
    assert DUMMY_SLOT not in slots.tolist()
    assert allocator.num_free_slots == 0
    with pytest.raises(OutOfKVSlots) as info:
        allocator.alloc(1)
    assert (info.value.num_requested, info.value.num_available) == (1, 0)
    allocator.check_integrity()


def test_failed_alloc_allocates_nothing() -> None:
    allocator = KVSlotAllocator(5)
    with pytest.raises(OutOfKVSlots):
        allocator.alloc(5)
    assert allocator.num_free_slots == 4
    assert allocator.alloc(4).size == 4


def test_free_makes_slots_reusable() -> None:
    allocator = KVSlotAllocator(9)
    first = allocator.alloc(5)
    allocator.free(first[1:3])
    assert allocator.num_free_slots == 5
    again = allocator.alloc(2)
    assert sorted(again.tolist()) == sorted(first[1:3].tolist())
    allocator.check_integrity()


@pytest.mark.parametrize(
    "bad",
    [[0], [9], [-1], [3, 3]],
    ids=["dummy", "past-the-end", "negative", "twice-in-one-call"],
)
def test_invalid_frees_raise_and_change_nothing(bad: list[int]) -> None:
    allocator = KVSlotAllocator(9)
    allocator.alloc(8)
    with pytest.raises(InvalidFree):
        allocator.free(bad)
    assert allocator.num_free_slots == 0
    allocator.check_integrity()


def test_double_free_raises() -> None:
    allocator = KVSlotAllocator(9)
    slots = allocator.alloc(3)
    allocator.free(slots)
    with pytest.raises(InvalidFree, match="double free"):
        allocator.free(slots[:1])
    assert allocator.num_free_slots == 8
    allocator.check_integrity()


def test_never_allocated_slot_cannot_be_freed() -> None:
    allocator = KVSlotAllocator(9)
    with pytest.raises(InvalidFree):
        allocator.free([4])


def test_pages_come_whole_and_exclude_page_zero() -> None:
    allocator = KVSlotAllocator(16 * 4, page_size=16)
    assert allocator.num_usable_slots == 48
    slots = allocator.alloc(32)
    assert slots.tolist() == list(range(16, 48))
    with pytest.raises(ValueError):
        allocator.alloc(8)  # not whole pages
    with pytest.raises(OutOfKVSlots):
        allocator.alloc(32)
    allocator.check_integrity()


def test_pages_free_accepts_a_partial_last_page_only() -> None:
    allocator = KVSlotAllocator(16 * 4, page_size=16)
    slots = allocator.alloc(48)
    with pytest.raises(InvalidFree):
        allocator.free(slots[4:20])  # starts mid-page
    with pytest.raises(InvalidFree):
        allocator.free(np.concatenate([slots[:8], slots[16:32]]))  # partial page not last
    allocator.free(slots[16:21])  # a request's tail: frees that whole page
    assert allocator.num_free_slots == 16
    assert allocator.is_free(slots[16:32]).all()
    with pytest.raises(InvalidFree, match="double free"):
        allocator.free(slots[16:32])
    allocator.check_integrity()


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        KVSlotAllocator(10, page_size=4)
    with pytest.raises(ValueError):
        KVSlotAllocator(1)
    with pytest.raises(ValueError):
        KVSlotAllocator(8, page_size=0)


def test_check_integrity_catches_corruption() -> None:
    allocator = KVSlotAllocator(9)
    allocator.alloc(2)
    allocator.check_integrity()
    allocator._is_free[1] = True  # allocated, yet marked free
    with pytest.raises(CacheIntegrityError):
        allocator.check_integrity()


@cache_profile()
@given(
    page_size=st.sampled_from([1, 4, 16]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40),
)
def test_alloc_free_against_a_set(page_size: int, ops: list[tuple[bool, int]]) -> None:
    """Random alloc/free against a set of held slots: never overlap, never lose one."""
    allocator = KVSlotAllocator(page_size * 12, page_size)
    held: list[np.ndarray] = []
    for is_alloc, size in ops:
        if is_alloc:
            num = size * page_size
            if num > allocator.num_free_slots:
                with pytest.raises(OutOfKVSlots):
                    allocator.alloc(num)
            else:
                held.append(allocator.alloc(num))
        elif held:
            allocator.free(held.pop(size % len(held)))
        owned = [s for run in held for s in run.tolist()]
        free = allocator.free_slots().tolist()
        assert sorted(owned + free) == list(range(page_size, page_size * 12))
        allocator.check_integrity()
