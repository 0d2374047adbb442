"""Streaming detokenization cost per token vs output length: the full re-decode the engine
did before (the whole output decoded for the stream and again for stop strings, every
token) next to the incremental detokenizer and stop matcher (engine/detokenizer.py).

    .venv/bin/python benchmarks/detokenize.py [--lengths 100 1000 8000]

The output is SmolLM2's tokenization of mixed text (prose, code, non-ASCII), pushed one
token at a time with one stop string that never matches, as a stream with `stop` set.
"""

from __future__ import annotations

import argparse
import time

from radixjax.engine.detokenizer import IncrementalDetokenizer, StopMatcher
from radixjax.loaders import load_model

TEXT = ("The quick brown fox jumps over the lazy dog. ünïcödé 日本語 🙂 "
        "def f(x):\n    return x ** 2\n")
STOP = ("<never>",)


def full_redecode(tok, ids: list[int]) -> float:
    """Before: per token, decode everything for the stream and again for stop strings."""
    t0 = time.perf_counter()
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n], skip_special_tokens=True)
        _ = [text.find(s) for s in STOP]
        _ = tok.decode(ids[:n], skip_special_tokens=True)
    return (time.perf_counter() - t0) / len(ids)


def incremental(tok, ids: list[int]) -> float:
    t0 = time.perf_counter()
    detok, stops = IncrementalDetokenizer(tok), StopMatcher(STOP)
    for t in ids:
        stops.push(detok.push([t]))
    stops.push(detok.flush())
    return (time.perf_counter() - t0) / len(ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[100, 1000, 8000])
    args = ap.parse_args()
    tok = load_model(None).tokenizer
    base = tok(TEXT, add_special_tokens=False).input_ids
    print("| output tokens | full re-decode, us/token | incremental, us/token | ratio |")
    print("|---|---|---|---|")
    for n in args.lengths:
        ids = (base * (n // len(base) + 1))[:n]
        before, after = full_redecode(tok, ids), incremental(tok, ids)
        print(f"| {n} | {before * 1e6:.0f} | {after * 1e6:.0f} | {before / after:.0f}x |",
              flush=True)


if __name__ == "__main__":
    main()
