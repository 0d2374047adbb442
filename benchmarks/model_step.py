"""Model step speed on the default model (SmolLM2-135M): decode step time at batch
1/8/16/32/64 (context 512) and prefill tokens/s at 512 and 2048 tokens, float32 vs bfloat16
weights (or, with --quant, float32 vs int8 layer weights and activations,
`--quantization w8a8_int8`), the compile time of each step program, and the
memory-bandwidth floor (weight bytes / measured read bandwidth).

    .venv/bin/python benchmarks/model_step.py [--steps 20] [--quant]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from radixjax.loaders import load_model
from radixjax.model.params import num_param_bytes
from radixjax.runtime.batch import HostBatch, RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams

CONTEXT = 512


def read_bandwidth(num_bytes: int = 1 << 29, reps: int = 5) -> float:
    """Bytes/s of a jitted full read (a sum over a 512 MiB array): what a decode step
    that streams every weight once cannot beat."""
    x = jnp.ones(num_bytes // 4, jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        f(x).block_until_ready()
    return num_bytes * reps / (time.perf_counter() - t)


def time_steps(runner: ModelRunner, reqs: list[RequestSlice], steps: int,
               compiles: list[float] | None = None) -> float:
    """Median seconds per step of the same batch. The first (untimed) call compiles and
    uploads the requests' req_to_token rows; the timed ones reuse them, as a scheduler's
    decode steps do. compiles: gets the first call's seconds (compile + one step)."""
    reqs = [r._replace(row=i, sync_row=True) for i, r in enumerate(reqs)]
    batch = build_batch(reqs, runner.buckets)
    sp = SamplingArrays.build([SamplingParams(temperature=0)] * len(reqs),
                              [0] * len(reqs), batch.shape.num_reqs)
    t = time.perf_counter()
    runner.step(batch, sp, StepOptions()).tokens.block_until_ready()  # compile
    if compiles is not None:
        compiles.append(time.perf_counter() - t)
    batch = build_batch([r._replace(sync_row=False) for r in reqs], runner.buckets)
    return median_step_s(runner, batch, sp, steps)


def median_step_s(runner: ModelRunner, batch: HostBatch, sp: SamplingArrays,
                  steps: int) -> float:
    """Median seconds of `steps` runs of an already compiled step (waited for each)."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        runner.step(batch, sp, StepOptions()).tokens.block_until_ready()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def bench(dtype: str, steps: int, quantization: str = "none") -> dict[str, float]:
    m = load_model(None, dtype=dtype, load_tokenizer=False)
    rng = np.random.default_rng(0)
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=64 * CONTEXT + 1, max_batch_tokens=2048, max_running=64,
        max_context=2048, kv_dtype=dtype, quantization=quantization))
    del m.params
    out: dict[str, float] = {"weight_bytes": num_param_bytes(runner.params)}
    compiles: list[float] = []
    for b in (1, 8, 16, 32, 64):
        reqs = [
            RequestSlice(rng.integers(0, m.cfg.vocab_size, 1).astype(np.int32),
                         (1 + i * CONTEXT + np.arange(CONTEXT)).astype(np.int32))
            for i in range(b)
        ]
        out[f"decode_b{b}"] = time_steps(runner, reqs, steps, compiles)
    for n in (512, 2048):
        reqs = [RequestSlice(rng.integers(0, m.cfg.vocab_size, n).astype(np.int32),
                             np.arange(1, n + 1, dtype=np.int32))]
        out[f"prefill_{n}"] = time_steps(runner, reqs, max(3, steps // 5), compiles)
    out["compile"] = float(np.median(compiles))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quant", action="store_true",
                    help="float32 vs w8a8_int8 (instead of f32 vs bf16)")
    args = ap.parse_args()
    # no persistent compile cache: the compile time of each program is measured
    bw = read_bandwidth()
    if args.quant:
        names = ("float32", "w8a8_int8")
        res = {"float32": bench("float32", args.steps),
               "w8a8_int8": bench("float32", args.steps, quantization="w8a8_int8")}
    else:  # bf16 is far slower on this CPU; fewer timed steps keep the run short.
        names = ("float32", "bfloat16")
        res = {"float32": bench("float32", args.steps),
               "bfloat16": bench("bfloat16", max(3, args.steps // 4))}
    print(f"read bandwidth: {bw / 1e9:.1f} GB/s; jax {jax.__version__}, "
          f"{jax.devices()[0].device_kind}")
    print()
    a, z = (res[n] for n in names)
    print(f"| measure | {names[0]} | {names[1]} | {names[1]} / {names[0]} |")
    print("|---|---|---|---|")
    for r in (a, z):
        r["floor"] = r["weight_bytes"] / bw
    print(f"| weight bytes | {a['weight_bytes'] / 1e6:.0f} MB | "
          f"{z['weight_bytes'] / 1e6:.0f} MB | |")
    print(f"| bandwidth floor per step | {a['floor'] * 1e3:.1f} ms | "
          f"{z['floor'] * 1e3:.1f} ms | |")
    for b in (1, 8, 16, 32, 64):
        f, h = a[f"decode_b{b}"], z[f"decode_b{b}"]
        print(f"| decode b={b} ctx={CONTEXT}: ms/step (x floor), tok/s | "
              f"{f * 1e3:.1f} ({f / a['floor']:.1f}x), {b / f:.0f} | "
              f"{h * 1e3:.1f} ({h / z['floor']:.1f}x), {b / h:.0f} | {h / f:.2f} |")
    for n in (512, 2048):
        f, h = a[f"prefill_{n}"], z[f"prefill_{n}"]
        print(f"| prefill {n} tokens: tok/s | {n / f:.0f} | {n / h:.0f} | {f / h:.2f} |")
    print(f"| compile + first step, median per program: s | {a['compile']:.1f} | "
          f"{z['compile']:.1f} | {z['compile'] / a['compile']:.2f} |")


if __name__ == "__main__":
    main()
