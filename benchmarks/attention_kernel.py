"""Ragged paged-attention kernel benchmark: the Pallas (Triton) backend vs the native
(XLA gather) backend vs the bandwidth floor.

Run on a GPU:   python benchmarks/attention_kernel.py            (JAX_PLATFORMS unset)
Run on a CPU:   python benchmarks/attention_kernel.py --quick    (the default off-GPU)

GPU: one attention layer of a Llama-3-8B-like model (32 q-heads, 8 KV heads, head_dim
128, bf16 KV pool, page size 16, scattered pages).
- decode, batch 1..256 x context 1k..32k: per-step time of the pallas backend (KV write
  + attention), the kernel alone, and the native backend; the floor is the KV bytes the
  step must read / measured HBM read bandwidth (a jitted sum over a 4 GiB array).
- prefill (one request, T new tokens) and extend (T new tokens on a 4k cached prefix).
CPU (--quick): interpret mode only; checks a small mixed batch against the reference
and times it; no performance meaning.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.blocks import AttentionBlocks, choose_blocks
from pallas_kernels.ragged_attention import ragged_paged_attention
from pallas_kernels.ref import ragged_paged_attention_ref
from radixjax.model.attention import TABLE_ALIGN, AttentionMetadata
from radixjax.model.native_attention import native_attention
from radixjax.model.pallas_backend import cu_q_lens_from, page_table, pallas_attention

PAGE = 16


class Heads(NamedTuple):
    q: int
    kv: int
    dim: int

    @property
    def scale(self) -> float:
        return self.dim**-0.5


LLAMA3_8B = Heads(32, 8, 128)
TINY = Heads(8, 2, 16)  # interpret mode


def time_ms(fn: Callable[[], object], iters: int) -> float:
    """Median wall time of fn() (which must block), after one warm-up call."""
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def hbm_read_gbps() -> float:
    x = jnp.ones((1 << 31,), jnp.bfloat16)  # 4 GiB
    f = jax.jit(jnp.sum)
    ms = time_ms(lambda: f(x).block_until_ready(), 10)
    return x.nbytes / ms / 1e6


class Step:
    """One ragged step: q_lens new tokens on top of kv_lens - q_lens cached ones."""

    def __init__(self, q_lens: list[int], kv_lens: list[int], heads: Heads = LLAMA3_8B,
                 dtype=jnp.bfloat16, seed: int = 0) -> None:
        self.heads = heads
        rng = np.random.default_rng(seed)
        pages_per = [-(-k // PAGE) for k in kv_lens]
        max_kv = -(-max(kv_lens) // PAGE) * PAGE
        num_pages = sum(pages_per) + 1
        perm = rng.permutation(np.arange(1, num_pages, dtype=np.int32))
        b, t = len(q_lens), sum(q_lens)
        width = -(-max_kv // TABLE_ALIGN) * TABLE_ALIGN
        table = np.zeros((b + 1, width), np.int32)  # req_to_token; the last row is spare
        out_slots, positions, token_req, start = [], [], [], 0
        for i, (q, k, n) in enumerate(zip(q_lens, kv_lens, pages_per, strict=True)):
            pages = perm[start : start + n]
            start += n
            slots = (pages[:, None] * PAGE + np.arange(PAGE)[None]).reshape(-1)[:k]
            table[i, :k] = slots
            out_slots += list(slots[k - q :])
            positions += list(range(k - q, k))
            token_req += [i] * q
        q_start = np.concatenate([[0], np.cumsum(q_lens)[:-1]]).astype(np.int32)
        self.md = AttentionMetadata(*(jnp.asarray(np.asarray(a, np.int32)) for a in (
            positions, out_slots, token_req, q_start, q_lens, kv_lens, np.arange(b), table)))
        self.max_q, self.max_kv, self.num_reqs = max(q_lens), max_kv, b
        key = jax.random.key(seed)
        kq, kk, kv, kn = jax.random.split(key, 4)
        pool = (num_pages * PAGE, heads.kv, heads.dim)
        self.k_pool = jax.random.normal(kk, pool, dtype)
        self.v_pool = jax.random.normal(kv, pool, dtype)
        self.q = jax.random.normal(kq, (t, heads.q, heads.dim), jnp.float32)
        self.k_new = jax.random.normal(kn, (t, heads.kv, heads.dim), jnp.float32)
        self.v_new = self.k_new * 0.5
        self.kv_bytes = 2 * sum(kv_lens) * heads.kv * heads.dim * jnp.dtype(dtype).itemsize

    def time_backend(self, backend, iters: int) -> float:
        fn = jax.jit(partial(backend, window=None, scale=self.heads.scale),
                     donate_argnums=(3, 4))
        pools = [self.k_pool, self.v_pool]

        def run() -> None:
            out, pools[0], pools[1] = fn(self.q, self.k_new, self.v_new, *pools, self.md)
            out.block_until_ready()

        ms = time_ms(run, iters)
        self.k_pool, self.v_pool = pools
        return ms

    def kernel_args(self) -> tuple:
        paged = (-1, PAGE, self.heads.kv, self.heads.dim)
        return (self.q, self.k_pool.reshape(paged), self.v_pool.reshape(paged),
                page_table(self.md, PAGE), cu_q_lens_from(self.md),
                self.md.kv_len)

    def time_kernel(self, iters: int) -> float:
        blocks = choose_blocks(self.num_reqs, self.heads.kv, self.max_q, self.max_kv)
        fn = jax.jit(partial(ragged_paged_attention, scale=self.heads.scale, max_q=self.max_q,
                             blocks=blocks))
        args = self.kernel_args()
        return time_ms(lambda: fn(*args).block_until_ready(), iters)


def _try(fn: Callable[[], float]) -> str:
    try:
        return f"{fn():.3f}"
    except Exception as e:  # an OOM of the dense native gather at long contexts
        return f"failed ({type(e).__name__})"


def gpu_main(args: argparse.Namespace) -> None:
    bw = hbm_read_gbps()
    print(f"device: {jax.devices()[0].device_kind}; HBM read {bw:.0f} GB/s")
    check = Step([1] * 8 + [300], [1024] * 8 + [1500], dtype=jnp.float32)
    ours = jax.jit(partial(ragged_paged_attention, scale=LLAMA3_8B.scale, max_q=check.max_q,
                           blocks=choose_blocks(check.num_reqs, LLAMA3_8B.kv, 1,
                                                check.max_kv)))
    kargs = check.kernel_args()
    ref = ragged_paged_attention_ref(*kargs, scale=LLAMA3_8B.scale)
    err = float(jnp.max(jnp.abs(ours(*kargs) - ref)) / jnp.max(jnp.abs(ref)))
    print(f"compiled kernel vs reference (f32, split-K): rel err {err:.1e}\n")
    del check
    print("| decode B | context | floor ms | pallas ms (x floor) | kernel ms | native ms |")
    print("|---|---|---|---|---|---|")
    for ctx in args.contexts:
        for b in args.batches:
            if b * ctx > args.max_tokens:
                continue
            step = Step([1] * b, [ctx] * b)
            floor = step.kv_bytes / bw / 1e6
            pallas = step.time_backend(pallas_attention, args.iters)
            kernel = step.time_kernel(args.iters)
            native = _try(lambda s=step: s.time_backend(native_attention, args.iters))
            print(f"| {b} | {ctx} | {floor:.3f} | {pallas:.3f} ({pallas / floor:.1f}x) | "
                  f"{kernel:.3f} | {native} |", flush=True)
            del step
    print("\n| prefill | new tokens | cached | pallas ms | native ms |")
    print("|---|---|---|---|---|")
    for t in args.prefill:
        for prefix in (0, 4096):
            step = Step([t], [prefix + t])
            pallas = step.time_backend(pallas_attention, args.iters)
            native = _try(lambda s=step: s.time_backend(native_attention, args.iters))
            print(f"| 1 | {t} | {prefix} | {pallas:.3f} | {native} |", flush=True)


def cpu_check() -> None:
    """Interpret mode: a mixed batch (decodes at a page boundary +-1, an extend, a
    prefill) against the reference, f32 pool, split-K on."""
    step = Step([1, 1, 1, 5, 17], [15, 16, 17, 40, 17], TINY, dtype=jnp.float32)
    args = step.kernel_args()
    blocks = AttentionBlocks(rows=16, block_k=16, num_splits=2)
    fn = jax.jit(partial(ragged_paged_attention, scale=TINY.scale, max_q=17, blocks=blocks))
    t0 = time.perf_counter()
    ours = np.asarray(fn(*args))
    first = time.perf_counter() - t0
    again = time_ms(lambda: fn(*args).block_until_ready(), 3)
    ref = np.asarray(ragged_paged_attention_ref(*args, scale=TINY.scale))
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    print(f"interpret mode on {jax.default_backend()}: {step.num_reqs} requests, "
          f"rel err {err:.1e}; "
          f"first call (trace + compile + run) {first:.2f} s, then {again:.1f} ms/call")
    if err > 1e-5:
        raise SystemExit("kernel does not match the reference")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="interpret-mode check only")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--prefill", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--max-tokens", type=int, default=1 << 22,
                   help="skip decode shapes with more cached tokens (KV memory)")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    if args.quick or jax.default_backend() != "gpu":
        cpu_check()
    else:
        gpu_main(args)


if __name__ == "__main__":
    main()
