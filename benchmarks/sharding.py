"""Step time and per-device memory for each TP / EP layout of a dense model, an MoE model
and a DeepSeek-style one (MLA + shared expert + grouped routing), EP by psum and by
all-to-all side by side, and DP attention (each device its share of the requests);
random weights, ModelConfig built here, no checkpoint needed.

    # CPU: 8 fake devices sharing the cores (correctness-oriented, not a speed test)
    .venv/bin/python benchmarks/sharding.py --cpu-devices 8
    # a multi-GPU machine: the real devices, larger shapes
    python benchmarks/sharding.py --preset gpu --dtype bfloat16

Per-device memory counts the bytes of params and KV pool each device holds (sum of its
shards) and the decode program's scratch (XLA's temp allocation, per device); on a GPU
device 0's allocator bytes in use (memory_stats) are shown too.
Decode: B requests, one new token each over `ctx` cached positions; prefill: one
request of T tokens.
"""

from __future__ import annotations

import argparse
import os
import sys

# The fake CPU devices must exist before jax initialises.
if "--cpu-devices" in sys.argv:
    _n = sys.argv[sys.argv.index("--cpu-devices") + 1]
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={_n}")

import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from model_step import time_steps  # noqa: E402  (benchmarks/, the script's folder)

from radixjax.model.config import MLADims, ModelConfig  # noqa: E402
from radixjax.model.params import init_params  # noqa: E402
from radixjax.parallel.rules import layout_for  # noqa: E402
from radixjax.runtime.batch import Buckets, RequestSlice, build_batch  # noqa: E402
from radixjax.runtime.dp_batch import RankStep, merge_rank_steps  # noqa: E402
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig, StepOptions  # noqa: E402
from radixjax.sampling.params import SamplingParams  # noqa: E402

PRESETS = {  # (hidden, heads, kv heads, layers, mlp, vocab, experts, expert mlp, B, ctx, T)
    "cpu": (256, 8, 4, 4, 768, 4096, 8, 256, 8, 128, 128),
    "gpu": (2048, 16, 8, 8, 5632, 32768, 16, 1408, 32, 1024, 1024),
}
DENSE_LAYOUTS = ((1, 1), (2, 1), (4, 1), (8, 1))
# a third entry "a2a": EP dispatch by all-to-all (else psum)
MOE_LAYOUTS = ((1, 1), (2, 1), (2, 2), (2, 2, "a2a"), (4, 2), (4, 4), (4, 4, "a2a"), (8, 8),
               (8, 8, "a2a"))
MLA_LAYOUTS = ((1, 1), (2, 1), (4, 4), (4, 4, "a2a"), (8, 8), (8, 8, "a2a"), (4, 4, "dpa"),
               (8, 8, "a2a", "dpa"))  # "dpa": DP attention
MODELS = ("dense", "moe", "deepseek")


def model_config(preset: str, kind: str) -> ModelConfig:
    d, h, hkv, layers, f, v, e, fe, *_ = PRESETS[preset]
    moe = kind != "dense"
    common = dict(vocab_size=v, hidden_size=d, intermediate_size=f, num_layers=layers,
                  num_heads=h, num_experts=e if moe else 0,
                  num_experts_per_tok=2 if moe else 0, moe_intermediate_size=fe)
    if kind == "deepseek":  # V3-style: latent d/2 + rope 32, q LoRA, first layer dense
        mla = MLADims(q_lora_rank=d // 2, kv_lora_rank=d // 2, qk_nope_head_dim=d // h,
                      qk_rope_head_dim=32, v_head_dim=d // h)
        return ModelConfig(model_type="deepseek_v3", num_kv_heads=1,
                           head_dim=mla.kv_lora_rank + mla.qk_rope_head_dim, mla=mla,
                           sparse_layers=(False,) + (True,) * (layers - 1),
                           moe_scoring="sigmoid", moe_topk_method="noaux_tc", moe_n_group=4,
                           moe_topk_group=2, moe_router_bias=True, shared_expert_size=fe,
                           **common)
    return ModelConfig(model_type="qwen3_moe" if moe else "qwen3", num_kv_heads=hkv,
                       head_dim=d // h, qk_norm=True, **common)


def scratch_bytes(runner: ModelRunner, num_tokens: int) -> int:
    """XLA's temp allocation of the step program of this token bucket (per device)."""
    shape = runner.buckets.shape_of(num_tokens)
    return runner.programs._lower(shape).compile().memory_analysis().temp_size_in_bytes


def per_device_bytes(runner: ModelRunner) -> dict[str, int]:
    """Largest per-device total of params and of the KV pool (bytes)."""
    out = {}
    for name, tree in (("params", runner.params), ("kv", runner.kv)):
        per_dev: dict[jax.Device, int] = defaultdict(int)
        for leaf in jax.tree_util.tree_leaves(tree):
            for s in leaf.addressable_shards:
                per_dev[s.device] += s.data.size * s.data.dtype.itemsize
        out[name] = max(per_dev.values())
    return out


def time_dp_steps(runner: ModelRunner, per_rank: list[list[RequestSlice]],
                  steps: int) -> float:
    """time_steps for DP attention: each rank's requests (local rows and slots; an empty
    list: an idle rank) merged into one step, as engine/dp_attention.py does."""
    c = runner.config
    local = Buckets.default(c.max_batch_tokens, c.max_running)

    def merged(sync: bool):
        ranks = []
        for reqs in per_rank:
            reqs = [r._replace(row=i, sync_row=sync) for i, r in enumerate(reqs)]
            ranks.append(RankStep(build_batch(reqs, local) if reqs else None,
                                  [SamplingParams(temperature=0)] * len(reqs), [0] * len(reqs),
                                  StepOptions() if reqs else None, None))
        return merge_rank_steps(ranks, local, c.max_running + 1, 1)

    first = merged(True)
    runner.step(first.host, first.sampling, first.opts).tokens.block_until_ready()
    step = merged(False)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        runner.step(step.host, step.sampling, step.opts).tokens.block_until_ready()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench(cfg: ModelConfig, tp: int, ep: int, tags: tuple[str, ...],
          args: argparse.Namespace) -> dict:
    *_, b, ctx, t = PRESETS[args.preset]
    dpa = "dpa" in tags
    layout = layout_for(tp, ep, moe_dispatch="all_to_all" if "a2a" in tags else "psum",
                        dp_attention=dpa)
    ranks = tp if dpa else 1
    params = init_params(cfg, jax.random.key(0), args.dtype)
    runner = ModelRunner(cfg, params, RunnerConfig(  # under DP attention: per rank
        num_slots=b // ranks * ctx + t + 8, max_batch_tokens=t,
        max_running=b // ranks, max_context=max(ctx, t), kv_dtype=args.dtype,
        attention_backend=args.attention_backend, dp_ranks=ranks), layout)
    del params
    rng = np.random.default_rng(0)
    if dpa:  # the B decodes spread over the ranks; the one prefill on rank 0
        decode = [[RequestSlice(rng.integers(3, cfg.vocab_size, 1).astype(np.int32),
                                np.arange(1 + i * ctx, 1 + (i + 1) * ctx, dtype=np.int32))
                   for i in range(b // ranks)] for _ in range(ranks)]
        prefill = [[RequestSlice(rng.integers(3, cfg.vocab_size, t).astype(np.int32),
                                 np.arange(1, 1 + t, dtype=np.int32))]] + [[]] * (ranks - 1)
        return {"layout": f"tp={tp} ep={ep} " + " ".join(tags), **per_device_bytes(runner),
                "scratch": scratch_bytes(runner, b // ranks),
                "decode_ms": 1e3 * time_dp_steps(runner, decode, args.steps),
                "prefill_ms": 1e3 * time_dp_steps(runner, prefill, args.steps),
                "in_use": (jax.devices()[0].memory_stats() or {}).get("bytes_in_use")}
    decode = [RequestSlice(rng.integers(3, cfg.vocab_size, 1).astype(np.int32),
                           np.arange(1 + i * ctx, 1 + (i + 1) * ctx, dtype=np.int32), row=i)
              for i in range(b)]
    prefill = [RequestSlice(rng.integers(3, cfg.vocab_size, t).astype(np.int32),
                            np.arange(1 + b * ctx, 1 + b * ctx + t, dtype=np.int32))]
    row = {"layout": f"tp={tp} ep={ep}" + "".join(f" {x}" for x in tags),
           **per_device_bytes(runner), "scratch": scratch_bytes(runner, b),
           "decode_ms": 1e3 * time_steps(runner, decode, args.steps),
           "prefill_ms": 1e3 * time_steps(runner, prefill, args.steps)}
    stats = jax.devices()[0].memory_stats() or {}  # None on the CPU backend
    row["in_use"] = stats.get("bytes_in_use")  # device 0, while this runner is alive
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-devices", type=int, default=0, help="fake CPU devices (0: real ones)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--attention-backend", default="native")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--only", choices=MODELS, default=None)
    args = p.parse_args()
    n = len(jax.devices())
    d, h, hkv, layers, f, v, e, fe, b, ctx, t = PRESETS[args.preset]
    print(f"{n} x {jax.devices()[0].device_kind}; preset {args.preset}: hidden {d}, heads "
          f"{h}/{hkv}, {layers} layers, mlp {f}, vocab {v}, experts {e} top-2 of {fe}; "
          f"decode B={b} ctx={ctx}, prefill T={t}; {args.dtype}\n")
    print("| model | layout | params / device | KV pool / device | decode scratch / device "
          "| decode ms/step | prefill ms/step | device 0 in use |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, layouts in zip(MODELS, (DENSE_LAYOUTS, MOE_LAYOUTS, MLA_LAYOUTS), strict=True):
        if args.only and args.only != kind:
            continue
        cfg = model_config(args.preset, kind)
        for tp, ep, *dispatch in layouts:  # dispatch: tags "a2a", "dpa"
            if tp > n:
                continue
            r = bench(cfg, tp, ep, tuple(dispatch), args)
            peak = f"{r['in_use'] / 2**20:.0f} MiB" if r["in_use"] else "n/a"
            print(f"| {cfg.model_type} | {r['layout']} | {r['params'] / 2**20:.1f} MiB "
                  f"| {r['kv'] / 2**20:.1f} MiB | {r['scratch'] / 2**20:.1f} MiB "
                  f"| {r['decode_ms']:.1f} | {r['prefill_ms']:.1f} | {peak} |", flush=True)


if __name__ == "__main__":
    main()
