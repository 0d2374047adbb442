"""One-stream decode speed vs context depth: ours at two revisions (before / after a
change, through the public Engine API, which both have) next to llama-server at the same
depths, side by side in one run.

    .venv/bin/python benchmarks/decode_depth.py [--base REV] [--llama-url URL]
        [--depths 128 1024 4000] [--new-tokens 32]

--base REV checks REV out in a temporary git worktree and runs the same measurement with
that revision's code (this file's own code runs both). The VM's speed drifts (CPU steal),
so --rounds alternating runs are made and each column keeps its best. --llama-url: a running
llama-server (benchmarks/peers/start_llama_server.sh --parallel 1 --ctx-per-slot 4608).

Each depth: a random prompt of that many tokens, prefilled once untimed (it compiles
whatever the revision compiles, and fills the cache), then the same prompt again with
`new-tokens` greedy tokens, timed from the first token to the last (decode only; the
prefill is cached the second time). llama-server: its own `timings.predicted_per_second`
for the same prompt and token count (its prompt cache makes the second run decode-only
as well).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def prompt_ids(depth: int, vocab: int = 49152) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(depth).integers(100, vocab - 100, depth)]


def measure_engine(depths: list[int], new_tokens: int) -> dict[int, float]:
    """tok/s of the decode phase per depth, with whatever radixjax is importable."""
    import radixjax

    max_context = max(depths) + new_tokens + 64
    out: dict[int, float] = {}
    with radixjax.Engine(max_context=max_context, num_slots=2 * max_context + 8,
                         max_running=4) as engine:
        for depth in depths:
            ids = prompt_ids(depth)
            sp = radixjax.SamplingParams(max_new_tokens=new_tokens, temperature=0,
                                         ignore_eos=True)
            engine.generate(ids, sp)  # untimed: compiles, and caches the prompt
            r = engine.generate(ids, sp)
            st = r.stats
            out[depth] = (r.completion_tokens - 1) / (st.finished - st.first_token)
    return out


def measure_llama(url: str, depths: list[int], new_tokens: int) -> dict[int, float]:
    import httpx

    out: dict[int, float] = {}
    for depth in depths:
        body = {"prompt": prompt_ids(depth), "n_predict": new_tokens, "temperature": 0,
                "ignore_eos": True, "cache_prompt": True}
        for _ in range(2):  # the first run prefills; the second is decode-only
            r = httpx.post(f"{url}/completion", json=body, timeout=600).json()
        out[depth] = float(r["timings"]["predicted_per_second"])
    return out


def run_engine(tree: Path, depths: list[int], new_tokens: int) -> dict[int, float]:
    """measure_engine in a subprocess with the radixjax of `tree` (this file's code)."""
    cmd = [sys.executable, __file__, "--engine-only", "--new-tokens", str(new_tokens),
           "--depths", *map(str, depths)]
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}:{tree}")
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tree, env=env)
    return {int(k): v for k, v in json.loads(res.stdout.splitlines()[-1]).items()}


@contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """REV in a temporary git worktree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "rev"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], check=True,
                       cwd=ROOT, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="git revision to compare against (the 'before')")
    ap.add_argument("--llama-url", help="a running llama-server, e.g. http://127.0.0.1:30001")
    ap.add_argument("--depths", type=int, nargs="+", default=[128, 1024, 4000])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs; best kept")
    ap.add_argument("--engine-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine_only:
        print(json.dumps(measure_engine(args.depths, args.new_tokens)))
        return
    cols: dict[str, dict[int, float]] = {}
    with ExitStack() as stack:
        trees = {"after (this tree)": ROOT}
        if args.base:
            trees = {f"before ({args.base})": stack.enter_context(checkout(args.base)), **trees}
        # Rounds alternate the revisions (the VM's speed drifts); each keeps its best.
        for _ in range(args.rounds):
            for name, tree in trees.items():
                got = run_engine(tree, args.depths, args.new_tokens)
                best = cols.setdefault(name, got)
                cols[name] = {d: max(best[d], got[d]) for d in args.depths}
    if args.llama_url:
        runs = [measure_llama(args.llama_url, args.depths, args.new_tokens)
                for _ in range(args.rounds)]
        cols["llama-server -fa off"] = {d: max(r[d] for r in runs) for d in args.depths}
    names = list(cols)
    print("| context | " + " | ".join(f"{n} tok/s" for n in names) + " |")
    print("|---:|" + "---:|" * len(names))
    for d in args.depths:
        print(f"| {d} | " + " | ".join(f"{cols[n][d]:.1f}" for n in names) + " |")
    for n in names:
        first, last = cols[n][args.depths[0]], cols[n][args.depths[-1]]
        print(f"{n}: decode at {args.depths[-1]} is {first / last:.2f}x slower than at "
              f"{args.depths[0]}")


if __name__ == "__main__":
    main()
