"""How the layer scan stores and multiplies the dense layer matrices.

Checkpoints load as w [I, O] (`x @ w`). For the scan, `layer_stack.stack_layers` stores
each of them transposed, as `OutIn(wt [n, O, I])`, and `layers.linear` multiplies
`x @ wt.T`, with the rows of a small step (T <= ROWS_MAX) as separate vector products:

    x [T, I] f32, wt [O, I]  ->  [x[t] @ wt.T for t < T]  (T <= 8)  |  x @ wt.T  ->  [T, O]

Why (benchmarks/README.md, "Dense weights stored (out, in)"): inside the scan each layer's
weight is a dynamic slice of the stacked array, and XLA's CPU backend copies that slice
before a dot (a read and a write of every weight byte, every step). A vector times the
transpose of the slice is instead emitted as one loop fusion that reads the stacked
weight in place (per row: the later rows find the weight in cache). SmolLM2 decode
B = 1 ~57 -> ~32 ms, B = 2 and 4 ~1.5x faster, B = 8 ~1.25x; at B = 16 a vector product
per row lost to the GEMM (1.6x slower for one matrix), which the transposed storage also
made ~1.1-1.3x faster (its copy is of the transpose). `x @ w` on (in, out) storage, or a
`dot_general` contracting the stored weight's last axis, keeps the copy. On a GPU, XLA
folds the transpose into its GEMM (not measured: no GPU in the session that made this).
That was an AMD EPYC (AVX2). On an Intel Xeon with AMX (model/cpu.py) XLA's GEMM, slice
copy included, beats the vector products from two rows: SmolLM2 f32 decode B = 2 66.5 ->
52.9 ms, B = 4 97.8 -> 63.0, B = 8 180.2 -> 94.5 (B = 1 the same form either way), so
there only one row multiplies as a vector product (rows_max).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from radixjax.model import cpu

# The matrices the forward runs through `layers.linear`: attention projections, dense and
# shared-expert MLPs, MLA's down-projections (not `wkv_b`, absorbed into per-head
# products; not routers or routed experts).
LINEAR_WEIGHTS = frozenset({"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "wq_a",
                            "wq_b", "wkv_a", "ws_gate", "ws_up", "ws_down",
                            "wqkv", "w_gate_up"})
# Matrices that multiply the same input, one matrix [I, sum O] where the layer matrices
# are int8 (model/quant.py quantize_params: each output column has its own scale, so the
# fused product's numbers are the same; one oneDNN call instead of three or two): the
# fused name -> its parts, in column order. Their biases stay apart ("wq" -> "bq").
FUSED_WEIGHTS = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
ROWS_MAX = 8  # steps of up to this many tokens multiply row by row (AMX CPUs: one)


class OutIn(NamedTuple):
    """A dense weight stored transposed."""

    wt: jax.Array  # [O, I] ([n, O, I] stacked for the layer scan)


def rows_max() -> int:
    """Steps of up to this many tokens multiply row by row: ROWS_MAX, or 1 on a CPU with
    AMX (model/cpu.py)."""
    return 1 if cpu.has_amx() else ROWS_MAX


def out_in_linear(x: jax.Array, w: OutIn, rows: int | None = None) -> jax.Array:
    """x [T, I] f32 -> [T, O] f32 (in the weight's dtype, accumulated in f32): a vector
    product per row up to `rows` rows (None: rows_max()), else one GEMM."""
    x = x.astype(w.wt.dtype)
    if x.shape[0] <= (rows_max() if rows is None else rows):
        return jnp.stack([jnp.matmul(x[t], w.wt.T, preferred_element_type=jnp.float32)
                          for t in range(x.shape[0])])
    return jnp.matmul(x, w.wt.T, preferred_element_type=jnp.float32)
