"""Speculative decoding's premise on this CPU (issue 43): what a step that extends each
request by k + 1 tokens (its last token and k drafts, the verify step) costs next to a
decode step of 1 token, in the default serving form (w8a16 int8 weights, bf16 KV, as
EngineConfig's "auto" on one CPU), at context 512, for 1 and 8 requests.

    .venv/bin/python benchmarks/verify_step.py [--steps 12]

Each timed step follows a compiling call of the same shape; the cases alternate in
rounds (this VM's speed drifts between minutes). The extra rows of a verify step's LM
head are not in these steps (they sample one token per request): the head on k + 1 rows
per request is measured as its own row.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_step import CONTEXT, compile_case, median_step_s  # noqa: E402

from radixjax.loaders import load_model  # noqa: E402
from radixjax.model.llama import lm_head  # noqa: E402
from radixjax.runtime.batch import RequestSlice  # noqa: E402
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig  # noqa: E402

DRAFTS = (0, 1, 3, 7, 15)
BATCHES = (1, 8)
ROUNDS = 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    m = load_model(None, load_tokenizer=False)
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=8 * (CONTEXT + 32) + 1, max_batch_tokens=256, max_running=8,
        max_context=1024, kv_dtype="bfloat16", quantization="w8a16_int8",
        deterministic=True))
    rng = np.random.default_rng(0)
    cases = {}
    for b in BATCHES:
        for k in DRAFTS:
            reqs = [RequestSlice(rng.integers(0, m.cfg.vocab_size, k + 1).astype(np.int32),
                                 (1 + i * (CONTEXT + 32) + CONTEXT + np.arange(k + 1)
                                  ).astype(np.int32)) for i in range(b)]
            cases[(b, k)] = compile_case(runner, reqs, [])
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(ROUNDS):
        for key, (batch, sp) in cases.items():
            times.setdefault(key, []).append(median_step_s(runner, batch, sp,
                                                           args.steps // ROUNDS + 1))
    head = jax.jit(lambda h: lm_head(runner.params, h, runner.cfg, None))
    head_ms = {}
    for rows in sorted({b * (k + 1) for b in BATCHES for k in DRAFTS}):
        h = jnp.ones((rows, m.cfg.hidden_size), jnp.float32)
        head(h).block_until_ready()
        samples = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            head(h).block_until_ready()
            samples.append(time.perf_counter() - t0)
        head_ms[rows] = 1e3 * float(np.median(samples))
    print("| requests | drafts k | tokens per step | ms per step | x decode | "
          "LM head on B(k+1) rows, ms |\n|---|---|---|---|---|---|")
    for b in BATCHES:
        base = np.median(times[(b, 0)])
        for k in DRAFTS:
            ms = 1e3 * np.median(times[(b, k)])
            print(f"| {b} | {k} | {b * (k + 1)} | {ms:.1f} | {ms / (1e3 * base):.2f} | "
                  f"{head_ms[b * (k + 1)]:.1f} |")


if __name__ == "__main__":
    main()
