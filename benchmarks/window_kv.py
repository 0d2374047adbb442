"""Sliding-window KV (issue 44): Gemma 3 270M (its PyPI GGUF, Q4_K_M, the default
serving form) with its 15 window layers' KV in a pool of their own (cache/window_kv.py)
vs one pool for all 18 layers:

  a. KV bytes per token of capacity: pools sized for N requests at 4k context (the
     window pool the least that never stalls a step, window_kv.min_window_slots), and
     those N requests run through it at once (prompts of context - 64 tokens, 32 new
     tokens each): their tokens the same in both engines, integrity after;
  b. decode: ms per output token of one request after a 128-token prompt vs a
     4k-context one (64 new tokens), in each engine (the engines take turns, medians).

    .venv/bin/python benchmarks/window_kv.py [--requests 4] [--context 4096]

Each engine compiles every step program before the clock starts (warm-up) and must end
with num_late_compiles == 0.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model, resolve_model_path
from radixjax.model.llama import kv_pool_bytes
from radixjax.runtime.model_runner import DTYPES


def _engine(model, context: int, requests: int, hybrid: bool) -> Engine:
    return Engine(params=model.params, model_config=model.cfg, tokenizer=model.tokenizer,
                  num_slots=requests * (context + 64), max_running=requests,
                  max_context=context + 64, disable_hybrid_swa_memory=not hybrid)


def _bytes_per_token(engine: Engine) -> float:
    rc = engine.runner.config
    pool = kv_pool_bytes(engine.runner.run_cfg, rc.num_slots, DTYPES[rc.kv_dtype],
                         rc.window_slots)
    return pool / (rc.num_slots - rc.page_size)


def _flush(engine: Engine) -> None:
    """Drop the cached prefixes once the engine is idle (its last step may be in flight)."""
    while not engine.flush_cache():
        time.sleep(0.01)


def _ms_per_token(engine: Engine, prompt: list[int], new: int = 64) -> float:
    sp = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    engine.generate(prompt, sp)  # the same shapes once (nothing cached: flushed after)
    _flush(engine)
    out = engine.generate(prompt, sp)
    _flush(engine)
    return out.stats.time_per_output_token * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3,
                    help="decode timings: rounds alternating the engines (medians)")
    args = ap.parse_args()
    model = load_model(resolve_model_path("gemma3-270m"))
    rng = np.random.default_rng(0)
    long = [list(rng.integers(10, 20000, args.context - 64)) for _ in range(args.requests)]
    short = list(rng.integers(10, 20000, 128))
    sp = SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True)
    engines = {name: _engine(model, args.context, args.requests, hybrid)
               for name, hybrid in (("one pool", False), ("window pool", True))}
    rows = {}
    try:
        for name, e in engines.items():
            start = time.perf_counter()
            outs = e.generate(long, sp)
            seconds = time.perf_counter() - start
            e.check_integrity()
            _flush(e)
            rows[name] = dict(tokens=[o.token_ids for o in outs], seconds=seconds,
                              short=[], long=[], bytes=_bytes_per_token(e),
                              slots=(e.runner.config.window_slots, e.runner.config.num_slots))
        # the VM's speed drifts within minutes: the engines take turns, medians kept
        for _ in range(args.rounds):
            for name, e in engines.items():
                rows[name]["short"].append(_ms_per_token(e, short))
                rows[name]["long"].append(_ms_per_token(e, long[0]))
        for e in engines.values():
            assert e.runner.num_late_compiles == 0
    finally:
        for e in engines.values():
            e.shutdown()
    one, win = rows["one pool"], rows["window pool"]
    print(f"\nGemma 3 270M Q4_K_M, default form; {args.requests} requests at "
          f"{args.context} context; same tokens in both: {one['tokens'] == win['tokens']}\n")
    print("| KV | window slots | full slots | KV bytes / token | N x 4k run (s) "
          "| decode ms/tok @128 | @4k | 4k / 128 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        a, b = statistics.median(r["short"]), statistics.median(r["long"])
        print(f"| {name} | {r['slots'][0]} | {r['slots'][1]} | {r['bytes']:,.0f} "
              f"| {r['seconds']:.1f} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    print(f"\nbytes per token, one pool / window pool: {one['bytes'] / win['bytes']:.2f}x")


if __name__ == "__main__":
    main()
