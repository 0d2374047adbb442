"""The gguf form on a GPU: a GGUF file's matrices held as planes of their blocks
(pallas_kernels/gguf_planes.py: 4.6-8.5 bits a weight) and multiplied by a Pallas
kernel that dequantizes each group where it multiplies (pallas_kernels/gguf_matmul.py),
so the GPU never holds a float copy of a quantized matrix. The CPU's form of the same
idea is model/gguf_blocks.py (tiles for its VNNI handler); gguf_blocks' functions hand
a PlanesWeight here.

    PlanesWeight(segments): one Planes per part of a fused matrix (q | k | v), rows
        padded to the kernel's BLOCK_N; a stack of layers' has a leading layer axis on
        every plane (the scan slices it), each segment in one form for the whole stack
        (gguf_planes.common_form: Q4_K_M's Q4_K and Q6_K layers of ffn_down share one).
    planes_linear(x [T, K], w) -> [T, N] f32
    planes_rows(ids [T], w) -> [T, K] f32 (the embedding's gather: the gguf package's
        values)

On a machine without a GPU the kernel runs interpreted (tests: tiny models only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.gguf_matmul import gguf_matmul, pad_rows
from pallas_kernels.gguf_planes import (
    FORMS,
    Planes,
    common_form,
    dequantize,
    fits,
    to_form,
    to_planes,
)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PlanesWeight:
    """A matrix [N, K] (out, in) as planes, one Planes per fused part. interpret: how the
    kernel runs (None: compiled on a GPU, interpreted elsewhere; False: compiled, e.g.
    to lower for CUDA on a machine without one)."""

    segments: tuple[Planes, ...]
    interpret: bool | None = field(default=None, metadata={"static": True})

    @property
    def rows(self) -> tuple[int, ...]:
        return tuple(p.n for p in self.segments)

    @property
    def n(self) -> int:
        return sum(self.rows)

    @property
    def k(self) -> int:
        return self.segments[0].k


def has_planes(qtype: int, k: int) -> bool:
    """Whether a [N, k] matrix of GGML type qtype has planes (and the kernel a form)."""
    return qtype in FORMS and fits(FORMS[qtype], k)


def from_blocks(raw: np.ndarray, qtype: int, k: int) -> PlanesWeight:
    """One GGUF matrix's rows (raw [N, row_bytes] u8) -> a PlanesWeight on the host."""
    return PlanesWeight((to_planes(raw, qtype, k),))


def concat(parts: list[PlanesWeight]) -> PlanesWeight:
    """Matrices of one K (q, k, v) -> one, their segments in order."""
    return PlanesWeight(tuple(p for w in parts for p in w.segments), parts[0].interpret)


def _on_device(p: Planes) -> Planes:
    return jax.tree.map(jnp.asarray, p)


def to_device(w: PlanesWeight) -> PlanesWeight:
    return PlanesWeight(tuple(_on_device(pad_rows(p)) for p in w.segments), w.interpret)


def stack(layers: list[PlanesWeight]) -> PlanesWeight:
    """One matrix per layer of a group -> each segment's planes stacked [n, ...] on the
    device, in one form for all the layers."""
    segments = []
    for i in range(len(layers[0].segments)):
        parts = [pad_rows(w.segments[i]) for w in layers]
        form = common_form([p.form for p in parts])
        parts = [to_form(p, form) for p in parts]
        segments.append(jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *parts))
    return PlanesWeight(tuple(segments), layers[0].interpret)


def planes_linear(x: jax.Array, w: PlanesWeight) -> jax.Array:
    """x [T, K] -> x @ w.T [T, N] f32 (one layer's planes)."""
    outs = [gguf_matmul(x, p, interpret=w.interpret) for p in w.segments]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def planes_rows(ids: jax.Array, w: PlanesWeight) -> jax.Array:
    """ids [T] int32 -> rows [T, K] f32 of w (one segment), the gguf package's values."""
    (p,) = w.segments
    rows = (None if a is None else a[ids] for a in (p.codes, p.hi, p.d, p.s, p.dm, p.mn))
    return dequantize(Planes(p.form, ids.shape[0], p.k, *rows), xp=jnp)
