"""x @ W.T with W a GGUF matrix held as its planes (gguf_planes.py): a Pallas kernel
(Triton backend) that dequantizes each group of W where it multiplies, so a GPU holds the
file's bits (4.5-8.5 a weight), never a float copy of the matrix.

Grid (M / BM, N / BN): program (i, j) owns out[i*BM:(i+1)*BM, j*BN:(j+1)*BN] and walks
K a group at a time (32 values; Q6_K 16): the group's codes ([BN, G], one load, a shift
and a mask), its scales ([BN, 1]) -> w [BN, G] in f32 as the gguf package computes it,
cast to the activations' dtype, one dot [BM, G] x [G, BN] accumulated in f32. The
weights' f32 values are exact; a bf16 x rounds them to bf16 in the dot (what a bf16
model's weights are anyway); an f32 x multiplies them in IEEE f32.

The planes are padded to a multiple of BN rows (pad_rows) once, when put on the device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.compat import dot, resolve_interpret, triton_params
from pallas_kernels.gguf_planes import Form, Planes

BLOCK_N = 64  # output columns (weight rows) a program owns
MAX_BLOCK_M = 64  # activation rows a program owns (tl.dot: at least 16)


def pad_rows(p: Planes, multiple: int = BLOCK_N) -> Planes:
    """Rows padded with zero planes (zero weights) to a multiple of `multiple`; n stays
    the real row count."""
    extra = -p.n % multiple

    def pad(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.pad(a, ((0, extra), (0, 0)))

    return Planes(p.form, p.n, p.k, pad(p.codes), pad(p.hi), pad(p.d), pad(p.s), pad(p.dm),
                  pad(p.mn))


def _kernel(x_ref, codes_ref, hi_ref, d_ref, s_ref, dm_ref, mn_ref, o_ref, *, bits: int,
            group: int, per_sblock: int, off: int, num_groups: int, block_m: int,
            block_n: int):
    # x_ref [Mp, K]; codes_ref [Np, K or K / 2] u8; hi_ref [Np, K / 4] u8; d_ref, dm_ref
    # [Np, K / sblock] f16; s_ref, mn_ref [Np, K / G] i8 (absent refs: None);
    # o_ref [BM, BN] f32
    rows = pl.ds(pl.program_id(0) * block_m, block_m)
    cols = pl.ds(pl.program_id(1) * block_n, block_n)

    def body(g, acc):  # g: the group (>= 0: bit operations pick its place); acc [BM, BN]
        xg = x_ref[rows, pl.ds(g * group, group)]  # [BM, G]
        if bits == 8:
            code = codes_ref[cols, pl.ds(g * group, group)].astype(jnp.int32)
        else:
            nib = codes_ref[cols, pl.ds((g >> 1) * group, group)].astype(jnp.int32)
            code = (nib >> (4 * (g & 1))) & 15  # [BN, G]
            if bits > 4:
                hb = hi_ref[cols, pl.ds((g >> 2) * group, group)].astype(jnp.int32)
                code = code | (((hb >> (2 * (g & 3))) & 3) << 4)
        sb = pl.ds(lax.div(g, per_sblock), 1)
        scale = d_ref[cols, sb].astype(jnp.float32)  # [BN, 1]
        if s_ref is not None:
            scale = scale * s_ref[cols, pl.ds(g, 1)].astype(jnp.float32)
        w = scale * (code - off).astype(jnp.float32)  # [BN, G]
        if dm_ref is not None:
            mins = dm_ref[cols, sb].astype(jnp.float32)
            if mn_ref is not None:
                mins = mins * mn_ref[cols, pl.ds(g, 1)].astype(jnp.float32)
            w = w + mins
        return acc + dot(xg, w.astype(xg.dtype), trans_b=True)

    o_ref[...] = lax.fori_loop(0, num_groups, body,
                               jnp.zeros((block_m, block_n), jnp.float32))


def _block_m(m: int) -> int:
    """Activation rows a program owns: a power of two in [16, MAX_BLOCK_M]."""
    return max(16, min(MAX_BLOCK_M, 1 << max(0, (m - 1).bit_length())))


@functools.partial(jax.jit, static_argnames=("form", "n", "k", "interpret"))
def _matmul(x, codes, hi, d, s, dm, mn, *, form: Form, n: int, k: int,
            interpret: bool | None) -> jax.Array:
    m = x.shape[0]
    block_m = _block_m(m)
    mp, np_ = -(-m // block_m) * block_m, codes.shape[0]
    if np_ % BLOCK_N:
        raise ValueError(f"planes of {np_} rows: pad them to a multiple of {BLOCK_N} "
                         "(pad_rows)")
    xp = jnp.pad(x, ((0, mp - m), (0, 0)))
    operands = (xp, codes, hi, d, s, dm, mn)
    present = [a for a in operands if a is not None]
    kernel = functools.partial(
        _kernel, bits=form.bits, group=form.group, per_sblock=form.sblock // form.group,
        off=form.off, num_groups=k // form.group, block_m=block_m, block_n=BLOCK_N)

    def with_absent(*refs):  # the kernel takes None for an absent plane
        it = iter(refs[:-1])
        return kernel(*[None if a is None else next(it) for a in operands], refs[-1])

    out = pl.pallas_call(
        with_absent,
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        grid=(mp // block_m, np_ // BLOCK_N),
        out_specs=pl.BlockSpec((block_m, BLOCK_N), lambda i, j: (i, j)),
        compiler_params=triton_params(num_warps=4, num_stages=2),
        interpret=resolve_interpret(interpret),
        name="gguf_matmul",
    )(*present)
    return out[:m, :n]


def gguf_matmul(x: jax.Array, p: Planes, *, interpret: bool | None = None) -> jax.Array:
    """x [M, K] (f32 or bf16) times the matrix p [N, K] (planes on the device, rows padded
    by pad_rows) -> [M, N] f32."""
    if x.ndim != 2 or x.shape[1] != p.k:
        raise ValueError(f"x must be [M, {p.k}], got {x.shape}")
    return _matmul(x, p.codes, p.hi, p.d, p.s, p.dm, p.mn, form=p.form, n=p.n, k=p.k,
                   interpret=interpret)
