"""MLA's KV cache against an equivalent MHA model, and MLA's two attention forms.

    .venv/bin/python benchmarks/mla.py [--steps 5]

1. KV bytes per token (all layers, bf16 and f32): the latent pool of DeepSeek-V2-Lite,
   V2 and V3 (their published dims) against the same models with plain MHA (every head
   keeping K of qk_head_dim and V of v_head_dim), from the runner's own pool sizing
   (kv_pool_bytes), plus the bytes a real pool array takes per slot here.
2. Decode step time on a small random DeepSeek-V3-style model (4 layers, 16 heads,
   latent 256 + rope 32), B = 8 at contexts 512 and 2048: absorbed (attend in the latent
   space, the default) vs expanded (every cached latent expanded per head each step).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from model_step import time_steps  # benchmarks/, the script's folder

from radixjax.model.config import MLADims, ModelConfig
from radixjax.model.llama import kv_pool_bytes
from radixjax.model.params import init_params
from radixjax.runtime.batch import RequestSlice
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig

# name -> (layers, heads, kv_lora, q_lora, nope, rope, v)  (HF config.json values)
PUBLISHED = {
    "DeepSeek-V2-Lite": (27, 16, 512, None, 128, 64, 128),
    "DeepSeek-V2": (60, 128, 512, 1536, 128, 64, 128),
    "DeepSeek-V3": (61, 128, 512, 1536, 128, 64, 128),
}


def mla_config(layers: int, heads: int, rank: int, q_rank: int | None, nope: int, rope: int,
               v: int, hidden: int = 256, vocab: int = 1024) -> ModelConfig:
    mla = MLADims(q_lora_rank=q_rank, kv_lora_rank=rank, qk_nope_head_dim=nope,
                  qk_rope_head_dim=rope, v_head_dim=v)
    return ModelConfig(model_type="deepseek_v3", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=2 * hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=1, head_dim=rank + rope, mla=mla)


def mha_bytes_per_token(layers: int, heads: int, nope: int, rope: int, v: int,
                        itemsize: int) -> int:
    return layers * heads * (nope + rope + v) * itemsize


def kv_table() -> None:
    print("| model | MLA KV / token (bf16) | MHA-equivalent KV / token (bf16) | ratio |")
    print("|---|---|---|---|")
    for name, (layers, heads, rank, q_rank, nope, rope, v) in PUBLISHED.items():
        cfg = mla_config(layers, heads, rank, q_rank, nope, rope, v)
        mla = kv_pool_bytes(cfg, 1, jnp.bfloat16)
        mha = mha_bytes_per_token(layers, heads, nope, rope, v, 2)
        print(f"| {name} | {mla / 1024:.1f} KiB | {mha / 1024:.1f} KiB | {mha / mla:.1f}x |")
    cfg = mla_config(2, 4, 32, 24, 16, 8, 16)
    runner = ModelRunner(cfg, init_params(cfg, jax.random.key(0)),
                         RunnerConfig(num_slots=64, max_batch_tokens=8, max_running=2,
                                      max_context=16, attention_backend="native"))
    held = sum(x.size * x.dtype.itemsize for x in runner.kv) // 64
    print(f"\nA real pool here (2 layers, latent 32 + rope 8, f32): {held} bytes per slot "
          f"= 2 x 40 x 4, no V pool ({runner.kv[1].shape}).\n")


def decode_table(steps: int) -> None:
    cfg = mla_config(4, 16, 256, 192, 32, 32, 32, hidden=512, vocab=4096)
    params = init_params(cfg, jax.random.key(0))
    b = 8
    print("| context | absorbed ms/step | expanded ms/step | expanded / absorbed |")
    print("|---|---|---|---|")
    for ctx in (512, 2048):
        rng = np.random.default_rng(0)
        reqs = [RequestSlice(rng.integers(3, cfg.vocab_size, 1).astype(np.int32),
                             np.arange(1 + i * ctx, 1 + (i + 1) * ctx, dtype=np.int32), row=i)
                for i in range(b)]
        ms = []
        for absorb in (True, False):
            run_cfg = RunnerConfig(num_slots=b * ctx + 8, max_batch_tokens=b, max_running=b,
                                   max_context=ctx, attention_backend="native",
                                   mla_absorb=absorb)
            runner = ModelRunner(dataclasses.replace(cfg), params, run_cfg)
            ms.append(1e3 * time_steps(runner, reqs, steps))
            del runner
        print(f"| {ctx} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[1] / ms[0]:.2f}x |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    kv_table()
    decode_table(args.steps)


if __name__ == "__main__":
    main()
