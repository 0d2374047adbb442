"""Model step speed on the default model (SmolLM2-135M): decode step time at batch
1/8/16/32/64 (context 512) and prefill tokens/s at 512 and 2048 tokens, float32 vs bfloat16
weights (or, with --quant, float32 vs int8 layer weights and activations,
`--quantization w8a8_int8`; with --kv, w8a8 with a float32 vs a bfloat16 KV pool,
`--kv-cache-dtype bfloat16`; with --onednn, w8a8 + bf16 KV with XLA's int8 products vs
oneDNN's, model/onednn.py; with --a16, w8a8 vs w8a16 activations in two int8 parts,
model/quant.py, both on a float32 KV pool), the compile time of each step program, and the
memory-bandwidth floor (weight bytes / measured read bandwidth).

    .venv/bin/python benchmarks/model_step.py [--steps 20] [--quant | --kv | --onednn | --a16]
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
    """Median seconds per step of the same batch (compile_case, then `steps` runs).
    compiles: gets the first call's seconds (compile + one step)."""
    batch, sp = compile_case(runner, reqs, [] if compiles is None else compiles)
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


BATCHES = (1, 8, 16, 32, 64)
PREFILLS = (512, 2048)
ROUNDS = 4  # the two configurations' timings alternate in this many rounds


def setup(dtype: str, quantization: str = "none", kv_dtype: str | None = None,
          onednn: bool | None = None) -> tuple[ModelRunner, dict[str, tuple], dict]:
    """A runner and its compiled cases: measure name -> (batch, sampling arrays)."""
    m = load_model(None, dtype=dtype, load_tokenizer=False)
    rng = np.random.default_rng(0)
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=64 * CONTEXT + 1, max_batch_tokens=2048, max_running=64,
        max_context=2048, kv_dtype=kv_dtype or dtype, quantization=quantization,
        onednn=onednn))
    f32_bytes = num_param_bytes(m.params) * 4 // jnp.dtype(dtype).itemsize
    out: dict[str, float] = {"weight_bytes": num_param_bytes(runner.params),
                             "f32_bytes": f32_bytes}
    del m.params
    cases, compiles = {}, []
    slices = {f"decode_b{b}": [
        RequestSlice(rng.integers(0, m.cfg.vocab_size, 1).astype(np.int32),
                     (1 + i * CONTEXT + np.arange(CONTEXT)).astype(np.int32))
        for i in range(b)] for b in BATCHES}
    for n in PREFILLS:
        slices[f"prefill_{n}"] = [RequestSlice(
            rng.integers(0, m.cfg.vocab_size, n).astype(np.int32),
            np.arange(1, n + 1, dtype=np.int32))]
    for name, reqs in slices.items():
        cases[name] = compile_case(runner, reqs, compiles)
    out["compile"] = float(np.median(compiles))
    return runner, cases, out


def compile_case(runner: ModelRunner, reqs: list[RequestSlice],
                 compiles: list[float]) -> tuple[HostBatch, SamplingArrays]:
    """The batch of these requests, compiled (and their req_to_token rows uploaded) by a
    first call whose seconds go to `compiles`; the timed calls reuse the rows, as a
    scheduler's decode steps do."""
    reqs = [r._replace(row=i, sync_row=True) for i, r in enumerate(reqs)]
    batch = build_batch(reqs, runner.buckets)
    sp = SamplingArrays.build([SamplingParams(temperature=0)] * len(reqs),
                              [0] * len(reqs), batch.shape.num_reqs)
    t = time.perf_counter()
    runner.step(batch, sp, StepOptions()).tokens.block_until_ready()
    compiles.append(time.perf_counter() - t)
    return build_batch([r._replace(sync_row=False) for r in reqs], runner.buckets), sp


def bench_pair(configs: dict[str, dict], steps: int) -> dict[str, dict[str, float]]:
    """Median seconds per step of every case under each configuration (setup's keyword
    arguments), their timings alternating in ROUNDS rounds: this VM's speed drifts
    1.5x between minutes, so only interleaved timings compare."""
    built = {name: setup(**kw) for name, kw in configs.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for case in built[next(iter(built))][1]:
        n = max(2, (steps if case.startswith("decode") else max(3, steps // 5)) // ROUNDS)
        for _ in range(ROUNDS):
            for name, (runner, cases, _) in built.items():
                times.setdefault((name, case), []).append(
                    median_step_s(runner, *cases[case], n))
    return {name: out | {case: float(np.median(times[(name, case)])) for case in cases}
            for name, (_, cases, out) in built.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quant", action="store_true",
                    help="float32 vs w8a8_int8 (instead of f32 vs bf16)")
    ap.add_argument("--kv", action="store_true",
                    help="w8a8_int8 with a float32 vs a bfloat16 KV pool")
    ap.add_argument("--onednn", action="store_true",
                    help="w8a8_int8 + bf16 KV, XLA's int8 products vs oneDNN's")
    ap.add_argument("--a16", action="store_true",
                    help="w8a8_int8 vs w8a16_int8, both with a float32 KV pool")
    args = ap.parse_args()
    # no persistent compile cache: the compile time of each program is measured
    bw = read_bandwidth()
    if args.kv:
        configs = {f"kv {kv}": dict(dtype="float32", quantization="w8a8_int8", kv_dtype=kv)
                   for kv in ("float32", "bfloat16")}
    elif args.onednn:
        configs = {name: dict(dtype="float32", quantization="w8a8_int8", kv_dtype="bfloat16",
                              onednn=name == "onednn") for name in ("xla", "onednn")}
    elif args.a16:
        configs = {q: dict(dtype="float32", quantization=q, kv_dtype="float32")
                   for q in ("w8a8_int8", "w8a16_int8")}
    elif args.quant:
        configs = {"float32": dict(dtype="float32"),
                   "w8a8_int8": dict(dtype="float32", quantization="w8a8_int8")}
    else:
        configs = {d: dict(dtype=d) for d in ("float32", "bfloat16")}
    res = bench_pair(configs, args.steps)
    names = tuple(res)
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
    f32_floor = a["f32_bytes"] / bw  # the bar: B = 1 within 1.1x of this
    f, h = a["decode_b1"], z["decode_b1"]
    print(f"| decode b=1 / the f32 weights' floor ({f32_floor * 1e3:.1f} ms) | "
          f"{f / f32_floor:.2f}x | {h / f32_floor:.2f}x | |")
    for b in BATCHES:
        f, h = a[f"decode_b{b}"], z[f"decode_b{b}"]
        print(f"| decode b={b} ctx={CONTEXT}: ms/step (x floor), tok/s | "
              f"{f * 1e3:.1f} ({f / a['floor']:.1f}x), {b / f:.0f} | "
              f"{h * 1e3:.1f} ({h / z['floor']:.1f}x), {b / h:.0f} | {h / f:.2f} |")
    for n in PREFILLS:
        f, h = a[f"prefill_{n}"], z[f"prefill_{n}"]
        print(f"| prefill {n} tokens: tok/s | {n / f:.0f} | {n / h:.0f} | {f / h:.2f} |")
    print(f"| compile + first step, median per program: s | {a['compile']:.1f} | "
          f"{z['compile']:.1f} | {z['compile'] / a['compile']:.2f} |")


if __name__ == "__main__":
    main()
