"""Quality of each serving form on the default model (SmolLM2-135M Q4_1 GGUF): perplexity
with llama-perplexity's protocol on public texts nobody here wrote, next to HF
transformers' float32 and llama.cpp's own `llama-perplexity` on the same GGUF, and greedy
agreement with our float32 over a set of chat prompts.

    .venv/bin/python benchmarks/quality.py [--chunks 8] [--no-hf] [--no-llama]
        [--configs f32,default,w8a8+bf16kv,w8a8,w8a16,w8a16+bf16kv,gguf] [--greedy-tokens 48]
        [--model gemma3-270m]    # another GGUF (a base model: --greedy-tokens 0)

Protocol (llama.cpp's tools/perplexity): the text is tokenized whole, cut into windows of
N_CTX = 512 tokens (the first `--chunks` of them; a window's first token is BOS where the
model adds one), each window is scored on its second half only: the logits at positions
256 .. 510 against the tokens 257 .. 511 (255 tokens a window). PPL = exp(mean NLL).

Texts (read at run time from what the machine ships, nothing downloaded):
- `pyref`: sections of the Python Language Reference (`pydoc_data.topics`, the PSF's
  text shipped inside CPython's standard library);
- `gpl3`: the GNU GPL v3 (/usr/share/common-licenses/GPL-3, Debian's base-files);
- `mpl2`: the Mozilla Public License 2.0 (/usr/share/common-licenses/MPL-2.0).
No form here is calibrated on text; if one ever is, it must not use these.

llama-perplexity and llama-tokenize come from benchmarks/peers/install_llama_cpp.sh (their
folder is $LLAMA_CPP_BIN or that script's default). llama.cpp tokenizes the text itself,
and its "smollm" pre-tokenizer splits whitespace runs differently from HF's tokenizer (and
ours, which matches HF's): fewer tokens (MPL-2.0: 3669 against 3712), so other windows.
Its perplexity is therefore also given against our float32 on llama.cpp's own tokens
(from llama-tokenize): the loss of its Q4_1 kernels on the same token windows.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

N_CTX = 512
PYREF_SECTIONS = ("assignment", "class", "exprlists", "for", "function", "import", "try",
                  "with", "if", "while", "compound", "execmodel", "naming")
# name: (dtype, kv_dtype, quantization)
# name -> (weight dtype, KV dtype, quantization, deterministic inference); "default" is
# what EngineConfig() resolves to on this machine (engine/config.py serving_form)
CONFIGS = {
    "f32": ("float32", "float32", "none", False),
    "default": None,
    "w8a8+bf16kv": ("float32", "bfloat16", "w8a8_int8", False),
    "w8a8": ("float32", "float32", "w8a8_int8", False),
    "w8a16": ("float32", "float32", "w8a16_int8", False),
    "w8a16+bf16kv": ("float32", "bfloat16", "w8a16_int8", False),
    # the file's own blocks in the products (model/gguf_blocks.py), bf16 KV, deterministic
    "gguf": ("float32", "bfloat16", "gguf", True),
}
GREEDY_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three primary colours.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Give me a short tip for staying focused while studying.",
    "Translate 'good morning' into Spanish and French.",
    "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.",
    "Why is the sky blue?",
    "Write one sentence about autumn.",
    "What is the difference between a list and a tuple?",
    "Name a famous painting and its painter.",
    "Suggest a name for a small bakery.",
    "What does HTTP stand for?",
)


def texts() -> dict[str, str]:
    import pydoc_data.topics as topics

    lic = Path("/usr/share/common-licenses")
    return {
        "pyref": "\n\n".join(topics.topics[k] for k in PYREF_SECTIONS),
        "gpl3": (lic / "GPL-3").read_text(),
        "mpl2": (lic / "MPL-2.0").read_text(),
    }


def windows(ids: list[int], chunks: int, bos: int | None) -> list[np.ndarray]:
    out = []
    for c in range(min(chunks, len(ids) // N_CTX)):
        w = np.asarray(ids[c * N_CTX:(c + 1) * N_CTX], np.int32)
        if bos is not None:
            w[0] = bos
        out.append(w)
    return out


def window_nll(logits: np.ndarray, w: np.ndarray) -> np.ndarray:
    """logits [N_CTX, V] of window w -> NLL of tokens first+1 .. N_CTX-1 (llama.cpp's)."""
    first = N_CTX // 2
    x = logits[first:N_CTX - 1].astype(np.float64)
    m = x.max(-1, keepdims=True)
    logz = (m[:, 0] + np.log(np.exp(x - m).sum(-1)))
    return logz - x[np.arange(len(x)), w[first + 1:]]


def default_form(source: str) -> tuple[str, str, str, bool]:
    """The default serving form here for the model at `source`: EngineConfig()'s,
    resolved on JAX's backend (a GGUF file: the gguf form, where it has the handler)."""
    import jax

    from radixjax.engine.config import EngineConfig, serving_form
    from radixjax.loaders import blocks_servable

    form = serving_form(EngineConfig(), jax.default_backend(), gguf=blocks_servable(source))
    return EngineConfig().dtype, form.kv_dtype, form.quantization, form.deterministic


def ours(model, name: str, wins: dict[str, list[np.ndarray]]) -> tuple[dict, object]:
    from radixjax.runtime.batch import RequestSlice, build_batch
    from radixjax.runtime.model_runner import ModelRunner, RunnerConfig

    dtype, kv, quant, det = CONFIGS[name] or default_form(model.source)
    params = model.params
    if quant == "gguf":  # the same file, its matrices left in their blocks
        from radixjax.loaders import load_model

        params = load_model(model.source, load_tokenizer=False, gguf_blocks=True).params
    runner = ModelRunner(model.cfg, params, RunnerConfig(
        num_slots=2048, max_batch_tokens=N_CTX, max_running=4, max_context=1024,
        kv_dtype=kv, quantization=quant, deterministic=det))
    slots = np.arange(1, N_CTX + 1, dtype=np.int32)
    res = {}
    for text, ws in wins.items():
        nll = [window_nll(runner.all_logits(build_batch([RequestSlice(w, slots)],
                                                        runner.buckets)), w) for w in ws]
        res[text] = math.exp(float(np.concatenate(nll).mean()))
    return res, runner


def hf(wins: dict[str, list[np.ndarray]], path: Path) -> dict[str, float]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    res = {}
    with torch.no_grad():
        for text, ws in wins.items():
            nll = [window_nll(model(torch.tensor(w[None].astype(np.int64))).logits[0].numpy(),
                              w) for w in ws]
            res[text] = math.exp(float(np.concatenate(nll).mean()))
    return res


def llama_bin(tool: str) -> str:
    return str(Path(os.environ.get("LLAMA_CPP_BIN", str(
        Path.home() / ".cache/radixjax-peers/llama.cpp/build/bin"))) / tool)


def llama_tokens(raw: dict[str, str], path: Path) -> dict[str, list[int]]:
    """Each text as llama.cpp tokenizes it (llama-tokenize --ids)."""
    res = {}
    for text, body in raw.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(body)
            f.flush()
            out = subprocess.run([llama_bin("llama-tokenize"), "-m", str(path),
                                  "-f", f.name, "--ids", "--log-disable"],
                                 capture_output=True, text=True, check=True).stdout
        res[text] = [int(t) for t in out.strip().splitlines()[-1].strip("[]").split(",")]
    return res


def llama_perplexity(raw: dict[str, str], chunks: int, path: Path) -> dict[str, float]:
    exe = llama_bin("llama-perplexity")
    res = {}
    for text, body in raw.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(body)
            f.flush()
            out = subprocess.run(
                [exe, "-m", str(path), "-f", f.name, "-c", str(N_CTX),
                 "-b", str(N_CTX), "--chunks", str(chunks), "-t", "2", "-fa", "off"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
        if m is None:
            raise RuntimeError(f"llama-perplexity gave no estimate for {text}:\n{out[-2000:]}")
        res[text] = float(m.group(1))
    return res


def greedy(model, runner, tokens: int) -> list[list[int]]:
    from radixjax.runtime.simple_generate import generate_tokens
    from radixjax.sampling.params import SamplingParams

    tok = model.tokenizer
    sp = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    outs = []
    for p in GREEDY_PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        outs.append(list(generate_tokens(runner, ids, sp,
                                         eos_token_ids=(tok.eos_token_id,))))
    return outs


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[int, float]:
    """(prompts whose greedy tokens equal the reference's, mean share of the reference's
    tokens matched before the first difference)."""
    same = sum(a == b for a, b in zip(ref, got, strict=True))
    share = [next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b))) / max(len(a), 1) for a, b in zip(ref, got, strict=True)]
    return same, float(np.mean(share))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=8, help="512-token windows per text")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--greedy-tokens", type=int, default=48)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--model", default=None, help="a GGUF path or packaged name: gemma3-270m, "
                    "qwen2.5-coder-1.5b, qwen2.5-coder-0.5b (default: SmolLM2)")
    args = ap.parse_args()

    from radixjax.loaders import load_model, resolve_model_path

    path = resolve_model_path(args.model)
    model = load_model(path)
    tok = model.tokenizer
    raw = texts()
    bos = tok.bos_token_id if getattr(tok, "add_bos_token", False) else None
    ids = {k: tok.encode(v, add_special_tokens=False) for k, v in raw.items()}
    wins = {k: windows(v, args.chunks, bos) for k, v in ids.items()}
    print("texts (tokens, windows):", {k: (len(ids[k]), len(wins[k])) for k in ids})

    rows: dict[str, dict[str, float]] = {}
    extra: dict[str, str] = {}
    if not args.no_hf:
        t = time.time()
        rows["HF transformers f32"] = hf(wins, path)
        extra["HF transformers f32"] = f"{time.time() - t:.0f} s"
    ref_tokens = None
    for name in args.configs.split(","):
        t = time.time()
        rows[f"radixjax {name}"], runner = ours(model, name, wins)
        outs = greedy(model, runner, args.greedy_tokens) if args.greedy_tokens else None
        if ref_tokens is None and outs is not None:
            ref_tokens = outs  # the first config (f32 by default) is the reference
        if outs is not None:
            same, share = agreement(ref_tokens, outs)
            extra[f"radixjax {name}"] = (f"{same}/{len(outs)} equal, {share:.0%} of tokens "
                                         f"before the first difference")
        del runner
        print(f"  {name}: {time.time() - t:.0f} s", flush=True)
    bases = {}
    if not args.no_llama:
        rows["llama.cpp llama-perplexity"] = llama_perplexity(raw, args.chunks, path)
        lids = llama_tokens(raw, path)
        print("llama.cpp's tokens:", {k: len(v) for k, v in lids.items()})
        lwins = {k: windows(v, args.chunks, bos) for k, v in lids.items()}
        rows["radixjax f32 on llama.cpp's tokens"] = ours(model, "f32", lwins)[0]
        bases["llama.cpp llama-perplexity"] = rows["radixjax f32 on llama.cpp's tokens"]
        bases["radixjax f32 on llama.cpp's tokens"] = bases["llama.cpp llama-perplexity"]

    ref = rows.get("HF transformers f32", rows.get("radixjax f32"))
    cols = list(wins)
    print()
    print("| config | " + " | ".join(f"ppl {c}" for c in cols) +
          " | mean vs reference | greedy vs the first config |")
    print("|---|" + "---:|" * len(cols) + "---:|---|")
    for name, r in rows.items():
        base = bases.get(name, ref)
        rel = np.mean([r[c] / base[c] - 1 for c in cols]) * 100
        print(f"| {name} | " + " | ".join(f"{r[c]:.3f} ({(r[c] / base[c] - 1) * 100:+.2f} %)"
                                          for c in cols) +
              f" | {rel:+.2f} % | {extra.get(name, '')} |")
    print(f"\nreference: {'HF transformers f32' if 'HF transformers f32' in rows else 'ours f32'}"
          " (llama.cpp's rows: ours f32 on llama.cpp's tokens);"
          f" {args.chunks} windows of {N_CTX} a text, second halves scored")


if __name__ == "__main__":
    main()
