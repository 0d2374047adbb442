"""`python -m radixjax.cli --prompt ...`: generate from a prompt with the default
model (SmolLM2-135M-Instruct) or any --model (HF folder or GGUF file), streaming text."""

from __future__ import annotations

import argparse
import sys
import time

import jax

from radixjax.engine.config import EngineConfig, serving_form
from radixjax.engine.load_form import in_blocks
from radixjax.loaders import ModelNotFoundError, load_model
from radixjax.model.config import UnsupportedModelError
from radixjax.model.forms import QUANTIZATIONS
from radixjax.model.gguf_blocks import holds_blocks
from radixjax.parallel.mesh import MeshConfigError
from radixjax.parallel.rules import layout_for
from radixjax.parallel.shard_params import placer_for
from radixjax.runtime.compile_cache import enable_persistent_cache
from radixjax.runtime.model_runner import DTYPES, ModelRunner, RunnerConfig
from radixjax.runtime.simple_generate import PromptTooLongError, generate_tokens
from radixjax.sampling.params import SamplingParams, SamplingParamsError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None,
                   help="HF model folder or .gguf file (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--raw", action="store_true",
                   help="feed the prompt as-is instead of through the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="weight dtype (float32 measured fastest on CPU; benchmarks/README.md)")
    p.add_argument("--quantization", choices=("auto", *QUANTIZATIONS), default="auto",
                   help="as the server's (auto: w8a16_int8 + bfloat16 KV on one CPU "
                        "device; none: float32 throughout)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel devices (0: every visible device; docs/sharding.md)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel groups inside the TP group (MoE); must divide --tp")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ModelNotFoundError, UnsupportedModelError, SamplingParamsError,
            PromptTooLongError, MeshConfigError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    enable_persistent_cache()
    t0 = time.perf_counter()
    layout = layout_for(args.tp, args.ep)
    config = EngineConfig(dtype=args.dtype, quantization=args.quantization, tp=args.tp,
                          ep=args.ep)
    m = load_model(args.model, dtype=args.dtype,
                   placer_for=placer_for(layout) if layout is not None else None,
                   gguf_blocks=in_blocks(config, args.model))
    tok = m.tokenizer
    if args.raw or not tok.chat_template:
        ids = tok(args.prompt).input_ids
    else:
        messages = [{"role": "user", "content": args.prompt}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(ids, add_special_tokens=False).input_ids
    sp = SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    context = 1 << max(8, (len(ids) + args.max_tokens - 1).bit_length())
    form = serving_form(config, jax.default_backend(), mla=m.cfg.mla is not None,
                        gguf=holds_blocks(m.params))  # as the engine resolves it
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(
        num_slots=context + 1, max_batch_tokens=context, max_running=1, max_context=context,
        kv_dtype=form.kv_dtype, quantization=form.quantization,
        deterministic=form.deterministic), layout)
    print(f"[loaded {m.source} in {time.perf_counter() - t0:.1f}s]", file=sys.stderr)
    out: list[int] = []
    printed = ""
    t1 = time.perf_counter()
    for token in generate_tokens(runner, ids, sp, args.seed, m.cfg.eos_token_ids):
        out.append(token)
        text = tok.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # hold back a partial UTF-8 character
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    dt = time.perf_counter() - t1
    print(f"\n[{len(out)} tokens in {dt:.2f}s incl. compile]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
