"""A GGUF model's step in its own blocks (`--quantization gguf`, model/gguf_blocks.py)
against the int8 copy (`w8a16_int8`, the default form): decode step time at batch 1 and 8
(context 512), prefill of 512 tokens, the weight bytes each holds, load + program time,
and each form's logits against float32's on one prompt. The two forms' timings alternate
in rounds (this VM's speed drifts between minutes); one process, loaded one after the
other.

    .venv/bin/python benchmarks/gguf_blocks.py [--model qwen2.5-coder-1.5b] [--steps 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_step import compile_case, median_step_s  # noqa: E402

from radixjax.loaders import load_model  # noqa: E402
from radixjax.model.params import num_param_bytes  # noqa: E402
from radixjax.runtime.batch import RequestSlice, build_batch  # noqa: E402
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig  # noqa: E402

CONTEXT = 512
ROUNDS = 3


def setup(model: str, form: str) -> tuple[ModelRunner, dict, dict]:
    t = time.perf_counter()
    m = load_model(model, load_tokenizer=False, gguf_blocks=form == "gguf")
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=8 * CONTEXT + 1, max_batch_tokens=512, max_running=8, max_context=1024,
        kv_dtype="bfloat16", quantization=form))
    del m
    rng = np.random.default_rng(0)
    vocab = runner.cfg.vocab_size
    slices = {f"decode B={b}": [
        RequestSlice(rng.integers(0, vocab, 1).astype(np.int32),
                     (1 + i * CONTEXT + np.arange(CONTEXT)).astype(np.int32)) for i in range(b)]
        for b in (1, 8)}
    slices["prefill 512"] = [RequestSlice(rng.integers(0, vocab, 512).astype(np.int32),
                                          np.arange(1, 513, dtype=np.int32))]
    compiles: list[float] = []
    cases = {name: compile_case(runner, reqs, compiles) for name, reqs in slices.items()}
    info = {"weights GB": num_param_bytes(runner.params) / 1e9,
            "load+compile s": time.perf_counter() - t}
    return runner, cases, info


def prompt_logits(runner: ModelRunner) -> np.ndarray:
    ids = np.random.default_rng(1).integers(0, runner.cfg.vocab_size, 48).astype(np.int32)
    batch = build_batch([RequestSlice(ids, np.arange(1, 49, dtype=np.int32))], runner.buckets)
    return runner.all_logits(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    forms = ("w8a16_int8", "gguf")
    built = {f: setup(args.model, f) for f in forms}
    times: dict[tuple[str, str], list[float]] = {}
    for case in built[forms[0]][1]:
        n = args.steps if case.startswith("decode") else 2
        for _ in range(ROUNDS):
            for f in forms:
                runner, cases, _ = built[f]
                times.setdefault((f, case), []).append(median_step_s(runner, *cases[case], n))
    logits = {f: prompt_logits(built[f][0]) for f in forms}
    print(f"{args.model}, ms per step (median of {ROUNDS} interleaved rounds)")
    print(f"| | {' | '.join(forms)} | ratio |")
    print("|---|---:|---:|---:|")
    for case in built[forms[0]][1]:
        a, b = (float(np.median(times[(f, case)])) * 1e3 for f in forms)
        print(f"| {case} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    for key in built[forms[0]][2]:
        a, b = (built[f][2][key] for f in forms)
        print(f"| {key} | {a:.2f} | {b:.2f} | |")
    top = float(np.mean(logits["gguf"].argmax(-1) == logits["w8a16_int8"].argmax(-1)))
    diff = np.abs(logits["gguf"] - logits["w8a16_int8"]).max() / np.abs(
        logits["w8a16_int8"]).max()
    print(f"gguf vs w8a16 logits on a 48-token prompt: same top token {top:.0%}, "
          f"max diff {diff:.2%} of the largest (perplexity: benchmarks/quality.py)")


if __name__ == "__main__":
    main()
