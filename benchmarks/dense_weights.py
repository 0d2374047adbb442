"""The layer scan's dense matrices stacked (in, out), as loaded, vs (out, in), as the runner
stacks them (model/dense_weights.py): decode steps at context 512 and a 512-token
prefill, SmolLM2-135M float32.

"(in, out)" is the same runner with each stacked `OutIn(wt)` put back as the plain
[n, I, O] array, which `layers.linear` multiplies `x @ w` (the form before the change);
both runners' programs are compiled first, then timed in alternating rounds (min and
median of the rounds' medians), so both see the same machine.

    .venv/bin/python benchmarks/dense_weights.py [--batches 1,2,4,8,16,32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from radixjax.loaders import load_model
from radixjax.model.dense_weights import OutIn
from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_step import median_step_s  # noqa: E402

CONTEXT = 512


def in_out(runner: ModelRunner) -> None:
    """Back to the loaded orientation, in place: OutIn(wt [n, O, I]) -> w [n, I, O]."""
    runner.params["groups"] = [
        {k: jnp.swapaxes(v.wt, -1, -2) if isinstance(v, OutIn) else v for k, v in g.items()}
        for g in runner.params["groups"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round and side")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    m = load_model(None, load_tokenizer=False)
    config = RunnerConfig(num_slots=max(batches) * CONTEXT + 1, max_batch_tokens=CONTEXT,
                          max_running=max(batches), max_context=2 * CONTEXT)
    runners = {"(in, out)": ModelRunner(m.cfg, m.params, config),
               "(out, in)": ModelRunner(m.cfg, m.params, config)}
    in_out(runners["(in, out)"])
    rng = np.random.default_rng(0)
    cases = [(f"decode B = {b}", b, [
        RequestSlice(rng.integers(0, 1000, 1).astype(np.int32),
                     (1 + i * CONTEXT + np.arange(CONTEXT)).astype(np.int32), row=i)
        for i in range(b)]) for b in batches]
    cases.append((f"prefill {CONTEXT} tokens", None, [RequestSlice(
        rng.integers(0, 1000, CONTEXT).astype(np.int32),
        np.arange(1, CONTEXT + 1, dtype=np.int32), row=0)]))
    print(f"SmolLM2-135M float32, context {CONTEXT}; ms/step, min / median of {args.rounds} "
          "rounds (prefill: tok/s from the min)\n")
    print("| step | (in, out) | (out, in) | (in, out) / (out, in) |")
    print("|---|---|---|---|")
    for name, b, reqs in cases:
        batch = build_batch([r._replace(sync_row=True) for r in reqs], runners["(in, out)"].buckets)
        sp = SamplingArrays.build([SamplingParams(temperature=0)] * len(reqs), [0] * len(reqs),
                                  batch.shape.num_reqs)
        for r in runners.values():  # compile, upload the rows
            r.step(batch, sp, StepOptions()).tokens.block_until_ready()
        batch = build_batch(reqs, runners["(in, out)"].buckets)
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(args.rounds):
            for k, r in runners.items():
                times[k].append(median_step_s(r, batch, sp, args.steps) * 1e3)
        lo = {k: min(v) for k, v in times.items()}
        med = {k: float(np.median(v)) for k, v in times.items()}
        a, z = "(in, out)", "(out, in)"
        extra = "" if b else f" ({CONTEXT / lo[a] * 1e3:.0f} vs {CONTEXT / lo[z] * 1e3:.0f} tok/s)"
        print(f"| {name}{extra} | {lo[a]:.1f} / {med[a]:.1f} | {lo[z]:.1f} / {med[z]:.1f} | "
              f"{lo[a] / lo[z]:.2f} / {med[a] / med[z]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
