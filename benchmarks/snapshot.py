"""What a /dashboard refresh costs the scheduler: Engine.snapshot's work (engine/snapshot.py
scheduler_snapshot: the tree walk, its largest nodes' texts, the queues), on the
scheduler's loop between two steps, at 10k and 100k cached tokens.

    .venv/bin/python benchmarks/snapshot.py

The tree: system prompts of 512 tokens, each with 24 conversations of 40-token turns
below it (a chat service's shape), 32 running requests through it; the texts decoded by
SmolLM2's tokenizer. Median of 20 snapshots.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import numpy as np

from radixjax.cache.manager import KVCacheManager
from radixjax.engine.snapshot import scheduler_snapshot
from radixjax.loaders import load_model


def _scheduler(cached_tokens: int, rng: np.random.Generator) -> SimpleNamespace:
    kvm = KVCacheManager(cached_tokens * 2 + 4096)
    running = []
    while kvm.tree.total_size() < cached_tokens:
        system = list(rng.integers(100, 40000, 512))
        for _ in range(24):
            tokens = system + list(rng.integers(100, 40000, 40))
            m = kvm.match_and_lock(tokens)
            slots = np.concatenate([m.slots, kvm.alloc(len(tokens) - m.num_tokens)])
            kvm.cache_finished(tokens, slots, m.last_node)
    for i in range(32):  # running requests, each through a cached system prompt
        node = next(n for k, n in enumerate(kvm.tree.iter_nodes()) if k >= i)
        running.append(SimpleNamespace(
            rid=f"req-{i}", prompt_ids=[0] * 600, num_computed=600, num_generated=10,
            last_node=node, stats=SimpleNamespace(cached_tokens=512, arrival=0.0),
            sampling=SimpleNamespace(max_new_tokens=64)))
    return SimpleNamespace(kvm=kvm, running=running, waiting=[])


def main() -> None:
    tokenizer = load_model(None).tokenizer
    rng = np.random.default_rng(0)
    print("| cached tokens | tree nodes | snapshot ms (median of 20) | max |")
    print("|---:|---:|---:|---:|")
    for tokens in (10_000, 100_000):
        s = _scheduler(tokens, rng)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            snap = scheduler_snapshot(s, tokenizer)
            times.append(time.perf_counter() - start)
        print(f"| {s.kvm.tree.total_size():,} | {snap['tree']['num_nodes']:,} "
              f"| {1e3 * statistics.median(times):.2f} | {1e3 * max(times):.2f} |")


if __name__ == "__main__":
    main()
