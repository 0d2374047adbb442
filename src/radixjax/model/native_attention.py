"""The "native" attention backend (the CPU path, and the reference for the others).

No compiled shape holds the context length: every request's keys are read from the pool
in blocks of slots taken from its req_to_token row, up to its own kv_len, with an online
softmax (running max, denominator, accumulator), so a step's cost follows the real
context and one program serves every context length.

First the step's shared prefix (md.shared_len; the radix cache's common system
prompt, or one extending request's cached part), read once for every token of the
requests that hold it:
            q [Hkv, T * G, Dh] x keys [BK, Hkv, Dh] per block
Its online-softmax state seeds two paths, each over its own requests (the other's are
masked out), which read each request's keys past that prefix:

    decode  (q_len == 1): batched over B; a loop over key blocks up to the longest such
            request:   q [B, Hkv, G, Dh] x keys [B, BK, Hkv, Dh] per block
    extend  (q_len > 1):  the step's own new keys for all tokens at once, as a triangle
            of token-block pairs read from the step's K/V (model/new_keys.py); then
            the cached keys past the shared prefix, one request at a time (requests
            with none skipped), its tokens in query blocks of BQ, each a loop over key
            blocks from its window's start up to its first new position:
                       q [Hkv, BQ * G, Dh] x keys [BK, Hkv, Dh] per block

    out[t] = decode_out[token_req[t]] if q_len[token_req[t]] == 1 else extend_out[t]

Deterministic inference (deterministic_attention) keeps the two paths but fixes every
key block at multiples of DETERMINISTIC_BLOCK_K: extend through the per-request loop
alone, decode batched in one form at every B, so no row's bits depend on its batch.

On one CPU device where model/cpu_decode.py's handler is built (kernel=True, the
runner's default there) decode tokens go through it, each request alone (SmolLM2 at
B = 1 and 850 keys 15.2 -> 10.5 ms a step, B = 16 101.7 -> 54.4); in deterministic mode
every token does, a prompt's as a row of its own over its keys up to its position
(kernel_tokens), so a token has the same bits as a decode and inside a prompt (and the
prefill is faster: 512 tokens 635 -> 541 ms, 2048 4257 -> 3563). The XLA forms above
are the fallback and reference. The extend path sits under a lax.cond, so a step of
decodes alone skips it and its set-up.

`decode_attention` and `extend_attention` are also MLA's (model/mla.py): decode reads the
latent pool as an MQA pool, extend takes a `KeySource` that expands each key block.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from radixjax.model import cpu, cpu_decode, new_keys
from radixjax.model.attention import (
    BF16_BITS,
    MASK_VALUE,
    SHARED_PREFIX_MIN_BATCH,
    TABLE_ALIGN,
    AttentionMetadata,
    einsum_in,
    from_pool,
    soft_capped,
    to_pool,
    write_kv,
)
from radixjax.model.layers import row_sum

# Decode reads B x block_k pool rows per loop step: about DECODE_BLOCK_ROWS of them, in
# blocks of 32..256 keys (B = 1, 2: 256; 4: 128; 8: 64; 16 and up: 32). The blocks start
# at the earliest own key, so after a shared prefix a block holds little padding. SmolLM2
# decode steps: B = 32 context 512, 256 -> 64 keys: 464 -> 344 ms; 2048 rows -> 512 with
# the unaligned start, w8a8, 800 of 850 keys shared: B = 8 85 -> 64 ms, B = 16 112 -> 96,
# B = 32 190 -> 168; nothing shared, context 1024: B = 8 149 -> 121, B = 16 238 -> 209,
# B = 32 401 -> 383 (min of alternating rounds); B = 1 at 4k context keeps 256 (97 ms; 64
# keys: 138 ms, the loop's per-step cost). benchmarks/README.md, decode key blocks.
DECODE_BLOCK_ROWS = 512
DECODE_MIN_BLOCK_K, DECODE_MAX_BLOCK_K = 32, 256
# B = 1 on a CPU with AMX (model/cpu.py): 1024 keys a loop step (the table reads are
# clamped to the row; keys past it masked). SmolLM2 w8a8 + bf16 KV, B = 1, ms, 256 ->
# 1024 keys: context 128 21.5 -> 22.4, 512 ~24 -> 22.6, 900 28.1 -> 23.3, 2000 34.4 ->
# 30.9; 2048 keys: 29-31 from 512 to 2000 (benchmarks/README.md, fifteenth session). The
# AMD (AVX2) keeps 256: not measured past it there.
DECODE_SOLO_BLOCK_K = 1024
# keys per step of the shared-prefix pass: 512 for up to SHARED_SMALL_ROWS query rows
# (decode steps), else 256 (the score block is rows x keys). SmolLM2 w8a8 decode, 800
# shared keys: 512 vs 256 B = 32 175 vs 208 ms/step, B = 8 within noise
# (benchmarks/README.md, shared-prefix attention)
SHARED_SMALL_ROWS, SHARED_SMALL_BLOCK_K, SHARED_BLOCK_K = 64, 512, 256
# Extend tiles of 64 query tokens, key blocks of 128 from the tile's first own key
# (with the tile's queries one [64 * G, Dh] matrix per KV head and bf16 operands beside a
# bf16 pool, 512-key blocks: 8 requests x 38 new tokens on 800 cached keys each 774 ->
# 734 ms, 4 x 200 on 600 1774 -> 1893: kept 128).
# SmolLM2 w8a8 prefill steps (min ms, alternating rounds, against 128 x 256 blocks at
# multiples of 256): 8 requests x 50 new tokens on an 800-token shared prefix 1737 ->
# 1363, a fresh 512-token prompt 1109 -> 1050, 512 tokens on 1536 cached 2199 -> 2227
# (benchmarks/README.md, thirteenth session).
EXTEND_BLOCK_Q = 64  # query tokens per extend tile
EXTEND_BLOCK_K = 128  # keys per extend loop step
DETERMINISTIC_BLOCK_K = 128  # keys per block in deterministic mode, decode and extend
assert all(TABLE_ALIGN % k == 0 for k in (DECODE_MAX_BLOCK_K, EXTEND_BLOCK_K,
                                        SHARED_SMALL_BLOCK_K, SHARED_BLOCK_K,
                                        DETERMINISTIC_BLOCK_K))


def decode_block_k(batch: int) -> int:
    """Keys per decode loop step for a batch of `batch` requests: a power of two in
    [DECODE_MIN_BLOCK_K, DECODE_MAX_BLOCK_K], about DECODE_BLOCK_ROWS / batch
    (DECODE_SOLO_BLOCK_K for one request on a CPU with AMX)."""
    if batch == 1 and cpu.has_amx():
        return DECODE_SOLO_BLOCK_K
    k = DECODE_MAX_BLOCK_K
    while k > DECODE_MIN_BLOCK_K and batch * k > DECODE_BLOCK_ROWS:
        k //= 2
    return k


def _softmax_update(carry: tuple, s: jax.Array,
                    pv: Callable[[jax.Array], jax.Array], fixed_order: bool = False) -> tuple:
    """One online-softmax step. s: scores [..., K] (masked entries = MASK_VALUE);
    carry (m [...], denom [...], acc [..., Dh]); pv: p [..., K] -> its product with the
    block's values [..., Dh]; fixed_order: the denominator's sum by halving (row_sum, the
    same bits whatever s's leading shape) instead of XLA's reduction.
    A block with every key masked leaves the carry as it was, exactly (p = 0, alpha = 1),
    or, before any unmasked key, adds terms that the first real block multiplies by
    alpha = 0: so where a loop's blocks start does not change a row's bits, while they
    sit at the same positions."""
    m, denom, acc = carry
    m_new = jnp.maximum(m, s.max(axis=-1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[..., None])
    denom = denom * alpha + (row_sum(p)[..., 0] if fixed_order else p.sum(axis=-1))
    acc = acc * alpha[..., None] + pv(p)
    return m_new, denom, acc


def _softmax_step(carry: tuple, s: jax.Array, v: jax.Array, pv: str,
                  dot_dtype: jnp.dtype = jnp.float32, fixed_order: bool = False) -> tuple:
    """_softmax_update with pv the einsum `pv` of p and v (operands in dot_dtype)."""
    return _softmax_update(carry, s, lambda p: einsum_in(dot_dtype, pv, p, v), fixed_order)


def gather_rows(pool: jax.Array, slots: jax.Array, flat: bool = False,
                keep_bf16: bool = False) -> jax.Array:
    """pool [N, Hkv, Dh] (f32 or bf16 bits), slots [...] -> [..., Hkv, Dh] f32
    ([..., Hkv * Dh] if flat); keep_bf16: a bf16 pool's rows as bf16 (its bits as they
    are, for a product with bf16 operands).
    Gathered as whole rows of a [N, Hkv * Dh] view: XLA's CPU gather alone ran ~4x faster
    that way than over [N, Hkv, Dh] (8 vs 2 GB/s, 4k scattered slots)."""
    n, num_kv_heads, head_dim = pool.shape
    rows = pool.reshape(n, num_kv_heads * head_dim)[slots]
    if keep_bf16 and pool.dtype == BF16_BITS:
        rows = lax.bitcast_convert_type(rows, jnp.bfloat16)
    else:
        rows = from_pool(rows)
    return rows if flat else rows.reshape(*slots.shape, num_kv_heads, head_dim)


def _init(shape: tuple[int, ...], head_dim: int) -> tuple:
    return (jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros((*shape, head_dim), jnp.float32))


def _finish(carry: tuple) -> jax.Array:
    _, denom, acc = carry
    return acc / jnp.maximum(denom, 1e-30)[..., None]  # 0: no key was read (unused row)


# slots [BK] (with layer_base) -> (k [BK, Hkv, Dk], v [BK, Hkv, Dv]) f32: one key block
KeySource = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


def pool_keys(k_pool: jax.Array, v_pool: jax.Array) -> KeySource:
    return lambda slots: (gather_rows(k_pool, slots), gather_rows(v_pool, slots))


def shared_prefix_pass(q: jax.Array, keys: KeySource, v_dim: int, md: AttentionMetadata,
                       prefix_len: jax.Array, q_pos: jax.Array, window: int | None,
                       dot_dtype: jnp.dtype = jnp.float32,
                       soft_cap: float | None = None) -> tuple:
    """The step's shared prefix (md.shared_len), read once for every query row that has
    it: q [R, Hkv, G, Dk] (scaled), prefix_len [R] (the row's keys 0 .. prefix_len-1 are
    the prefix; 0: none), q_pos [R] (the row's position, for the window) -> the online
    softmax carry (m [R, Hkv, G], denom [R, Hkv, G], acc [R, Hkv, G, Dv]) over those
    keys: per KV head one GEMM per key block, [R * G, Dk] x [Dk, BK] (operands in
    dot_dtype, f32 sums)."""
    rows, num_kv_heads, group, head_dim = q.shape
    if md.shared_len is None:  # nothing shared: no pass in the program
        return _init((rows, num_kv_heads, group), v_dim)
    block_k = SHARED_SMALL_BLOCK_K if rows <= SHARED_SMALL_ROWS else SHARED_BLOCK_K
    qh = q.transpose(1, 0, 2, 3).reshape(num_kv_heads, rows * group, head_dim)
    table_row = md.req_row[jnp.argmax(md.shared_len)]  # every sharer's row holds it

    def body(j: jax.Array, carry: tuple) -> tuple:
        cols = j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
        k, v = keys(md.req_to_token[table_row, cols] + md.layer_base)  # [BK, Hkv, D]
        s = einsum_in(dot_dtype, "hqd,khd->hqk", qh, k).reshape(num_kv_heads, rows, group, -1)
        valid = cols[None, :] < prefix_len[:, None]  # [R, BK]
        if window is not None:
            valid &= cols[None, :] > q_pos[:, None] - window
        s = jnp.where(valid[None, :, None, :], soft_capped(s, soft_cap),
                      MASK_VALUE)  # [Hkv, R, G, BK]
        return _softmax_step(carry, s, v, "hrgk,khd->hrgd", dot_dtype)

    hi = (jnp.max(prefix_len) + block_k - 1) // block_k
    carry = lax.fori_loop(0, hi, body, _init((num_kv_heads, rows, group), v_dim))
    return tuple(x.swapaxes(0, 1) for x in carry)


def sharing(md: AttentionMetadata) -> AttentionMetadata:
    """md as a backend reads it: no shared prefix in programs of fewer than
    SHARED_PREFIX_MIN_BATCH requests (the host never shares there; no pass compiled)."""
    return md._replace(shared_len=None) if md.q_len.shape[0] < SHARED_PREFIX_MIN_BATCH else md


def _shared_len(md: AttentionMetadata, rows: jax.Array) -> jax.Array:
    """[B] bool rows -> [B] each such request's shared prefix (0 elsewhere)."""
    return jnp.zeros_like(md.q_len) if md.shared_len is None else \
        jnp.where(rows, md.shared_len, 0)


BLOCK_DIAGONAL_MAX_KV_HEADS = 4  # decode: one GEMM over all KV heads up to this many
# Up to this many requests the block-diagonal scores take the key block as the GEMM's left
# operand ([BK, Hkv*Dh] x [Hkv*Dh, Hq]: BK rows instead of Hq): XLA's CPU GEMM gives the
# same bits either way (each output's bf16 / f32 products summed in the same order; so
# deterministic inference stays batch-invariant, tests/model/test_deterministic.py).
# SmolLM2 w8a16 + bf16 KV, 850 keys, medians of alternating rounds: B = 1 deterministic
# 14.3 -> 13.3 and 16.0 -> 15.1 ms, non-deterministic 14.1 -> 13.4; deterministic B = 8
# 46.9 -> 49.4, B = 16 88.5 -> 92.1 (the query kept left there; benchmarks/README.md).
KEYS_LEFT_MAX_BATCH = 1
# From this many requests decode scores its own keys with a multiply-and-sum loop fusion
# (no GEMM): whole SmolLM2 w8a8 steps at context 512, min ms against the block-diagonal
# (B <= 32) and per-head (B = 64) GEMMs: B = 16 143 -> 121, B = 32 254 -> 221, B = 64
# 527 -> 422; B = 8 75 -> 78 and B = 4 48 -> 46 (benchmarks/README.md, thirteenth session)
# (measured with SmolLM2's 3 query heads per KV head; groups past MULTIPLY_SUM_MAX_GROUP,
# e.g. MLA's latent pool read as one KV head, keep a GEMM form)
MULTIPLY_SUM_MIN_BATCH, MULTIPLY_SUM_MAX_GROUP = 16, 4


def decode_form(num_kv_heads: int, group: int, batch: int, deterministic: bool = False) -> str:
    """How a decode step of `batch` requests scores each request's own keys:
    "multiply_sum" from MULTIPLY_SUM_MIN_BATCH requests (up to MULTIPLY_SUM_MAX_GROUP
    query heads per KV head; not in deterministic mode: one form at every B), else
    "block_diagonal" up to BLOCK_DIAGONAL_MAX_KV_HEADS KV heads, else "per_head"
    (batched GEMMs per KV head)."""
    if batch >= MULTIPLY_SUM_MIN_BATCH and group <= MULTIPLY_SUM_MAX_GROUP \
            and not deterministic:
        return "multiply_sum"
    return "block_diagonal" if num_kv_heads <= BLOCK_DIAGONAL_MAX_KV_HEADS else "per_head"


def decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                     md: AttentionMetadata, window: int | None,
                     prefix: tuple | None = None, deterministic: bool = False,
                     soft_cap: float | None = None) -> jax.Array:
    """q [T, Hq, Dh] (scaled) -> [B, Hq, Dh]: each q_len == 1 request's one token over
    its keys: the shared prefix's once for all (shared_prefix_pass; prefix: its carry
    for each request's token, [B, Hkv, G(, Dh)], if the caller ran it), then each
    request's own from where its prefix ends, in blocks of decode_block_k(B) keys; other
    rows are garbage.

    The own keys' scores take one of three forms (decode_form). Large batches: a
    multiply-and-sum over each key block, which XLA fuses with the gathers into loops
    (no GEMM). Fewer requests and few KV heads: the keys are not split per head; every
    query head scores the whole gathered row [Hkv * Dh] against a block-diagonal query
    (zero outside its own KV head), so each block is two plain batched GEMMs (beside a
    bf16 pool with the rows as bf16 operands: B = 8 over 800 shared + 1500 own keys 96
    -> 79 ms a SmolLM2 w8a8 step),
    [Hq, Hkv*Dh] x [Hkv*Dh, BK] and back; the Hkv-fold wasted products cost less than
    XLA's CPU dot over tiny per-head batches (SmolLM2, Hkv = 3: 2.5x faster per layer at
    4k keys, benchmarks/README.md). Otherwise batched GEMMs per KV head.

    deterministic (deterministic_attention; prefix unused): a row's bits do not depend on
    B or its batch-mates: blocks of DETERMINISTIC_BLOCK_K keys at multiples of it (the
    loop starts at the block holding the batch's earliest own key: the blocks before it
    are masked for every row, see _softmax_update), one form at every B, the denominators
    summed by halving; a shared prefix's whole blocks first, one GEMM for all rows
    (_deterministic_shared_blocks). XLA's CPU GEMMs give a row the same bits at any B
    (tests/model/test_deterministic.py)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_q_heads // num_kv_heads
    b = md.q_len.shape[0]
    block_k = DETERMINISTIC_BLOCK_K if deterministic else decode_block_k(b)
    is_decode = md.q_len == 1
    kv_len = jnp.where(is_decode, md.kv_len, 0)  # [B]
    shared = _shared_len(md, is_decode)  # [B]
    qd = q[jnp.clip(md.q_start, 0, num_tokens - 1)].reshape(b, num_kv_heads, group, head_dim)
    if deterministic:  # its own shared blocks below
        prefix = _init((b, num_kv_heads, group), head_dim)
    elif prefix is None:
        prefix = shared_prefix_pass(qd, pool_keys(k_pool, v_pool), head_dim, md, shared,
                                    kv_len - 1, window, soft_cap=soft_cap)
    m, denom, acc = prefix
    form = decode_form(num_kv_heads, group, b, deterministic)
    block_diagonal = form == "block_diagonal"
    if block_diagonal:
        eye = jnp.eye(num_kv_heads, dtype=jnp.float32)[:, None, :, None]  # [Hkv, 1, Hkv, 1]
        width = num_kv_heads * head_dim
        # [B, Hq, Hkv * Dh]: query head (h, g) is zero outside KV head h's columns
        qbd = (eye * qd[:, :, :, None, :]).reshape(b, num_q_heads, width)
        # the carry in the same form: acc zero outside its own head's columns
        acc = (eye * acc[:, :, :, None, :]).reshape(b, num_q_heads, width)
        m, denom = m.reshape(b, num_q_heads), denom.reshape(b, num_q_heads)

    table_width = md.req_to_token.shape[1]

    def gather(slots: jax.Array) -> tuple[jax.Array, jax.Array]:
        """slots [..., BK] -> k, v [..., BK, Hkv * Dh] (block-diagonal; else [.., Hkv, Dh])"""
        if block_diagonal:
            return tuple(gather_rows(x, slots, flat=True, keep_bf16=True)
                         for x in (k_pool, v_pool))
        # (multiply-and-sum in f32; the GEMM forms take bf16 rows)
        return tuple(gather_rows(x, slots, keep_bf16=form != "multiply_sum")
                     for x in (k_pool, v_pool))

    def attend(carry: tuple, k: jax.Array, v: jax.Array, valid: jax.Array) -> tuple:
        """One block: k, v [B, BK, ..] (gather's; or [BK, ..], the same keys for every
        request: one GEMM over all B), valid [B, BK]."""
        b_ = "b" if k.ndim == 3 + (not block_diagonal) else ""
        if block_diagonal:
            if b <= KEYS_LEFT_MAX_BATCH:  # the block [BK, ..] as the left operand
                s = einsum_in(k.dtype, f"{b_}kc,bqc->bqk", k, qbd)  # (the same bits)
            else:
                s = einsum_in(k.dtype, f"bqc,{b_}kc->bqk", qbd, k)  # [B, Hq, BK]
            s = jnp.where(valid[:, None, :], soft_capped(s, soft_cap), MASK_VALUE)
            return _softmax_step(carry, s, v, f"bqk,{b_}kc->bqc", k.dtype,  # [B, Hq, Hkv * Dh]
                                 deterministic)
        if form == "multiply_sum":
            s = jnp.sum(qd[:, None] * k[:, :, :, None, :], axis=-1)  # [B, BK, Hkv, G]
            s = jnp.where(valid[:, :, None, None], soft_capped(s, soft_cap),
                          MASK_VALUE).transpose(0, 2, 3, 1)
            # p [B, Hkv, G, BK] -> [B, Hkv, G, Dh]
            return _softmax_update(carry, s, lambda p: jnp.sum(
                p.transpose(0, 3, 1, 2)[..., None] * v[:, :, :, None, :], axis=1))
        s = einsum_in(k.dtype, f"bhgd,{b_}khd->bhgk", qd, k)  # [B, Hkv, G, BK]
        s = jnp.where(valid[:, None, None, :], soft_capped(s, soft_cap), MASK_VALUE)
        return _softmax_step(carry, s, v, f"bhgk,{b_}khd->bhgd", k.dtype, deterministic)

    def body(j: jax.Array, carry: tuple) -> tuple:
        cols = start + j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
        table_cols = jnp.minimum(cols, table_width - 1)[None, :]  # past the row: masked below
        slots = md.req_to_token[md.req_row[:, None], table_cols] + md.layer_base  # [B, BK]
        valid = (cols[None, :] >= shared[:, None]) & (cols[None, :] < kv_len[:, None])
        if window is not None:
            valid &= cols[None, :] >= kv_len[:, None] - window
        return attend(carry, *gather(slots), valid)

    if deterministic and md.shared_len is not None:
        m, denom, acc, shared = _deterministic_shared_blocks(
            (m, denom, acc), md, shared, kv_len, window, block_k, gather, attend)
    # each request's first own key (past its shared prefix and its window's start); the
    # blocks start at the earliest of them, not at a multiple of block_k
    first = shared if window is None else jnp.maximum(shared, kv_len - window)
    start = jnp.min(jnp.where(is_decode, first, jnp.iinfo(jnp.int32).max))
    start = jnp.minimum(start, jnp.max(kv_len))
    if deterministic:
        start = start // block_k * block_k
    steps = (jnp.max(kv_len) - start + block_k - 1) // block_k
    out = _finish(lax.fori_loop(0, steps, body, (m, denom, acc)))
    if block_diagonal:
        out = out.reshape(b, num_kv_heads, group, num_kv_heads, head_dim)
        out = (out * eye).sum(axis=3)  # own head's block
    return out.reshape(b, num_q_heads, head_dim)


def _deterministic_shared_blocks(carry: tuple, md: AttentionMetadata, shared: jax.Array,
                                 kv_len: jax.Array, window: int | None, block_k: int,
                                 gather: Callable, attend: Callable) -> tuple:
    """Deterministic decode's part of the step's shared prefix: its whole blocks of
    block_k keys, each gathered once from one sharer's row, its products one GEMM over
    every request's rows (rows without the prefix masked) -> (m, denom, acc, each
    request's keys left to read from: the first key past its whole shared blocks [B]).
    XLA's CPU GEMM gives a row the same bits as the batched product of the request's
    own blocks (tests/model/test_deterministic.py)."""
    whole = shared // block_k * block_k  # [B]
    row = md.req_row[jnp.argmax(whole)]  # every sharer's row holds the prefix

    def body(j: jax.Array, carry: tuple) -> tuple:
        cols = j * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
        k, v = gather(md.req_to_token[row, cols] + md.layer_base)  # [BK, ..]
        valid = cols[None, :] < whole[:, None]  # [B, BK]
        if window is not None:
            valid &= cols[None, :] >= kv_len[:, None] - window
        return attend(carry, k, v, valid)

    return (*lax.fori_loop(0, jnp.max(whole) // block_k, body, carry), whole)


def extend_attention(q: jax.Array, keys: KeySource, num_kv_heads: int, v_dim: int,
                     md: AttentionMetadata, window: int | None, block_q: int, block_k: int,
                     min_q_len: int = 2, prefix: tuple | None = None,
                     new_kv: tuple[jax.Array, jax.Array] | None = None,
                     dot_dtype: jnp.dtype = jnp.float32,
                     soft_cap: float | None = None) -> jax.Array:
    """q [T, Hq, Dk] (scaled) -> [T, Hq, Dv]: the tokens of requests with
    q_len >= min_q_len; other rows are garbage. The shared prefix (cached, so visible to
    every new token of its requests) first, for all tokens at once (shared_prefix_pass;
    prefix: its carry per token, [T, Hkv, G(, Dv)], if the caller ran it); then requests
    go in packed order, each tile of BQ tokens a loop over its request's other keys.
    new_kv: the step's new keys and values as the pool keeps them ([T, Hkv, Dk],
    [T, Hkv, Dv]): the tokens attend over them in one triangle of blocks
    (model/new_keys.py) and the loop reads only the cached keys, skipping requests that
    have none past the shared prefix (a fresh prompt: no loop step at all); dot_dtype:
    that triangle's product operands."""
    num_tokens, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    b = md.q_len.shape[0]
    is_extend = md.q_len >= min_q_len
    shared = _shared_len(md, is_extend)  # [B]
    q4 = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    if prefix is None:
        prefix = shared_prefix_pass(q4, keys, v_dim, md, shared[md.token_req], md.positions,
                                    window, soft_cap=soft_cap)
    # [Hkv, T + BQ, G(, Dv)]: the extend tiles' layout; a tile never runs off the end
    init = tuple(jnp.pad(jnp.moveaxis(x, 0, 1), [(0, 0), (0, block_q)]
                         + [(0, 0)] * (x.ndim - 2)) for x in prefix)
    # [Hkv, T + BQ, G, Dk]: a tile's queries are one [BQ * G, Dk] matrix per KV head
    qp = jnp.pad(q4, ((0, block_q), (0, 0), (0, 0), (0, 0))).transpose(1, 0, 2, 3)
    (ids,) = jnp.nonzero(is_extend, size=b, fill_value=0)  # extend requests, in order
    table_width = md.req_to_token.shape[1]

    def per_request(i: jax.Array, carry: tuple) -> tuple:
        r = ids[i]
        start, n, kv_len, row = md.q_start[r], md.q_len[r], md.kv_len[r], md.req_row[r]
        first_pos = kv_len - n
        own_end = kv_len if new_kv is None else first_pos  # keys the loop reads: < this

        def per_tile(qb: jax.Array, carry: tuple) -> tuple:
            off = start + qb * block_q
            qt = lax.dynamic_slice_in_dim(qp, off, block_q, axis=1).reshape(
                num_kv_heads, block_q * group, head_dim)  # [Hkv, BQ * G, Dk]
            q_pos = first_pos + qb * block_q + jnp.arange(block_q, dtype=jnp.int32)
            end = jnp.minimum(q_pos[-1] + 1, own_end)  # keys the tile reads: < end
            # its first own key (past the shared prefix and the window's start): the
            # blocks start there, not at a multiple of block_k
            first = shared[r]
            if window is not None:
                first = jnp.maximum(first, q_pos[0] - window + 1)
            first = jnp.minimum(first, end)

            def body(j: jax.Array, carry: tuple) -> tuple:
                col = first + j * block_k  # the block's first key
                at = jnp.minimum(col, table_width - block_k)  # the slice stays in the row
                k_pos = at + jnp.arange(block_k, dtype=jnp.int32)  # [BK]
                slots = lax.dynamic_slice(md.req_to_token, (row, at),
                                          (1, block_k))[0] + md.layer_base
                k, v = keys(slots)  # [BK, Hkv, Dk], [BK, Hkv, Dv]
                s = einsum_in(dot_dtype, "hqd,khd->hqk", qt, k).reshape(
                    num_kv_heads, block_q, group, block_k)  # [Hkv, BQ, G, BK]
                valid = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < end)
                valid &= k_pos[None, :] >= col  # (a block moved back: keys read before)
                if window is not None:
                    valid &= k_pos[None, :] > q_pos[:, None] - window
                s = jnp.where(valid[None, :, None, :], soft_capped(s, soft_cap), MASK_VALUE)
                return _softmax_step(carry, s, v, "hqgk,khd->hqgd", dot_dtype)

            tile = lax.fori_loop(0, (end - first + block_k - 1) // block_k, body,
                                 tuple(lax.dynamic_slice_in_dim(x, off, block_q, axis=1)
                                       for x in init))  # from the shared prefix's part
            mine = qb * block_q + jnp.arange(block_q) < n  # rows of this request
            return tuple(lax.dynamic_update_slice_in_dim(
                x, jnp.where(mine.reshape(-1, *[1] * (t.ndim - 2)), t,
                             lax.dynamic_slice_in_dim(x, off, block_q, axis=1)), off, axis=1)
                for x, t in zip(carry, tile, strict=True))

        tiles = (n + block_q - 1) // block_q
        if new_kv is not None:  # a request with nothing cached past the prefix: no tile
            tiles = jnp.where(first_pos > shared[r], tiles, 0)
        return lax.fori_loop(0, tiles, per_tile, carry)

    carry = lax.fori_loop(0, jnp.sum(is_extend), per_request, init)
    carry = tuple(jnp.moveaxis(x[:, :num_tokens], 1, 0) for x in carry)  # [T, Hkv, G..]
    if new_kv is not None:
        carry = new_keys.merge(carry, new_keys.new_key_carry(
            q4, *new_kv, md.token_req, md.positions, window, dot_dtype, soft_cap=soft_cap))
    return _finish(carry).reshape(num_tokens, num_q_heads, v_dim)


def native_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    md: AttentionMetadata,
    window: int | None,
    scale: float,
    deterministic: bool = False,
    kernel: bool = False,
    soft_cap: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`AttentionBackend` contract (model/attention.py): blockwise, context-free shapes.
    deterministic: a token's result depends on its request alone (deterministic_attention).
    kernel: decode tokens through the CPU handler (model/cpu_decode.py; each request
    alone, so deterministic as it is), the rest as above. soft_cap: Gemma 2's logit cap
    on every score (attention.soft_capped; not with kernel: the handler has none)."""
    if kernel and soft_cap is not None:
        raise ValueError("the CPU decode handler has no logit soft cap")
    k_pool, v_pool = write_kv(k_pool, v_pool, k_new, v_new, md.out_slots + md.layer_base)
    q = q * scale
    if deterministic:
        return (deterministic_attention(q, k_pool, v_pool, md, window, kernel, soft_cap),
                k_pool, v_pool)
    md = sharing(md)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    keys = pool_keys(k_pool, v_pool)
    # the products over a step's many query rows take bf16 operands beside a bf16 pool
    dot_dtype = jnp.bfloat16 if k_pool.dtype == BF16_BITS else jnp.float32
    new_kv = tuple(from_pool(to_pool(x, k_pool.dtype)) for x in (k_new, v_new))  # as kept
    q4 = q.reshape(num_tokens, num_kv_heads, num_q_heads // num_kv_heads, head_dim)

    def prefix_pass(rows: jax.Array) -> tuple:
        """the shared-prefix pass for the tokens of these requests ([B] bool)"""
        return shared_prefix_pass(q4, keys, head_dim, md, _shared_len(md, rows)[md.token_req],
                                  md.positions, window, dot_dtype, soft_cap)

    def extend(prefix: tuple) -> jax.Array:
        return extend_attention(q, keys, num_kv_heads, v_pool.shape[2], md, window,
                                EXTEND_BLOCK_Q, EXTEND_BLOCK_K, prefix=prefix, new_kv=new_kv,
                                dot_dtype=dot_dtype, soft_cap=soft_cap)

    if kernel:  # decode tokens alone in the handler; the prompts' pass only for them
        dec = kernel_decode(q, k_pool, v_pool, md, window)
        ext = _if_extending(md, lambda: extend(prefix_pass(md.q_len > 1)),
                            (num_tokens, num_q_heads, v_pool.shape[2]))
    else:  # one shared-prefix pass for every token, decode or extend (one loop)
        prefix = prefix_pass(md.q_len > 0)
        rows = jnp.clip(md.q_start, 0, num_tokens - 1)  # each request's first token
        dec = decode_attention(q, k_pool, v_pool, md, window,
                               tuple(x[rows] for x in prefix),
                               soft_cap=soft_cap)  # [B, Hq, Dh]
        ext = extend(prefix)
    is_decode_token = (md.q_len == 1)[md.token_req]  # [T]
    out = jnp.where(is_decode_token[:, None, None], dec[md.token_req], ext)
    return out, k_pool, v_pool


def _if_extending(md: AttentionMetadata, fn: Callable[[], jax.Array],
                  shape: tuple[int, ...]) -> jax.Array:
    """fn() in a step with a prompt token (q_len > 1), else zeros of `shape`: a step of
    decodes alone skips the extend path's loops and their set-up (the queries padded
    and transposed, the carries built: ~1 ms of a ~10 ms SmolLM2 step at B = 1)."""
    return lax.cond(jnp.any(md.q_len > 1), fn, lambda: jnp.zeros(shape, jnp.float32))


def kernel_decode(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                  md: AttentionMetadata, window: int | None) -> jax.Array:
    """q [T, Hq, Dh] (scaled) -> [B, Hq, Dh]: decode_attention's result through the CPU
    handler (model/cpu_decode.py), each q_len == 1 request's token over its keys, alone
    (other rows zero)."""
    rows = jnp.clip(md.q_start, 0, q.shape[0] - 1)
    kv_len = jnp.where(md.q_len == 1, md.kv_len, 0)
    return cpu_decode.decode_attention(q[rows], k_pool, v_pool, md.req_to_token, md.req_row,
                                       kv_len, md.layer_base, window)


def kernel_tokens(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                  md: AttentionMetadata, window: int | None) -> jax.Array:
    """q [T, Hq, Dh] (scaled) -> [T, Hq, Dh]: every token of the step through the CPU
    handler (model/cpu_decode.py) as a row of its own over its request's keys up to its
    position (padding tokens zero): a prompt token's numbers are those it would have as a
    decode, so a prefix computed while decoding (a cached answer, a multi-turn history) or
    re-prefilled (a retraction) gives the same bits."""
    t = jnp.arange(q.shape[0], dtype=jnp.int32)
    req = md.token_req
    real = (t >= md.q_start[req]) & (t < md.q_start[req] + md.q_len[req])
    return cpu_decode.decode_attention(q, k_pool, v_pool, md.req_to_token, md.req_row[req],
                                       jnp.where(real, md.positions + 1, 0), md.layer_base,
                                       window)


def deterministic_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array,
                            md: AttentionMetadata, window: int | None,
                            kernel: bool = False, soft_cap: float | None = None) -> jax.Array:
    """q [T, Hq, Dh] (scaled; the step's K/V already in the pool) -> [T, Hq, Dv], each
    token's keys reduced in an order set by its request's positions alone (SGLang's
    deterministic inference, vLLM's batch invariance): every key in blocks of
    DETERMINISTIC_BLOCK_K at multiples of it from position 0, merged in order.
    Prompts (q_len > 1) go through extend_attention's per-request loop over the pool,
    whose body has the same shapes in every program: no shared-prefix pass and no
    triangle over the packed axis (their blocks move with the request's place in the
    step). Decode tokens go through decode_attention's batched loop in its deterministic
    form (one form and block size at every B, denominators summed by halving; the
    whole blocks of a shared prefix gathered once, one GEMM for all). With the rest of
    the step's batch-invariant parts (layers.row_sum in RMSNorm, layers.exact_products_sum
    in RoPE, w8a16 / W8A8's integer products) a prompt's numbers are the same bits alone
    or batched, in any token bucket, chunked or not, its prefix cached or not, and a
    decode token's whatever its batch and whether its batch shares a prefix
    (tests/model/test_deterministic.py). A 1-token extend is a decode here too. In
    this XLA form a token's bits as a decode and inside a prompt may differ (other
    products); kernel=True (kernel_tokens) runs every token the same way, so a
    re-prefilled answer (a retraction, a later turn whose history is not cached)
    continues as it would have."""
    if kernel:  # every token alone, a prompt's as a decode's: the same bits either way
        return kernel_tokens(q, k_pool, v_pool, md, window)
    num_kv_heads = k_pool.shape[1]
    keys = pool_keys(k_pool, v_pool)
    dot_dtype = jnp.bfloat16 if k_pool.dtype == BF16_BITS else jnp.float32
    is_decode = md.q_len == 1
    dec = decode_attention(q, k_pool, v_pool, sharing(md), window,
                           deterministic=True, soft_cap=soft_cap)  # [B, Hq, Dv]
    ext = _if_extending(md, lambda: extend_attention(
        q, keys, num_kv_heads, v_pool.shape[2],
        md._replace(q_len=jnp.where(is_decode, 0, md.q_len), shared_len=None), window,
        EXTEND_BLOCK_Q, DETERMINISTIC_BLOCK_K, min_q_len=1, dot_dtype=dot_dtype,
        soft_cap=soft_cap),
        (q.shape[0], q.shape[1], v_pool.shape[2]))
    return jnp.where(is_decode[md.token_req][:, None, None], dec[md.token_req], ext)
