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
    token_buckets,
)


def test_token_buckets_and_pick() -> None:
    assert token_buckets(1, 8) == (1, 2, 4, 8)
    assert token_buckets(128, 300) == (128, 256, 300)
    assert token_buckets(64, 1024) == (64, 128, 256, 384, 512, 768, 1024)  # midpoints
    assert token_buckets(256, 400) == (256, 384, 400)
    assert pick_bucket(5, (1, 2, 4, 8), "x") == 8
    assert pick_bucket(4, (1, 2, 4, 8), "x") == 4
    with pytest.raises(BucketError):
        pick_bucket(9, (1, 2, 4, 8), "x")


def test_build_batch_packs_ragged_requests() -> None:
    buckets = Buckets.default(max_tokens=16, max_reqs=4)
    a = RequestSlice(np.array([5, 6, 7], np.int32), np.array([10, 11, 12], np.int32))
    # b has 4 cached positions (slots 20..23) and 2 new tokens (slots 30, 31)
    b = RequestSlice(np.array([8, 9], np.int32), np.array([20, 21, 22, 23, 30, 31], np.int32))
    c = RequestSlice(np.array([4], np.int32), np.array([40, 41], np.int32))
    hb = build_batch([a, b, c], buckets)
    md = hb.md
    assert hb.shape.num_tokens == 8 and hb.shape.num_reqs == 4  # B follows from T
    np.testing.assert_array_equal(hb.input_ids, [5, 6, 7, 8, 9, 4, 0, 0])
    np.testing.assert_array_equal(md.positions[:6], [0, 1, 2, 4, 5, 1])
    np.testing.assert_array_equal(md.out_slots, [10, 11, 12, 30, 31, 41, DUMMY_SLOT, DUMMY_SLOT])
    np.testing.assert_array_equal(md.token_req[:6], [0, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(md.q_start, [0, 3, 5, 6])
    np.testing.assert_array_equal(md.q_len, [3, 2, 1, 0])
    np.testing.assert_array_equal(md.kv_len, [3, 6, 2, 0])
    np.testing.assert_array_equal(md.req_row, [0, 1, 2, 4])  # padding: the spare row 4
    np.testing.assert_array_equal(hb.src.token_row, [0, 0, 0, 1, 1, 2, 4, 4])
    # rows the device lacks are uploaded first: b's and c's cached positions (a has none)
    assert [(row, s.tolist()) for row, s in hb.row_syncs] == [(1, [20, 21, 22, 23]), (2, [40])]


def test_the_token_bucket_names_the_program() -> None:
    buckets = Buckets.default(max_tokens=64, max_reqs=8)
    assert buckets.shapes == [buckets.shape_of(t) for t in (1, 2, 4, 8, 16, 32, 64)]
    assert [s.num_reqs for s in buckets.shapes] == [1, 2, 4, 8, 8, 8, 8]
    # any context, any mix of prefill and decode: the shape depends on the token count
    for kv in (3, 700, 5000):
        one = RequestSlice(np.array([1], np.int32), np.arange(1, kv + 1, dtype=np.int32))
        assert build_batch([one], buckets).shape == buckets.shape_of(1)


def test_scheduler_rows_are_synced_only_when_asked() -> None:
    buckets = Buckets.default(16, 4)
    dec = RequestSlice(np.array([3], np.int32), np.arange(1, 9, dtype=np.int32), row=2,
                       sync_row=False)
    assert build_batch([dec], buckets).row_syncs == ()
    with pytest.raises(ValueError, match="distinct"):
        build_batch([dec, dec], buckets)
    with pytest.raises(ValueError):  # row 4 is the spare row
        build_batch([dec._replace(row=4)], buckets)


def test_build_batch_rejects_bad_slices() -> None:
    buckets = Buckets.default(16, 4)
    with pytest.raises(ValueError):
        build_batch([], buckets)
    with pytest.raises(ValueError):  # more new tokens than positions
        build_batch([RequestSlice(np.array([1, 2], np.int32), np.array([3], np.int32))], buckets)
    with pytest.raises(BucketError):
        build_batch([RequestSlice(np.arange(17, dtype=np.int32),
                                  np.arange(1, 18, dtype=np.int32))], buckets)
