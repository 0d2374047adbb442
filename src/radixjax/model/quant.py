"""W8A8 int8 (SGLang's `w8a8_int8`): the dense layer matrices stored as int8 with one
float32 scale per output column, each token's activations quantized to int8 with its own
scale as the step runs, the product accumulated in int32 and scaled back to f32. Norms,
embedding, attention and the KV pool stay as they were; the LM head also gets an int8
copy (weight-only, one scale per vocabulary row) for steps of one or two rows.

    w [I, O] f32  ->  Int8Weight(q [O, I] int8, scale [O] f32),  w ~= (q * scale[:, None]).T
    x [T, I] f32  ->  xq [T, I] int8, a [T, 1] = max|x[t]| / 127
    linear:  (xq @ q.T) [T, O] int32 * a * scale  ->  [T, O] f32

Why (benchmarks/README.md, model_step.py --quant): on the CPU a decode step streams every
weight once, and inside the layer scan XLA copies each layer's slice before its dot; the
int8 x int8 dot moves a quarter of the bytes through both and runs on XLA's int8 GEMM.
SmolLM2 decode B = 8 ~1.7x faster, B = 32 ~1.25x, B = 1 about the same, prefill ~0.85x;
served with 8 streams on one shared prompt 1.5x the f32 output rate. Logits within ~18 %
(max abs error / max abs logit), the same top token at ~84 % of positions: an opt-in,
off by default. Weight-only int8 (f32 activations, the weight converted in the program)
gained ~10 % for the layers and was not kept there. The LM head (`int8_head`): up to
HEAD_ROWS_MAX rows (AMX CPUs: none) multiplied row by row, weight-only (the int8 values
converted inside the vector product, as below; SmolLM2's head 1.5-2.5 vs 4.2 ms for one
row, 3.7 vs 6.5 ms for two, 14 vs 8 ms for eight: the head re-read per row); past that
the layers' int8 GEMM, one [N, D] x [D, V] product (jax 0.10.2: [8, 576] x [576, 49152]
4.6 vs 7.3 ms for the f32 head's vocab blocks, 16 rows 7.8 vs 9.4, 32 13.3 vs 14.0;
whole decode steps B = 4 / 8 ~7 % faster; a twelfth-session probe had the int8 GEMM 7x
slower). SmolLM2 logits within ~2.3 % (weight-only) and ~2.7 % (W8A8) of the f32 head's,
the same top tokens.

Which matrices: those the forward runs through `layers.linear`
(dense_weights.LINEAR_WEIGHTS). The product is XLA's int8 GEMM (`dot_general` on q [O, I]),
except for one token: XLA runs an int8 vector product in int32 on a converted copy of the
weight (SmolLM2 B = 1 ~69 ms), so T = 1 multiplies the int8 values as f32 in
model/dense_weights.py's in-place vector product (~38 ms; the same integer sums, exact in
f32 below 2^24). Per row at T = 2..8 that form ran slower than the int8 GEMM (whole steps,
B = 4 and 8 ~1.2x). The rounded activations stay f32 there (the same integers): XLA fuses
their rounding into the product's loop, and a round trip through int8 inside that loop
made SmolLM2's w8a8 B = 1 step 25 ms instead of 17 (benchmarks/README.md, W8A8 at B = 1).

That was an AMD EPYC with AVX2. On a CPU with AMX int8 tiles (an Intel Xeon of the
fifteenth session: YNNPACK's int8 GEMM there costs about the same from 1 to 64 rows, a
[M, 576] x [576, 3072] layer ~170 us at M = 4..8 against ~320 at M = 1 and ~510 for the
one-row vector product) one token's layer products go through the GEMM padded to
ONE_ROW_GEMM_ROWS rows instead (the same integer sums): SmolLM2 w8a8 B = 1 30 -> 24.5 ms
there (benchmarks/README.md, fifteenth session). The weight goes in as the left operand
of that GEMM ([O, I] x [4, I] -> [O, 4]): B = 1 22.3-22.6 -> 20.5-21.4 ms at context 512,
23.2-23.8 -> 22.0 at 900 (seventeenth session); from two rows the activations stay the
left operand (a 30-layer chain at M = 2..64: within the noise either way).

On a CPU with AVX-512 BF16 and no AMX (an AMD EPYC of the eighteenth to twentieth
sessions) XLA's int8 GEMM (YNNPACK, s8 x s8) ran 150-280 GOPS at 512 rows, its bf16 GEMM
with f32 sums 280-390 GFLOP/s on the same integer values: from BF16_GEMM_ROWS_MIN rows
(`bf16_gemm`) the product takes that form. The int8 values are exact in bf16, their
products exact in f32, and so are the sums below 2^24: always where I x 127^2 < 2^24
(I <= 1040), and for SmolLM2's down projection (I = 1536) unless a sum passes 16.7 M, then
rounded by 6e-8 of it. Whole steps are not bit-identical to the int8 GEMM's: XLA fuses the
rest of the program differently, and the activations' rounding to int8 amplifies f32
rounding differences, as between any two W8A8 programs (a 300-token prompt's top
logprob, int8 GEMM: -4.69 in the 512-token program, -4.25 in the 384; bf16 form -4.95 at
512; f32 weights -4.603 / -4.606). SmolLM2 w8a8 + bf16 KV prefill, min ms of 4 alternating rounds:
512 tokens 597 -> 518, 2048 3263 -> 3012, 256 296 -> 260, 128 164 -> 158; but 64 106 ->
115 and decode B = 8 / 16 38 -> 67 / 102 -> 120, so fewer rows keep the int8 GEMM
(benchmarks/README.md, twentieth session; oneDNN's int8 GEMM, torch._int_mm, ran ~830
GOPS on that CPU: the hardware allows more than XLA's forms reach).

So on the CPU backend, where model/onednn.py's handler is built (scripts/setup.sh), none
of the XLA forms above run: `quantize_params` packs each int8 matrix for oneDNN
(PackedInt8Weight) and every product, layers and head, from one row up, is oneDNN's int8
matmul on the same rounded activations (the same integer sums; the head then W8A8 from
one row). SmolLM2 w8a8 + bf16 KV, the AMD EPYC with AVX-512 VNNI (model_step.py
--onednn, twenty-first session): B = 1 14.2 -> 10.5 ms, B = 8 36.7 -> 29.9, B = 32 142.8
-> 115.5, prefill 512 1078 -> 1367 tok/s. The XLA forms stay for other backends, and as
the reference (RunnerConfig.onednn=False)."""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model import cpu, gguf_blocks, onednn
from radixjax.model.dense_weights import FUSED_WEIGHTS, LINEAR_WEIGHTS, OutIn, out_in_linear
from radixjax.model.forms import QUANTIZATIONS
from radixjax.model.params import Params

log = logging.getLogger(__name__)


class Int8Weight(NamedTuple):
    q: jax.Array  # [O, I] int8 ([n, O, I] stacked for the layer scan)
    scale: jax.Array  # [O] f32 ([n, O] stacked)


class A16Int8Weight(Int8Weight):
    """An Int8Weight whose products take the activations as two int8 parts (w8a16_int8)."""


class PackedInt8Weight(NamedTuple):
    """An Int8Weight's q packed for oneDNN's matmul (model/onednn.py), on the CPU backend
    where that is built. Inside the layer scan `packed` is the whole stack and `layer`
    the scanned layer's index in it: the product reads the layer in place (no slice)."""

    packed: jax.Array | None  # [parts, P] int8 ([n, parts, P] stacked); onednn.pack
    scale: jax.Array  # [O] f32 ([n, O] stacked)
    layer: jax.Array | None = None  # [] int32: which of packed's n (None: unstacked)


class A16PackedInt8Weight(PackedInt8Weight):
    """A PackedInt8Weight whose products take the activations as two int8 parts."""


def is_a16(w: Int8Weight | PackedInt8Weight) -> bool:
    """Whether w's products take the activations as two int8 parts (w8a16_int8)."""
    return isinstance(w, A16Int8Weight | A16PackedInt8Weight)


def pack_int8(w: Int8Weight) -> PackedInt8Weight:
    """w's int8 values (q [.., O, I]) packed for oneDNN (onednn.pack), its scale as it is;
    an A16Int8Weight gives an A16PackedInt8Weight."""
    kind = A16PackedInt8Weight if is_a16(w) else PackedInt8Weight
    return kind(jnp.asarray(onednn.pack(np.asarray(w.q))), w.scale)


@jax.jit
def quantize_int8(w: jax.Array) -> Int8Weight:
    """w [I, O] -> symmetric per-output-column int8 (round to nearest, |q| <= 127)."""
    wt = w.astype(jnp.float32).T  # [O, I]
    absmax = jnp.max(jnp.abs(wt), axis=1)  # [O]
    scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
    q = jnp.clip(jnp.round(wt / scale[:, None]), -127, 127).astype(jnp.int8)
    return Int8Weight(q, scale)


ONE_ROW_GEMM_ROWS = 4  # AMX CPUs: one token's product through the GEMM, padded this far
BF16_GEMM_ROWS_MIN = 128  # AVX-512 BF16 CPUs without AMX: from here the bf16 GEMM


def bf16_gemm(t: int) -> bool:
    """Whether T rows' product runs through the bf16 GEMM by default: on the CPU backend
    of a CPU with AVX-512 BF16 and no AMX (model/cpu.py), from BF16_GEMM_ROWS_MIN rows."""
    return (t >= BF16_GEMM_ROWS_MIN and jax.default_backend() == "cpu"
            and cpu.has_avx512_bf16() and not cpu.has_amx())


def int8_linear(x: jax.Array, w: Int8Weight | PackedInt8Weight,
                one_row_gemm: bool | None = None, as_bf16: bool | None = None) -> jax.Array:
    """x [T, I] f32 -> [T, O] f32, through int8 activations (one scale per token).
    A PackedInt8Weight: oneDNN's product for every T. An Int8Weight: XLA's; one_row_gemm:
    T = 1 through the int8 GEMM (padded to ONE_ROW_GEMM_ROWS rows) instead of a vector
    product; None: where the CPU has AMX (model/cpu.py). as_bf16: from two
    rows, the int8 values multiplied as bf16 with f32 sums; None: bf16_gemm(T).

    w8a16 (is_a16(w)): each token's activations as two int8 parts, x ~= hi * a + lo * b,
    multiplied as one product of 2T rows [hi; lo]: y = (hi @ q.T) * a + (lo @ q.T) * b,
    times the weight's scale. hi = round(x / a) with a = pow2_floor(max|x|) / 64; lo the
    remainder r = x - hi * a rounded at its own b = pow2_floor(max|r|) / 64 (<= a / 32).
    About 13 bits of each token's activations instead of 7, so an outlier channel no
    longer flattens the rest (SmolLM2 perplexity: within ~0.7 % of f32 against W8A8's
    1.8-3.4 %). The scales are powers of two so that every step is exact or one rounding
    (x / a, hi * a, r, their sums' scaling): a row's result is bit-identical whatever
    program or batch it is in (a fused multiply-add or not, the same bits)."""
    if not is_a16(w):
        a = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-30) / 127  # [T, 1]
        return _int8_product(jnp.round(x / a), w, one_row_gemm, as_bf16) * a * w.scale
    a = _pow2_scale(x)  # [T, 1]
    hi = jnp.clip(jnp.round(x / a), -127, 127)  # [T, I] integers, exact
    r = x - hi * a  # exact: |r| <= a, a multiple of x's last place
    b = _pow2_scale(r)  # [T, 1]
    lo = jnp.clip(jnp.round(r / b), -127, 127)
    y = _int8_product(jnp.concatenate([hi, lo]), w, one_row_gemm, as_bf16)  # [2T, O]
    t = x.shape[0]
    return (y[:t] * a + y[t:] * b) * w.scale  # both products exact: one rounding


def _pow2_scale(x: jax.Array) -> jax.Array:
    """x [T, I] f32 -> [T, 1]: the power of two at or below max|x[t]|, over 64 (so that
    |x / scale| < 128), from the float's exponent bits (exact; 1e-30 for an all-zero row)."""
    m = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-30)
    bits = jax.lax.bitcast_convert_type(m, jnp.int32) & 0x7F800000
    return jax.lax.bitcast_convert_type(bits, jnp.float32) / 64


def _int8_product(xq: jax.Array, w: Int8Weight | PackedInt8Weight,
                  one_row_gemm: bool | None, as_bf16: bool | None) -> jax.Array:
    """xq [R, I] f32 holding integers in [-127, 127] -> xq @ q.T [R, O] f32 (exact
    integer sums; int8_linear's forms)."""
    if one_row_gemm is None:
        one_row_gemm = cpu.has_amx()
    t = xq.shape[0]
    if isinstance(w, PackedInt8Weight):
        return onednn.int8_matmul(xq.astype(jnp.int8), w.packed, w.scale.shape[-1],
                                  0 if w.layer is None else w.layer).astype(jnp.float32)
    if t == 1 and not one_row_gemm:  # XLA runs an int8 vector product as int32 (a copy)
        return out_in_linear(xq, OutIn(w.q.astype(jnp.float32)))
    rows = ONE_ROW_GEMM_ROWS if t == 1 else t
    xq = jnp.pad(xq, ((0, rows - t), (0, 0))).astype(jnp.int8)  # [rows, I]
    if t == 1:  # the weight as the left operand: [O, I] x [rows, I] -> [O, rows]
        y = jax.lax.dot_general(w.q, xq, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.int32)[:, :1].T
    elif bf16_gemm(t) if as_bf16 is None else as_bf16:  # integers exact in bf16
        y = jax.lax.dot_general(xq.astype(jnp.bfloat16), w.q.astype(jnp.bfloat16),
                                (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
    else:
        y = jax.lax.dot_general(xq, w.q, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.int32)
    return y.astype(jnp.float32)


HEAD_ROWS_MAX = 2  # up to this many rows: the weight-only int8 head, row by row (AVX2)


def head_rows_max() -> int:
    """Steps of up to this many rows multiply the head weight-only: HEAD_ROWS_MAX, or 0
    on a CPU with AMX (model/cpu.py), where the W8A8 GEMM is the faster."""
    return 0 if cpu.has_amx() else HEAD_ROWS_MAX


def int8_head(h: jax.Array, head: Int8Weight | PackedInt8Weight,
              rows_max: int | None = None) -> jax.Array:
    """h [N, D] f32, head (q [V, D], scale [V]) -> logits [N, V] f32: weight-only, one
    vector product per row, up to rows_max rows (None: head_rows_max()); past them the
    int8 GEMM of the layers (int8 activations too: int8_linear). On the AVX2 CPU the
    weight-only rows won (SmolLM2's head 1.5-2.5 vs 4.2 ms for one row). On AMX CPUs the
    GEMM wins from one row, its weight the left operand: SmolLM2 B = 1 21.9-22.5 -> 21.1-21.3
    ms at context 900 (seventeenth session), for logits ~2.7 % instead of ~2.3 % off the
    f32 head's (the W8A8 layers' own error: ~18 %)."""
    if isinstance(head, PackedInt8Weight) or \
            h.shape[0] > (head_rows_max() if rows_max is None else rows_max):
        return int8_linear(h, head, one_row_gemm=True)  # the GEMM, from one row
    return out_in_linear(h, OutIn(head.q.astype(jnp.float32)), HEAD_ROWS_MAX) * head.scale


def fused(lp: Params, groups: tuple[str, ...] = tuple(FUSED_WEIGHTS)) -> Params:
    """A layer's params with each FUSED_WEIGHTS group (of `groups`) it has in full as one
    matrix ([I, O] parts concatenated along O; GGUF blocks: their rows one after another),
    the parts dropped."""
    for name in groups:
        parts = FUSED_WEIGHTS[name]
        if all(p in lp for p in parts):
            ws = [lp[p] for p in parts]
            lp = {k: v for k, v in lp.items() if k not in parts} | {
                name: gguf_blocks.concat(ws) if isinstance(ws[0], gguf_blocks.GGUF_WEIGHTS)
                else jnp.concatenate(ws, axis=1)}
    return lp


def _fusable(layers: list[Params]) -> tuple[str, ...]:
    """The FUSED_WEIGHTS groups whose parts are all of one kind (all in GGUF blocks, or
    none) in every layer: fused alike, the layers stack."""
    def kinds(lp: Params, parts: tuple[str, ...]) -> set[bool]:
        return {isinstance(lp[p], gguf_blocks.GGUF_WEIGHTS) for p in parts if p in lp}
    return tuple(name for name, parts in FUSED_WEIGHTS.items()
                 if all(len(kinds(lp, parts)) <= 1 for lp in layers))


def quantize_params(params: Params, quantization: str,
                    use_onednn: bool | None = None, fuse: bool = True,
                    rows: tuple[int, ...] = onednn.STEP_ROWS) -> Params:
    """Checkpoint-shaped params -> the same with the layer matrices (LINEAR_WEIGHTS) as
    Int8Weight and an int8 copy of the LM head as "lm_head_int8" ("w8a8_int8";
    "w8a16_int8": A16Int8Weight, their activations in two int8 parts; "none":
    unchanged); with use_onednn each packed for oneDNN (PackedInt8Weight; None: where
    onednn.available() and the matrix is onednn.packable at every row count of `rows`:
    the runner's step sizes); fuse: the matrices of FUSED_WEIGHTS as one (the same
    numbers, fewer products). The other leaves are shared, not copied.

    "gguf": matrices in their GGUF blocks (gguf_blocks.BlockWeight, from the loader's
    blocks=True) stay so, the head too; the others as w8a16_int8."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    if quantization == "none":
        return params
    blocks = quantization == "gguf"
    if blocks:
        quantization = "w8a16_int8"  # for the matrices not in blocks
        if not gguf_blocks.holds_blocks(params):
            log.warning("quantization gguf: no matrix is in GGUF blocks (not a GGUF file, "
                        "or the handler is not built here): all run as w8a16_int8")
    def quantize(w: jax.Array) -> Int8Weight | PackedInt8Weight | gguf_blocks.BlockWeight:
        if isinstance(w, gguf_blocks.GGUF_WEIGHTS):
            return w
        q = quantize_int8(w)
        if quantization == "w8a16_int8":
            q = A16Int8Weight(*q)
        if use_onednn is None:  # where oneDNN has a fast kernel and one layout for it
            ok = onednn.available() and onednn.packable(*q.q.shape, rows)
            return pack_int8(q) if ok else q
        return pack_int8(q) if use_onednn else q

    groups = _fusable(params["layers"]) if fuse else ()
    layers = [{k: quantize(v) if k in LINEAR_WEIGHTS else v
               for k, v in fused(lp, groups).items()} for lp in params["layers"]]
    head = params.get("lm_head", params["embed"])  # [V, D]; tied: the embedding
    if blocks and isinstance(head, gguf_blocks.GGUF_WEIGHTS):  # multiplied in its blocks
        return {**params, "layers": layers}
    return {**params, "layers": layers, "lm_head_int8": quantize(head.T)}
