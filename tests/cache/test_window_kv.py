"""The sliding-window layers' pool (cache/window_kv.py) with the KV manager: pages lent
and given back, pins, reclaim of the tree's window KV, and how far a cached prefix whose
window KV is partly gone can be used."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.cache.errors import OutOfKVSlots
from radixjax.cache.manager import KVCacheManager
from radixjax.cache.window_kv import WindowKV, min_window_slots


def _manager(window: int = 4, num_slots: int = 64, window_slots: int = 32,
             page_size: int = 1) -> KVCacheManager:
    return KVCacheManager(num_slots, page_size,
                          WindowKV(window, num_slots, window_slots, page_size))


@pytest.mark.parametrize("page_size", [1, 2])
def test_usable_prefix_stops_where_window_kv_is_missing(page_size: int) -> None:
    kvm = _manager(window=4, page_size=page_size)
    w = kvm.window
    slots = kvm.alloc(16)
    w.assign(slots)
    assert w.usable_prefix(slots) == 16  # everything there
    w.release(w.page_ids(slots[4:6]))  # positions 4, 5 lose their window KV
    # continuing at 16 reads 12..15 (there), at 10 would read 6..9: usable up to 16
    assert w.usable_prefix(slots) == 16
    w.release(w.page_ids(slots[12:14]))
    # 16 would read 12..15 (gone); the largest end whose 4 positions before are there:
    # 12 reads 8..11 (there)
    assert w.usable_prefix(slots) == 12
    w.release(w.page_ids(slots[8:10]))  # now 12 fails too; 4 reads 0..3 (there)
    assert w.usable_prefix(slots) == 4
    kvm.give_back(slots)  # the full pages go: their window pages too
    assert w.num_used_slots() == 0
    kvm.check_integrity()


def test_request_window_flow_frees_private_and_pins_tree_pages() -> None:
    kvm = _manager(window=4)
    w = kvm.window
    tokens = list(range(100, 112))
    # request A: 12 tokens, computed in one step, cached when its prefill completes
    m = kvm.match_and_lock(tokens)
    slots = kvm.alloc(12)
    claim = kvm.claim_window(slots, 0)
    kvm.advance_window(claim, slots, 0)
    assert np.array_equal(kvm.assign_window(slots), w.window_slots(slots))
    assert w.num_used_slots() == 12
    slots, last, cached = kvm.cache_unfinished(tokens, slots, m.last_node, 0, None, claim)
    assert cached == 12 and claim.pinned_end == 12
    assert w.pins[slots[:12]].sum() == 12  # the tree's pages inside A's window: pinned
    # A decodes 6 tokens (private): positions past 12
    more = kvm.alloc(6)
    slots = np.concatenate([slots, more])
    for n in range(12, 18):
        kvm.advance_window(claim, slots, n)
        kvm.assign_window(slots[n:n + 1])
    kvm.check_integrity()
    assert claim.start == 13  # window_start(17)
    assert w.pins[slots[:13]].sum() == 0  # positions 13..11: none left pinned either
    assert w.has_window(slots[:12]).all()  # the tree's pages keep theirs
    assert not w.has_window(slots[12:13]).any()  # private position 12 fell behind: freed
    assert w.has_window(slots[13:18]).all()
    kvm.advance_window(claim, slots, 30)  # (as if far ahead) the private ones behind go
    assert not w.has_window(slots[12:18]).any()
    assert w.has_window(slots[:12]).all()
    kvm.cache_finished(tokens + list(range(6)), slots, last, None, claim)
    assert not w.pins.any()
    kvm.check_integrity()
    # B shares A's 12 tokens; its match reaches all 12 (the window KV of 8..11 is there)
    b = kvm.match_and_lock(tokens + [7, 7])
    assert b.num_tokens == 12
    kvm.tree.dec_lock_ref(b.last_node)


def test_reclaim_takes_unpinned_tree_pages_least_recent_first() -> None:
    kvm = _manager(window=2, num_slots=64, window_slots=12)
    w = kvm.window
    old, new = list(range(1, 6)), list(range(50, 56))
    for toks in (old, new):  # two cached prompts, each with its window KV
        m = kvm.match_and_lock(toks)
        slots = kvm.alloc(len(toks))
        claim = kvm.claim_window(slots, 0)
        kvm.assign_window(slots)
        kvm.cache_finished(toks, slots, m.last_node, None, claim)
    assert w.num_used_slots() == 11  # 11 of 11 usable
    # a running request pins the newer prompt's last pages
    m = kvm.match_and_lock(new + [9])
    claim = kvm.claim_window(m.slots, m.num_tokens)
    private = kvm.alloc(1)
    kvm.assign_window(private)  # needs one page: the older prompt's go first
    assert w.num_reclaimed >= 1
    assert not w.has_window(kvm.tree.match_prefix(old).slots).all()
    assert w.has_window(m.slots[-2:]).all()  # pinned: kept
    kvm.check_integrity()
    with pytest.raises(OutOfKVSlots):  # more than unpinned tree pages can give
        kvm.assign_window(kvm.alloc(12))


def test_min_window_slots_bounds_running_requests() -> None:
    # 3 requests of W + 2 pages each, and one step's new tokens (2 pages), the dummy
    assert min_window_slots(window=8, page_size=4, max_running=3,
                            max_batch_tokens=8) == (3 * (2 + 2) + 2 + 2) * 4
