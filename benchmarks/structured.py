"""Structured-output benchmark on the default model (SmolLM2-135M), two markdown tables:

  1. overhead: the same B chat prompts under a JSON schema (jump-forward off, so every
     token is decoded) and unconstrained with each request's output length set to its
     constrained length (ignore_eos): output tok/s and ms per output token, as ratios;
     plus the host cost of filling one bitmask row;
  2. jump-forward on vs off on a schema with long fixed keys: decode steps, extend steps,
     wall time, and the outputs' validity.

    .venv/bin/python benchmarks/structured.py [--quick]

Every timed run follows an identical untimed one on the same engine, so step shapes are
compiled (or loaded from the persistent cache) before the clock starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, NamedTuple

import numpy as np

from radixjax import Engine, SamplingParams
from radixjax.loaders import load_model
from radixjax.runtime.compile_cache import enable_persistent_cache
from radixjax.sampling.bitmask import bitmask_width

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "city": {"enum": ["Paris", "Berlin", "Madrid", "Rome"]},
    },
    "required": ["name", "age", "city"],
}
LONG_KEYS = {  # most of the output is forced by the schema
    "type": "object",
    "properties": {
        "customer_full_legal_name_as_on_the_passport": {"type": "string", "maxLength": 10},
        "customer_primary_residential_address_city": {"enum": ["Paris", "Rome"]},
        "customer_account_is_currently_in_good_standing": {"type": "boolean"},
        "customer_number_of_previous_orders_this_year": {"type": "integer", "minimum": 0,
                                                          "maximum": 9},
    },
    "required": ["customer_full_legal_name_as_on_the_passport",
                 "customer_primary_residential_address_city",
                 "customer_account_is_currently_in_good_standing",
                 "customer_number_of_previous_orders_this_year"],
}
TOPICS = ["a baker", "a pilot", "a doctor", "a painter", "a farmer", "a teacher",
          "a sailor", "a chef", "a poet", "a judge", "a nurse", "a miner", "a tailor",
          "a singer", "a coach", "a guard"]


class Timed(NamedTuple):
    wall: float
    outs: list[Any]
    stats: dict[str, float]

    @property
    def tokens(self) -> int:
        return sum(o.completion_tokens for o in self.outs)

    @property
    def ms_per_token(self) -> float:
        return 1e3 * statistics.fmean(o.stats.time_per_output_token for o in self.outs)


def timed(eng: Engine, prompts: list[str], sp: SamplingParams) -> Timed:
    eng.generate(prompts, sp)  # warm: compiles every shape this workload hits
    eng.flush_cache()
    before = eng.stats()
    t = time.perf_counter()
    outs = eng.generate(prompts, sp)
    wall = time.perf_counter() - t
    after = eng.stats()
    eng.flush_cache()
    return Timed(wall, outs, {k: after[k] - before[k] for k in (
        "num_decode_steps", "num_prefill_steps", "num_jump_forward_tokens")})


def valid(outs: list[Any]) -> int:
    n = 0
    for o in outs:
        try:
            json.loads(o.text)
            n += o.finish_reason == "stop"
        except ValueError:
            pass
    return n


def chat_prompts(tok: Any, n: int, ask: str) -> list[str]:
    return [tok.apply_chat_template([{"role": "user", "content": ask.format(t)}],
                                    add_generation_prompt=True, tokenize=False)
            for t in (TOPICS * (n // len(TOPICS) + 1))[:n]]


def engine(model: Any, batch: int, **options: Any) -> Engine:
    return Engine(params=model.params, model_config=model.cfg, tokenizer=model.tokenizer,
                  num_slots=batch * 512 + 1, max_running=batch, max_context=512,
                  max_prefill_tokens=512, chunk_size=512, **options)


def part_overhead(model: Any, args: argparse.Namespace) -> None:
    prompts = chat_prompts(model.tokenizer, args.batch, "Describe {} as a JSON object.")
    json_sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, json_schema=SCHEMA)
    with engine(model, args.batch, enable_jump_forward=False) as eng:
        b = timed(eng, prompts, json_sp)
        free = [SamplingParams(max_new_tokens=o.completion_tokens, temperature=0.0,
                               ignore_eos=True) for o in b.outs]  # the same lengths
        a = timed(eng, prompts, free)
        fill_us = mask_fill_us(eng, b.outs[0].token_ids)
    print(f"\n(1) constrained vs unconstrained: {args.batch} chat prompts at once, greedy, "
          f"max {args.new_tokens} new tokens, jump-forward off\n")
    print("| measure | unconstrained | JSON schema | schema/free |")
    print("|---|---:|---:|---:|")
    print(f"| output tokens | {a.tokens} | {b.tokens} | |")
    print(f"| output tok/s | {a.tokens / a.wall:.1f} | {b.tokens / b.wall:.1f} | "
          f"{(b.tokens / b.wall) / (a.tokens / a.wall):.2f} |")
    print(f"| ms per output token (per request) | {a.ms_per_token:.1f} | {b.ms_per_token:.1f}"
          f" | {b.ms_per_token / a.ms_per_token:.2f} |")
    print(f"| valid JSON | | {valid(b.outs)}/{len(b.outs)} | |")
    print(f"\nhost: filling one bitmask row ({bitmask_width(model.cfg.vocab_size)} words) "
          f"took {fill_us:.1f} µs on average over the {len(b.outs[0].token_ids)} states of "
          "one output")


def mask_fill_us(eng: Engine, tokens: list[int]) -> float:
    """Mean µs per fill_bitmask along a real output: fill, then accept its next token."""
    from radixjax.grammar.backend import GrammarBackend

    backend = GrammarBackend(eng.tokenizer, eng.model_config.vocab_size, eng.eos_token_ids)
    matcher = backend.matcher(backend.compile(("json_schema", json.dumps(SCHEMA), True)))
    mask = np.zeros((1, bitmask_width(eng.model_config.vocab_size)), np.int32)
    total = 0.0
    for tok in tokens:
        t = time.perf_counter()
        matcher.fill_bitmask(mask, 0)
        total += time.perf_counter() - t
        assert matcher.accept(tok)
    return total / len(tokens) * 1e6


def part_jump_forward(model: Any, args: argparse.Namespace) -> None:
    rows = []
    for batch in args.jf_batches:
        prompts = chat_prompts(model.tokenizer, batch, "Give the record of {} as JSON.")
        sp = SamplingParams(max_new_tokens=160, temperature=0.0, json_schema=LONG_KEYS)
        for jf in (False, True):
            with engine(model, batch, enable_jump_forward=jf) as eng:
                rows.append((batch, jf, timed(eng, prompts, sp)))
    print("\n(2) jump-forward on a schema with four ~45-character fixed keys, greedy\n")
    print("| batch | jump-forward | output tokens | jumped | decode steps | extend steps | "
          "wall s | valid | wall on/off |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    walls = {}
    for batch, jf, r in rows:
        walls[batch, jf] = r.wall
        ratio = f"{r.wall / walls[batch, False]:.2f}" if jf else ""
        print(f"| {batch} | {'on' if jf else 'off'} | {r.tokens} | "
              f"{r.stats['num_jump_forward_tokens']:.0f} | {r.stats['num_decode_steps']:.0f} | "
              f"{r.stats['num_prefill_steps']:.0f} | {r.wall:.2f} | {valid(r.outs)}/"
              f"{len(r.outs)} | {ratio} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--jf-batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 8])
    args = ap.parse_args()
    if args.quick:
        args.batch, args.new_tokens, args.jf_batches = 2, 16, [1]
    enable_persistent_cache()
    t = time.perf_counter()
    model = load_model(None)
    part_overhead(model, args)
    part_jump_forward(model, args)
    print(f"\ntotal {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
