"""The native backend's decode path against a numpy softmax attention, for both of its
forms: few KV heads (one block-diagonal GEMM over all heads) and many (per head), in the
largest and the smallest key blocks (the block follows the batch size)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model import cpu
from radixjax.model import native_attention as na
from radixjax.model.attention import (
    SHARED_PREFIX_MIN_BATCH,
    TABLE_ALIGN,
    AttentionMetadata,
    from_pool,
    pool_dtype,
    to_pool,
)
from radixjax.model.native_attention import (
    BLOCK_DIAGONAL_MAX_KV_HEADS,
    DECODE_MAX_BLOCK_K,
    DECODE_MIN_BLOCK_K,
    DECODE_SOLO_BLOCK_K,
    EXTEND_BLOCK_K,
    MULTIPLY_SUM_MAX_GROUP,
    MULTIPLY_SUM_MIN_BATCH,
    decode_block_k,
    decode_form,
    deterministic_attention,
    native_attention,
)
from radixjax.runtime.batch import (
    ALONE_MIN_SHARE,
    SHARED_PREFIX_MIN,
    Buckets,
    PrefixMemo,
    RequestSlice,
    build_batch,
    shared_prefix_lens,
)


def numpy_decode(q, k_pool, v_pool, slots, window):
    """q [Hq, Dh] (unscaled) over the keys at `slots` -> [Hq, Dh]."""
    hkv, dh = k_pool.shape[1:]
    group = q.shape[0] // hkv
    if window is not None:
        slots = slots[-window:]
    k, v = k_pool[slots], v_pool[slots]  # [K, Hkv, Dh]
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        s = k[:, h // group] @ q[h] * dh**-0.5
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[:, h // group]
    return out


# each decode form at B = 3 and 2 query heads per KV head (multiply_sum: its threshold
# lowered), by its KV heads
FORMS = {"block_diagonal": 2, "per_head": BLOCK_DIAGONAL_MAX_KV_HEADS + 4, "multiply_sum": 2}


def _force_form(form: str, monkeypatch: pytest.MonkeyPatch) -> int:
    if form == "multiply_sum":
        monkeypatch.setattr(na, "MULTIPLY_SUM_MIN_BATCH", 1)
    assert decode_form(FORMS[form], 2, 3) == form
    return FORMS[form]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("block_k", [DECODE_SOLO_BLOCK_K, DECODE_MAX_BLOCK_K,
                                     DECODE_MIN_BLOCK_K])
def test_decode_matches_numpy(form: str, window: int | None, block_k: int,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(na, "decode_block_k", lambda batch: block_k)
    num_kv_heads = _force_form(form, monkeypatch)
    _check_decode(num_kv_heads, window, [3, 300, 900])  # several key blocks, and a tail


def test_decode_blocks_start_at_the_first_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows near the end of the table row: the key blocks start at the earliest
    window's first key (not a multiple of the block) and run past the row's width."""
    monkeypatch.setattr(na, "decode_block_k", lambda batch: DECODE_MAX_BLOCK_K)
    _check_decode(2, 7, [1000, 1013, 1020])


@pytest.mark.parametrize("form", FORMS)
def test_decode_on_a_bf16_pool_matches_numpy(form: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 pool (kept as its bits): the GEMM forms multiply its rows as bf16 operands
    (f32 sums), the multiply-and-sum in f32; all within bf16's ~3 digits of the
    reference over the same bf16 keys and values."""
    _check_decode(_force_form(form, monkeypatch), 7, [3, 300, 900],
                  pool_dtype(jnp.bfloat16, "native"))


def decode_case(seed: int, kv_lens: list[int], num_kv_heads: int, group: int, dim: int,
                bf16: bool, num_slots: int = 3100) -> tuple:
    """Random pools [num_slots, Hkv, dim] (the values a bf16 pool keeps where bf16), a
    table row of distinct random slots per request (never slot 0), queries [B, Hq, dim]:
    (q, k_pool, v_pool, table, each request's slots)."""
    rng = np.random.default_rng(seed)
    k_pool, v_pool = (rng.standard_normal((num_slots, num_kv_heads, dim)).astype(np.float32)
                      for _ in range(2))
    if bf16:
        k_pool, v_pool = (x.astype(jnp.bfloat16).astype(np.float32) for x in (k_pool, v_pool))
    table = np.zeros((len(kv_lens) + 1, TABLE_ALIGN * 2), np.int32)
    perm = rng.permutation(np.arange(1, num_slots))
    rows, at = [], 0
    for i, n in enumerate(kv_lens):
        table[i, :n] = perm[at:at + n]
        rows.append(table[i, :n].copy())
        at += n
    q = rng.standard_normal((len(kv_lens), num_kv_heads * group, dim)).astype(np.float32)
    return q, k_pool, v_pool, table, rows


def _check_decode(num_kv_heads: int, window: int | None, kv_lens: list[int],
                  dtype: jnp.dtype = jnp.float32) -> None:
    dh = 8
    q, k_pool, v_pool, table, rows = decode_case(num_kv_heads, kv_lens, num_kv_heads, 2, dh,
                                                 dtype != jnp.float32)
    b = len(kv_lens)
    new_k = k_pool[[r[-1] for r in rows]]  # the step writes these (already in the pool)
    new_v = v_pool[[r[-1] for r in rows]]
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    md = AttentionMetadata(
        positions=i32([n - 1 for n in kv_lens]), out_slots=i32([r[-1] for r in rows]),
        token_req=i32(range(b)), q_start=i32(range(b)), q_len=i32([1] * b),
        kv_len=i32(kv_lens), req_row=i32(range(b)), req_to_token=jnp.asarray(table))
    pools = [to_pool(jnp.asarray(x), dtype) for x in (k_pool, v_pool)]
    out, _, _ = native_attention(jnp.asarray(q), jnp.asarray(new_k), jnp.asarray(new_v),
                                 *pools, md, window, dh**-0.5)
    tol = 2e-5 if dtype == jnp.float32 else 1e-2
    for i, r in enumerate(rows):
        ref = numpy_decode(q[i], k_pool, v_pool, r, window)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=tol, atol=tol)


def _pools(seed: int, num_slots: int, num_kv_heads: int, dh: int):
    """Random K and V pools [num_slots, Hkv, Dh] and take(n): n distinct unused slots
    (never the dummy slot 0) in random order."""
    rng = np.random.default_rng(seed)
    k_pool = rng.standard_normal((num_slots, num_kv_heads, dh)).astype(np.float32)
    v_pool = rng.standard_normal((num_slots, num_kv_heads, dh)).astype(np.float32)
    perm = iter(rng.permutation(np.arange(1, num_slots)).tolist())
    return k_pool, v_pool, lambda n: np.array([next(perm) for _ in range(n)], np.int32)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("window", [None, 7, 400])
def test_decode_with_shared_prefix_matches_numpy(form: str, window: int | None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Three requests share a 600-key prefix (the same slots), read once by the shared
    pass; a fourth has its own keys; a fifth shares the prefix's slots but is not in the
    group (shared_len 0: it reads them itself). Each gets plain attention over its keys."""
    num_kv_heads = _force_form(form, monkeypatch)
    group, dh = 2, 8
    k_pool, v_pool, take = _pools(num_kv_heads + (window or 0), 3000, num_kv_heads, dh)
    rng = np.random.default_rng(num_kv_heads + (window or 0) + 1)  # the queries
    prefix = take(600)
    rows = [np.concatenate([prefix, take(n)]) for n in (1, 40, 700)] + [take(90)]
    rows.append(np.concatenate([prefix, take(5)]))
    shared_len = [600, 600, 600, 0, 0]
    b, pad = len(rows), SHARED_PREFIX_MIN_BATCH - len(rows)  # padded requests: the rest
    table = np.zeros((b + 1, TABLE_ALIGN * 3), np.int32)
    for i, r in enumerate(rows):
        table[i, :len(r)] = r
    q = rng.standard_normal((b + pad, num_kv_heads * group, dh)).astype(np.float32)
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    md = AttentionMetadata(
        positions=i32([len(r) - 1 for r in rows] + [0] * pad),
        out_slots=i32([r[-1] for r in rows] + [0] * pad), token_req=i32(range(b + pad)),
        q_start=i32(list(range(b)) + [b] * pad), q_len=i32([1] * b + [0] * pad),
        kv_len=i32([len(r) for r in rows] + [0] * pad), req_row=i32([*range(b)] + [b] * pad),
        req_to_token=jnp.asarray(table), shared_len=i32(shared_len + [0] * pad))
    last = [r[-1] for r in rows] + [0] * pad
    out, _, _ = native_attention(jnp.asarray(q), jnp.asarray(k_pool[last]),
                                 jnp.asarray(v_pool[last]), jnp.asarray(k_pool),
                                 jnp.asarray(v_pool), md, window, dh**-0.5)
    for i, r in enumerate(rows):
        ref = numpy_decode(q[i], k_pool, v_pool, r, window)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=2e-5, atol=2e-5)


def test_deterministic_decode_is_the_same_bits_in_any_batch() -> None:
    """deterministic_attention's XLA decode (the form where model/cpu_decode.py's handler
    is not built; SmolLM2's heads, a bf16 pool): a request's bits alone, beside another
    and among eight that share a 300-key prefix (its whole key blocks one GEMM for all,
    the rest each request's own batched product)."""
    num_kv_heads, group, dh = 3, 3, 64
    k_pool, v_pool, take = _pools(11, 3000, num_kv_heads, dh)
    pools = [to_pool(jnp.asarray(x), pool_dtype(jnp.bfloat16, "native")) for x in (k_pool, v_pool)]
    prefix = take(300)
    rows = [np.concatenate([prefix, take(n)]) for n in (40, 1, 5, 60, 130, 7, 200, 20)]
    q = np.random.default_rng(12).standard_normal(
        (len(rows), num_kv_heads * group, dh)).astype(np.float32) * dh**-0.5
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731

    def run(which: list[int], shared: bool) -> np.ndarray:
        b = len(which)
        table = np.zeros((b + 1, TABLE_ALIGN), np.int32)
        for i, r in enumerate(which):
            table[i, :len(rows[r])] = rows[r]
        md = AttentionMetadata(
            positions=i32([len(rows[r]) - 1 for r in which]),
            out_slots=i32([rows[r][-1] for r in which]), token_req=i32(range(b)),
            q_start=i32(range(b)), q_len=i32([1] * b), kv_len=i32([len(rows[r]) for r in which]),
            req_row=i32(range(b)), req_to_token=jnp.asarray(table),
            shared_len=i32([300] * b) if shared else None)
        return np.asarray(deterministic_attention(jnp.asarray(q[which]), *pools, md, None))

    alone = run([0], False)[0]
    np.testing.assert_array_equal(run([3, 0], False)[1], alone)
    assert SHARED_PREFIX_MIN_BATCH <= len(rows)
    np.testing.assert_array_equal(run([1, 2, 0, 3, 4, 5, 6, 7], True)[2], alone)
    np.testing.assert_allclose(alone, numpy_decode(q[0] * dh**0.5, k_pool.astype(
        jnp.bfloat16).astype(np.float32), v_pool.astype(jnp.bfloat16).astype(np.float32),
        rows[0], None), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("window", [None, 7, 400])
@pytest.mark.parametrize("block_k", [EXTEND_BLOCK_K, 256])
def test_extend_with_shared_prefix_matches_numpy(window: int | None, block_k: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed step: two extend requests (one over several query tiles) and a decode request
    on a 300-key cached prefix they share, and an extend request of its own; every new
    token gets causal attention over its request's keys. (Extend has one form; the
    decode forms by KV heads are the test above.) Key blocks start at a tile's first own
    key; with 128 keys the later tiles' last blocks run past the table row, so they are
    read from 128 keys before the row's end, the keys already read masked."""
    monkeypatch.setattr(na, "EXTEND_BLOCK_K", block_k)
    _check_mixed_step(window, jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_one_request_alone_takes_the_prefix_pass(dtype: jnp.dtype) -> None:
    """The pass for a group of one (the host's choice where no two requests share): the
    first extend request reads its 300 cached keys there, the others, with the same
    cached keys, read them in their own loops."""
    _check_mixed_step(7, pool_dtype(dtype, "native"), shared_len=[300, 0, 0, 0])


def test_bfloat16_pool_is_read_and_written_as_bf16() -> None:
    """The mixed step on a bf16 pool kept as its bits (the native backend's form): the
    new rows land rounded to bf16, every token attends over the bf16 keys and values."""
    _check_mixed_step(7, pool_dtype(jnp.bfloat16, "native"))


def _check_mixed_step(window: int | None, dtype: jnp.dtype,
                      shared_len: list[int] | None = None) -> None:
    num_kv_heads, group, dh = 2, 2, 8
    k_pool, v_pool, take = _pools(window or 0, 2000, num_kv_heads, dh)
    k_in, v_in = k_pool, v_pool  # the new rows as computed (f32)
    if dtype != jnp.float32:  # the values the pool keeps
        k_pool, v_pool = (x.astype(jnp.bfloat16).astype(np.float32) for x in (k_pool, v_pool))
    rng = np.random.default_rng((window or 0) + 1)  # the queries
    prefix = take(300)
    rows = [np.concatenate([prefix, take(n)]) for n in (10 + 50, 200, 1)] + [take(70)]
    q_lens = [50, 200, 1, 30]
    shared_len = [300, 300, 300, 0] if shared_len is None else shared_len
    b, t = len(rows), sum(q_lens)
    pad = SHARED_PREFIX_MIN_BATCH - b  # padded requests: empty, after the real tokens
    table = np.zeros((b + 1, TABLE_ALIGN), np.int32)
    for i, r in enumerate(rows):
        table[i, :len(r)] = r
    q = rng.standard_normal((t, num_kv_heads * group, dh)).astype(np.float32)
    starts = np.cumsum([0] + q_lens[:-1])
    new = np.concatenate([r[len(r) - n:] for r, n in zip(rows, q_lens, strict=True)])
    pos = np.concatenate([np.arange(len(r) - n, len(r)) for r, n in zip(rows, q_lens,
                                                                          strict=True)])
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    md = AttentionMetadata(
        positions=i32(pos), out_slots=i32(new), token_req=i32(np.repeat(range(b), q_lens)),
        q_start=i32([*starts] + [t] * pad), q_len=i32(q_lens + [0] * pad),
        kv_len=i32([len(r) for r in rows] + [0] * pad), req_row=i32([*range(b)] + [b] * pad),
        req_to_token=jnp.asarray(table), shared_len=i32(shared_len + [0] * pad))
    pools = [to_pool(jnp.asarray(x), dtype) for x in (k_pool, v_pool)]
    pools[0] = pools[0].at[new].set(0)  # written by the step
    out, k_out, _ = native_attention(jnp.asarray(q), jnp.asarray(k_in[new]),
                                     jnp.asarray(v_in[new]), *pools, md, window, dh**-0.5)
    assert k_out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(from_pool(k_out[new])), k_pool[new])
    # beside a bf16 pool the new keys' products take bf16 operands (~3 digits)
    tol = 2e-5 if dtype == jnp.float32 else 1e-2
    for i in range(t):
        r = rows[np.searchsorted(starts, i, side="right") - 1]
        ref = numpy_decode(q[i], k_pool, v_pool, r[:pos[i] + 1], window)
        np.testing.assert_allclose(np.asarray(out[i]), ref, rtol=tol, atol=tol)


def _slice(slots: list[int], q_len: int = 1) -> RequestSlice:
    return RequestSlice(np.zeros(q_len, np.int32), np.asarray(slots, np.int32))


def test_shared_prefix_is_the_largest_groups_common_run() -> None:
    """The requests starting at the most common first slot form the group; their common
    run of cached slots from position 0 (never a new token's) is the prefix, if at least
    SHARED_PREFIX_MIN long."""
    n = SHARED_PREFIX_MIN
    p = list(range(100, 100 + n + 10))
    reqs = [_slice(p + [1]), _slice(p[:n + 3] + [2, 3]), _slice([7] * (n + 20)),
            _slice(p + [4, 5, 6], q_len=3), _slice(p[:n + 5] + [5])]
    assert shared_prefix_lens(reqs).tolist() == [n + 3, n + 3, 0, n + 3, n + 3]
    # an extend request's new tokens are not part of it, even where the slots match
    ext = [_slice(p + [1]), _slice(p, q_len=len(p) - n)]
    assert shared_prefix_lens(ext).tolist() == [n, n]
    short = [_slice(p[:n - 1] + [1]), _slice(p[:n - 1] + [2])]
    assert shared_prefix_lens(short).tolist() == [0, 0]
    assert shared_prefix_lens([_slice(p + [1]), _slice([9] + p)]).tolist() == [0, 0]
    # a request whose whole context is the prefix shares all but its own new token
    assert shared_prefix_lens([_slice(p), _slice(p + [1, 2])]).tolist() == [len(p) - 1] * 2
    assert shared_prefix_lens([_slice(p, q_len=len(p)), _slice(p + [1])]).tolist() == [0, 0]


def test_prefix_memo_keeps_a_groups_length_while_its_buffers_stay() -> None:
    """A decode step over the same group compares nothing: the length comes from the
    memo while every member's cached slots are views of the same (append-only) buffers;
    a member with a new buffer (its slots replaced) is compared again."""
    n = SHARED_PREFIX_MIN
    p = np.arange(100, 110 + n)
    bufs = [np.concatenate([p, np.full(8, 1000 + i)]) for i in range(3)]
    memo = PrefixMemo()

    def step(k: int) -> list[RequestSlice]:  # each request decodes at position len(p)+k-1
        return [RequestSlice(np.zeros(1, np.int32), b[: len(p) + k]) for b in bufs]

    assert shared_prefix_lens(step(2), memo=memo).tolist() == [len(p)] * 3
    bufs[0][n] = -1  # a change the contract forbids: shows that nothing was compared
    assert shared_prefix_lens(step(3), memo=memo).tolist() == [len(p)] * 3
    bufs[0] = np.concatenate([p[: n + 2], np.full(20, 5)])
    assert shared_prefix_lens(step(3), memo=memo).tolist() == [n + 2] * 3
    assert shared_prefix_lens(step(3)).tolist() == [n + 2] * 3  # the same without one


def test_without_a_group_one_extend_takes_the_pass_alone() -> None:
    """Where no two requests share a first cached slot, the extending request with the
    most new tokens x cached keys takes the pass alone (a later chunk or turn over its own
    cached part) if it holds 1 / ALONE_MIN_SHARE of the step's rows; never a decode
    request, never a cached part under SHARED_PREFIX_MIN."""
    n = SHARED_PREFIX_MIN
    p, other = list(range(100, 110 + n)), list(range(500, 540 + n))
    assert shared_prefix_lens([_slice(p + [1, 2], q_len=2)]).tolist() == [len(p)]
    assert shared_prefix_lens([_slice(other + [1]), _slice(p + [1, 2], q_len=2)]).tolist() \
        == [0, len(p)]
    five, three = _slice(p + [1] * 5, q_len=5), _slice(other + [2] * 3, q_len=3)
    assert shared_prefix_lens([three, five]).tolist() == [0, len(p)]  # 5 x 74 > 3 x 104
    assert shared_prefix_lens([_slice(p + [1]), _slice(other + [2])]).tolist() == [0, 0]
    assert shared_prefix_lens([_slice(p[:n - 1] + [1, 2], q_len=2)]).tolist() == [0]
    # the pass computes every row of the step: a small share of them stays in the loop
    rows = 5 * ALONE_MIN_SHARE
    assert shared_prefix_lens([three, five], num_rows=rows).tolist() == [0, len(p)]
    assert shared_prefix_lens([three, five], num_rows=rows + 1).tolist() == [0, 0]


def test_steps_share_from_the_minimum_batch() -> None:
    """Programs of fewer than SHARED_PREFIX_MIN_BATCH requests have no shared-prefix
    pass, so the host shares nothing in their steps."""
    p = list(range(100, 100 + SHARED_PREFIX_MIN + 10))
    reqs = [_slice(p + [i]) for i in range(3)] + [_slice(p + [7] * 6, q_len=6)]  # T = 9
    small = build_batch(reqs, Buckets.default(64, SHARED_PREFIX_MIN_BATCH // 2))
    large = build_batch(reqs, Buckets.default(64, SHARED_PREFIX_MIN_BATCH))
    assert small.shape.num_reqs < SHARED_PREFIX_MIN_BATCH <= large.shape.num_reqs
    assert small.md.shared_len.tolist() == [0] * small.shape.num_reqs
    assert large.md.shared_len[:4].tolist() == [len(p)] * 4


def test_decode_form_follows_kv_heads_and_batch() -> None:
    """The tests above run each form at B = 3; by default large batches multiply and sum
    (measured faster from B = 16), smaller ones pick a GEMM form by their KV heads."""
    below, many = MULTIPLY_SUM_MIN_BATCH - 1, MULTIPLY_SUM_MAX_GROUP + 1
    assert decode_form(2, 2, 1) == decode_form(3, 3, below) == "block_diagonal"
    assert decode_form(BLOCK_DIAGONAL_MAX_KV_HEADS + 4, 2, below) == "per_head"
    assert decode_form(3, 3, MULTIPLY_SUM_MIN_BATCH) == decode_form(8, 4, 64) == "multiply_sum"
    assert decode_form(1, many, 64) == "block_diagonal"  # e.g. MLA: many heads per KV head


@pytest.mark.parametrize("amx", [False, True])
def test_decode_key_block_follows_batch(amx: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """About 512 pool rows per loop step, in blocks of 32..256 keys (powers of two); one
    request on a CPU with AMX: DECODE_SOLO_BLOCK_K."""
    monkeypatch.setattr(cpu, "has_amx", lambda: amx)
    assert [decode_block_k(b) for b in (1, 2, 8, 9, 16, 32, 64, 1024)] == [
        DECODE_SOLO_BLOCK_K if amx else 256, 256, 64, 32, 32, 32, 32, 32]
