"""Every matmul shape of the default model (SmolLM2-135M: D 576, 9 q heads and 3 KV heads
of 64, MLP 1536, vocab 49152) at the decode batch sizes and the prefill sizes, in each
formulation XLA offers, beside numpy (its BLAS) and torch (oneDNN) on the same CPU: what
the hardware allows.

Formulations (x [M, I] f32 activations; the weight stored either way round):
  x@W      W [I, O],  einsum "mi,io->mo"  (the model's layout today)
  x@Wt     W [O, I],  einsum "mi,oi->mo"
  W@x      W [I, O],  einsum "io,mi->om", then transposed back
  Wt@x     W [O, I],  einsum "oi,mi->om", then transposed back
  bf16     W [I, O] bfloat16, dot(bf16, bf16) -> f32
  int8     W [I, O] int8 with a per-column f32 scale, converted in the program
  w8a8     the model's W8A8 (model/quant.py int8_linear): W [O, I] int8, each row of x
           rounded to int8 with its own scale, XLA's int8 x int8 -> int32 dot (one row
           padded to 4 on AMX CPUs, as the model runs it)
  int4     W [O, I] int4 (jnp.int4) with a per-row scale through w8a8's code (int8_linear):
           an int8 x int4 -> int32 dot, 4-bit weights as XLA offers them
  int4>8   the same int4 weight converted to int8 in the program, then w8a8's dot
  onednn   w8a8 through oneDNN's int8 matmul (model/onednn.py, the model's form on the CPU
           where built): the weight packed at load, the layer read in place from the stack
and the fused forms the model could use: QKV as one [576, 960] weight, gate/up as one
[576, 3072]. Each XLA form is timed inside a lax.scan over 30 stacked layers (as the model
runs them), reported per layer.

    .venv/bin/python benchmarks/matmul.py [--ms 1,8,32,128,512] [--reps 5] [--torch-quant]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.model.quant import Int8Weight, PackedInt8Weight, int8_linear, pack_int8

LAYERS = 30
# name -> (in, out)
SHAPES = {"q/o": (576, 576), "k or v": (576, 192), "qkv fused": (576, 960),
          "gate or up": (576, 1536), "gate+up fused": (576, 3072), "down": (1536, 576),
          "lm head": (576, 49152)}


def _timed(f: Callable[[], object], reps: int) -> float:
    f()  # compile / warm
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def xla_forms() -> dict[str, Callable[[jax.Array, jax.Array], jax.Array]]:
    """name -> (x [M, I], one layer's weight) -> [M, O]."""
    return {
        "x@W": lambda x, w: jnp.einsum("mi,io->mo", x, w),
        "x@Wt": lambda x, w: jnp.einsum("mi,oi->mo", x, w),
        "W@x": lambda x, w: jnp.einsum("io,mi->om", w, x).T,
        "Wt@x": lambda x, w: jnp.einsum("oi,mi->om", w, x).T,
        "bf16": lambda x, w: jnp.dot(x.astype(jnp.bfloat16), w,
                                     preferred_element_type=jnp.float32),
        # int8: the weight converted in the program, the per-column scale after the dot
        "int8": lambda x, w: jnp.dot(x, w[0].astype(jnp.float32)) * w[1],
        # w8a8 and the int4 forms: the model's own product (quant.int8_linear)
        "w8a8": lambda x, w: int8_linear(x, Int8Weight(*w)),
        "int4": lambda x, w: int8_linear(x, Int8Weight(*w)),
        "int4>8": lambda x, w: int8_linear(x, Int8Weight(w[0].astype(jnp.int8), w[1])),
    }


def weights_for(form: str, i: int, o: int, layers: int, rng: np.random.Generator):
    w = rng.standard_normal((layers, i, o), np.float32) * 0.02
    if form in ("x@Wt", "Wt@x"):
        return jnp.asarray(w.transpose(0, 2, 1).copy())
    if form == "bf16":
        return jnp.asarray(w, jnp.bfloat16)
    if form == "int8":
        s = np.abs(w).max(axis=1, keepdims=True) / 127
        return (jnp.asarray(np.round(w / s).astype(np.int8)), jnp.asarray(s))
    if form == "onednn":  # the w8a8 weight packed: ([L, parts, P], [L, O])
        return pack_int8(Int8Weight(*weights_for("w8a8", i, o, layers, rng)))[:2]
    if form in ("w8a8", "int4", "int4>8"):  # [O, I], one scale per output row
        wt = w.transpose(0, 2, 1)
        top = 127 if form == "w8a8" else 7
        s = np.abs(wt).max(axis=2) / top
        q = np.round(wt / s[..., None]).astype(np.int8)
        return (jnp.asarray(q, jnp.int8 if form == "w8a8" else jnp.int4), jnp.asarray(s))
    return jnp.asarray(w)


def time_xla(form: str, m: int, i: int, o: int, layers: int, reps: int) -> float:
    """Seconds per layer of one form inside a scan over `layers` stacked weights."""
    rng = np.random.default_rng(0)
    layers = layers if i * o < 10_000_000 else 1  # the LM head: one
    w = weights_for(form, i, o, layers, rng)
    x = jnp.asarray(rng.standard_normal((m, i), np.float32))
    body = xla_forms()[form] if form != "onednn" else None

    @jax.jit
    def run(x, w):  # every layer's [M, O] output written out, as the model uses it
        if form == "onednn":  # the stack whole, the layer's index scanned
            return jax.lax.scan(lambda c, i: (c, int8_linear(x, PackedInt8Weight(
                w[0], w[1][i], i))), 0, jnp.arange(layers))[1]
        return jax.lax.scan(lambda c, wl: (c, body(x, wl)), 0, w)[1]

    return _timed(lambda: run(x, w).block_until_ready(), reps) / layers


def time_numpy(m: int, i: int, o: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((m, i), np.float32), rng.standard_normal((i, o), np.float32)
    return _timed(lambda: x @ w, reps)


def time_torch(m: int, i: int, o: int, reps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    x, w = torch.randn(m, i), torch.randn(o, i)  # nn.Linear stores (out, in)
    with torch.no_grad():
        return _timed(lambda: torch.nn.functional.linear(x, w), reps)


def time_torch_quant(m: int, i: int, o: int, bits: int, reps: int) -> float | None:
    """Seconds per layer of torch's CPU weight-only kernels (bf16 activations): int8
    (`_weight_int8pack_mm`, one scale per output) or int4 (`_weight_int4pack_mm_for_cpu`,
    groups of 32), cycling over `LAYERS` layers' weights as the model streams them."""
    try:
        import torch
    except ImportError:
        return None
    x = torch.randn(m, i).bfloat16()
    layers = LAYERS if i * o < 10_000_000 else 1
    if bits == 8:
        ws = [torch.randint(-127, 128, (o, i), dtype=torch.int8) for _ in range(layers)]
        scale = torch.rand(o).bfloat16()
        f = [lambda w=w: torch._weight_int8pack_mm(x, w, scale) for w in ws]
    else:
        ws = [torch._convert_weight_to_int4pack_for_cpu(
            torch.randint(0, 16, (o, i), dtype=torch.int32), 2) for _ in range(layers)]
        sz = torch.rand(i // 32, o, 2).bfloat16()
        f = [lambda w=w: torch._weight_int4pack_mm_for_cpu(x, w, 32, sz) for w in ws]
    with torch.no_grad():
        return _timed(lambda: [g() for g in f], reps) / layers


def cell(secs: dict[str, float], form: str, m: int, i: int, o: int) -> str:
    """GFLOP/s (weight GB/s) of one measured form."""
    if form not in secs:
        return "-"
    wbytes = i * o * {"bf16": 2, "int8": 1, "w8a8": 1, "int4": 0.5, "int4>8": 0.5, "onednn": 1,
                      "torch int8": 1, "torch int4": 0.5}.get(form, 4)
    return f"{2 * m * i * o / secs[form] / 1e9:.1f} ({wbytes / secs[form] / 1e9:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,8,32,128,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--forms", default="x@W,x@Wt,W@x,Wt@x,bf16,int8")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--torch-quant", action="store_true",
                    help="also torch's int8 and int4 weight-only CPU kernels")
    args = ap.parse_args()
    forms = args.forms.split(",")
    refs = ["numpy", "torch"] + (["torch int8", "torch int4"] if args.torch_quant else [])
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; GFLOP/s (GB/s of weight "
          f"reads), per layer inside a scan of {LAYERS}")
    print("| shape | M | " + " | ".join([*forms, *refs]) + " | best XLA |")
    print("|---|---|" + "---|" * (len(forms) + len(refs) + 1))
    for name in args.shapes.split(","):
        i, o = SHAPES[name]
        for m in map(int, args.ms.split(",")):
            secs = {f: time_xla(f, m, i, o, LAYERS, args.reps) for f in forms}
            secs["numpy"] = time_numpy(m, i, o, args.reps)
            t = time_torch(m, i, o, args.reps)
            if t is not None:
                secs["torch"] = t
            for bits in (8, 4) if args.torch_quant else ():
                t = time_torch_quant(m, i, o, bits, args.reps)
                if t is not None:
                    secs[f"torch int{bits}"] = t
            best = min(forms, key=secs.__getitem__)
            print(f"| {name} [{i}x{o}] | {m} | " + " | ".join(cell(secs, f, m, i, o) for f in
                  [*forms, *refs]) + f" | {best} |", flush=True)


if __name__ == "__main__":
    main()
