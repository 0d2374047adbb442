"""Steps over a shared prefix: the shared-prefix pass on vs off (native backend).

Requests hold PREFIX positions in common (the same pool slots, as the radix cache leaves
a shared system prompt): decode steps of B requests with OWN positions each, and prefill
steps of B new requests with NEW uncached tokens each (a wave of chat requests after
the system prompt is cached). "off" is the same batch with md.shared_len zeroed, so
every request reads the prefix itself; the same program runs both, interleaved in rounds
(min and median of the rounds' medians). A group of one: steps of one request whose
new tokens (a later chunk of a long prompt, a chat's next turn) extend its own CACHED
keys, which it reads in the pass alone ("on") or in the extend loop's tiles ("off").

    .venv/bin/python benchmarks/shared_prefix.py [--quant] [--kv-dtype bfloat16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from radixjax.loaders import load_model
from radixjax.model.attention import SHARED_PREFIX_MIN_BATCH
from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_step import median_step_s  # noqa: E402

PREFIX, OWN = 800, 100  # issue 16's shared workload: ~800-token system prompt
NEW = 48  # a new request's uncached tokens (its question and the chat template)


ALONE = ((1000, 100), (1500, 500), (3000, 200))  # (cached, new) of a request alone


def compare(runner: ModelRunner, reqs: list[RequestSlice], vocab: int, rounds: int,
            steps: int, prefix: int = PREFIX) -> tuple[dict, dict]:
    """(min, median) ms per step over the rounds, "off" (shared_len zeroed) and "on"."""
    rng = np.random.default_rng(len(reqs))
    reqs = [r._replace(new_tokens=rng.integers(0, vocab, len(r.new_tokens)).astype(np.int32))
            for r in reqs]
    on = build_batch(reqs, runner.buckets)
    sp = SamplingArrays.build([SamplingParams(temperature=0)] * len(reqs), [0] * len(reqs),
                              on.shape.num_reqs)
    runner.step(on, sp, StepOptions()).tokens.block_until_ready()  # compile, rows
    on = build_batch([r._replace(sync_row=False) for r in reqs], runner.buckets)
    assert on.md.shared_len[0] == prefix, on.md.shared_len  # (B >= SHARED_PREFIX_MIN_BATCH)
    off = on._replace(md=on.md._replace(shared_len=np.zeros_like(on.md.shared_len)))
    res = {"on": [], "off": []}
    for _ in range(rounds):
        res["off"].append(median_step_s(runner, off, sp, steps))
        res["on"].append(median_step_s(runner, on, sp, steps))
    return ({k: min(v) * 1e3 for k, v in res.items()},
            {k: float(np.median(v)) * 1e3 for k, v in res.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", action="store_true", help="w8a8_int8 weights")
    ap.add_argument("--kv-dtype", default="float32", help="the KV pool's dtype (bfloat16)")
    ap.add_argument("--batches", default="8,16,32", help="decode steps of this many requests "
                    f"(at least SHARED_PREFIX_MIN_BATCH = {SHARED_PREFIX_MIN_BATCH})")
    ap.add_argument("--waves", default="4,8", help="prefill steps of this many new requests")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round and side")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    waves = [int(b) for b in args.waves.split(",") if b]
    m = load_model(None, load_tokenizer=False)
    most = max(batches + waves)
    alone = max(c + n for c, n in ALONE)  # the longest request alone
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=max(PREFIX + most * (OWN + 1), alone) + 1,
        max_batch_tokens=max(64, most * NEW, *(n for _, n in ALONE)),
        max_running=most, max_context=max(PREFIX + OWN + 64, alone),
        quantization="w8a8_int8" if args.quant else "none", kv_dtype=args.kv_dtype))
    prefix = 1 + np.arange(PREFIX, dtype=np.int32)

    def own(i: int, n: int) -> np.ndarray:
        return np.concatenate([prefix, 1 + PREFIX + i * OWN + np.arange(n, dtype=np.int32)])

    print(f"SmolLM2-135M {'w8a8_int8' if args.quant else 'float32'}, {args.kv_dtype} KV, "
          f"{PREFIX} positions shared; ms/step, min / median of {args.rounds} rounds\n")
    print("| step | prefix read per request | shared-prefix pass | per request / shared |")
    print("|---|---|---|---|")
    cases = [(f"decode B = {b}, {OWN} own positions each",
              [RequestSlice(np.zeros(1, np.int32), own(i, OWN), row=i) for i in range(b)])
             for b in batches]
    cases += [(f"prefill {b} requests x {NEW} new tokens",
               [RequestSlice(np.zeros(NEW, np.int32), own(i, NEW), row=i) for i in range(b)])
              for b in waves]
    cases = [(name, reqs, PREFIX) for name, reqs in cases]
    cases += [(f"one request: {n} new tokens on its {c} cached",
               [RequestSlice(np.zeros(n, np.int32), 1 + np.arange(c + n, dtype=np.int32),
                             row=0)], c) for c, n in ALONE]
    for name, reqs, prefix_len in cases:
        lo, med = compare(runner, reqs, m.cfg.vocab_size, args.rounds, args.steps, prefix_len)
        print(f"| {name} | {lo['off']:.1f} / {med['off']:.1f} | {lo['on']:.1f} / "
              f"{med['on']:.1f} | {lo['off'] / lo['on']:.2f} / {med['off'] / med['on']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
