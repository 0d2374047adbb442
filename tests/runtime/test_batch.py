"""Host-side batch packing and bucketing."""

from __future__ import annotations

import numpy as np
import pytest

from radixjax.runtime.batch import (
    DUMMY_SLOT,
    BucketError,
    Buckets,
    RequestSlice,
    build_batch,
    pick_bucket,
    pow2_buckets,
)


def test_pow2_buckets_and_pick() -> None:
    assert pow2_buckets(1, 8) == (1, 2, 4, 8)
    assert pow2_buckets(128, 300) == (128, 256, 300)
    assert pick_bucket(5, (1, 2, 4, 8), "x") == 8
    assert pick_bucket(4, (1, 2, 4, 8), "x") == 4
    with pytest.raises(BucketError):
        pick_bucket(9, (1, 2, 4, 8), "x")


def test_build_batch_packs_ragged_requests() -> None:
    buckets = Buckets.default(max_tokens=16, max_reqs=4, max_context=64)
    a = RequestSlice(np.array([5, 6, 7], np.int32), np.array([10, 11, 12], np.int32))
    # b has 4 cached positions (slots 20..23) and 2 new tokens (slots 30, 31)
    b = RequestSlice(np.array([8, 9], np.int32), np.array([20, 21, 22, 23, 30, 31], np.int32))
    c = RequestSlice(np.array([4], np.int32), np.array([40, 41], np.int32))
    hb = build_batch([a, b, c], buckets)
    md = hb.md
    assert hb.shape.num_tokens == 8 and hb.shape.num_reqs == 4
    assert hb.shape.max_q == 4 and hb.shape.max_kv == 64
    np.testing.assert_array_equal(hb.input_ids, [5, 6, 7, 8, 9, 4, 0, 0])
    np.testing.assert_array_equal(md.positions[:6], [0, 1, 2, 4, 5, 1])
    np.testing.assert_array_equal(md.out_slots, [10, 11, 12, 30, 31, 41, DUMMY_SLOT, DUMMY_SLOT])
    np.testing.assert_array_equal(md.token_req[:6], [0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(md.q_start, [0, 3, 5, 6])
    np.testing.assert_array_equal(md.q_len, [3, 2, 1, 0])
    np.testing.assert_array_equal(md.kv_len, [3, 6, 2, 0])
    np.testing.assert_array_equal(md.kv_slots[1, :7], [20, 21, 22, 23, 30, 31, DUMMY_SLOT])
    assert (md.kv_slots[3] == DUMMY_SLOT).all()


def test_build_batch_rejects_bad_slices() -> None:
    buckets = Buckets.default(16, 4, 64)
    with pytest.raises(ValueError):
        build_batch([], buckets)
    with pytest.raises(ValueError):  # more new tokens than positions
        build_batch([RequestSlice(np.array([1, 2], np.int32), np.array([3], np.int32))], buckets)
    with pytest.raises(BucketError):
        build_batch([RequestSlice(np.arange(17, dtype=np.int32),
                                  np.arange(1, 18, dtype=np.int32))], buckets)
