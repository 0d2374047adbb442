"""Radix cache benchmark: prefix hit rates vs a vLLM-style hashed block cache, and latency.

Run:  PYTHONPATH=src python benchmarks/radix_cache.py

1. Token hit rate (cached prompt tokens / prompt tokens) on three synthetic traces, same KV
   budget for every cache:
   - system_prompts: many requests over a few long system prompts (skewed popularity);
   - multi_turn: interleaved chats, each turn's prompt = previous prompt + answer + new
     user message;
   - few_shot_tree: instruction + 3 levels of few-shot example choices (a branching tree)
     + a unique question.
   Requests run one at a time: match, allocate, "generate" the output, cache prompt +
   output. The block cache is the vLLM (v1) scheme: block 16, full blocks only, each
   block keyed by the hash of its tokens chained with its parent's hash, freed blocks
   queued LRU (a request's blocks in reverse order, tail first) and evicted on reuse.
2. Latency: µs per match_prefix + insert of one request vs prompt length and tree size.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from radixjax.cache import KVCacheManager

VOCAB = 32000


class Request(NamedTuple):
    prompt: np.ndarray  # [prompt_len] int32
    output: np.ndarray  # [output_len] int32, appended before caching


class Trace(NamedTuple):
    name: str
    requests: list[Request]
    budget: int  # KV slots (tokens) every cache gets


def _tokens(rng: np.random.Generator, num: int) -> np.ndarray:
    return rng.integers(3, VOCAB, size=num, dtype=np.int32)


def system_prompts_trace(seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    systems = [_tokens(rng, 2048) for _ in range(4)]
    popularity = np.array([0.4, 0.3, 0.2, 0.1])
    requests = []
    for _ in range(600):
        system = systems[rng.choice(4, p=popularity)]
        user = _tokens(rng, int(rng.integers(50, 300)))
        requests.append(Request(np.concatenate([system, user]), _tokens(rng, 64)))
    return Trace("system_prompts", requests, budget=7000)  # ~3 of the 4 prompts fit


def multi_turn_trace(seed: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    system = _tokens(rng, 300)
    histories = [system.copy() for _ in range(40)]
    turns_left = [6] * 40
    requests = []
    while any(turns_left):
        chat = int(rng.choice([i for i, left in enumerate(turns_left) if left]))
        prompt = np.concatenate([histories[chat], _tokens(rng, int(rng.integers(30, 200)))])
        output = _tokens(rng, int(rng.integers(50, 300)))
        requests.append(Request(prompt, output))
        histories[chat] = np.concatenate([prompt, output])
        turns_left[chat] -= 1
    return Trace("multi_turn", requests, budget=20000)


def few_shot_tree_trace(seed: int = 2) -> Trace:
    rng = np.random.default_rng(seed)
    instruction = _tokens(rng, 400)
    levels = [[_tokens(rng, 300) for _ in range(4 ** (depth + 1))] for depth in range(3)]
    requests = []
    for _ in range(500):
        parts, index = [instruction], 0
        for depth in range(3):
            # Examples at depth d depend on the choice above them: a tree, not a product.
            index = index * 4 + int(rng.choice(4, p=[0.55, 0.25, 0.15, 0.05]))
            parts.append(levels[depth][index])
        parts.append(_tokens(rng, int(rng.integers(30, 80))))
        requests.append(Request(np.concatenate(parts), _tokens(rng, 32)))
    return Trace("few_shot_tree", requests, budget=8000)


# -- the two caches --------------------------------------------------------------------


def radix_hit_tokens(trace: Trace, page_size: int, budget: int | None = None) -> int:
    budget = trace.budget if budget is None else budget
    manager = KVCacheManager(budget - budget % page_size + page_size, page_size)
    num_hit = 0
    for req in trace.requests:
        match = manager.match_and_lock(req.prompt)
        num_hit += match.num_tokens
        full = np.concatenate([req.prompt, req.output])
        new = manager.alloc(manager.round_up(full.size - match.num_tokens))
        manager.cache_finished(full, np.concatenate([match.slots, new]), match.last_node)
    manager.check_integrity()
    return num_hit


class HashedBlockCache:
    """vLLM-style prefix caching: full blocks keyed by chained hashes, LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.block_size = block_size
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.hash_of: dict[int, int] = {}  # block id -> chained hash (cached blocks only)
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    def block_hashes(self, tokens: np.ndarray) -> Iterator[int]:
        parent = 0
        for start in range(0, tokens.size - tokens.size % self.block_size, self.block_size):
            parent = hash((parent, tokens[start : start + self.block_size].tobytes()))
            yield parent

    def run(self, req: Request) -> int:
        """Serve one request; returns its number of prompt tokens hit."""
        hit = []
        for block_hash in self.block_hashes(req.prompt):
            block = self.cached.get(block_hash)
            if block is None:
                break
            hit.append(block)
            del self.free_queue[block]  # in use now (ref count 1: one request at a time)
        full = np.concatenate([req.prompt, req.output])
        num_blocks = -(-full.size // self.block_size)
        new = [self._pop_free() for _ in range(num_blocks - len(hit))]
        blocks = hit + new
        for block, block_hash in zip(blocks, self.block_hashes(full), strict=False):
            if block not in self.hash_of and block_hash not in self.cached:
                self.cached[block_hash] = block
                self.hash_of[block] = block_hash
        for block in reversed(blocks):  # tail blocks are evicted first
            self.free_queue[block] = None
        return len(hit) * self.block_size

    def _pop_free(self) -> int:
        block, _ = self.free_queue.popitem(last=False)  # least recently freed
        block_hash = self.hash_of.pop(block, None)
        if block_hash is not None:
            del self.cached[block_hash]  # evict
        return block


def block_hit_tokens(trace: Trace) -> int:
    cache = HashedBlockCache(trace.budget // 16)
    return sum(cache.run(req) for req in trace.requests)


def hit_rate_table() -> str:
    rows = [
        "| trace | requests | prompt tokens | KV budget | radix P=1 | radix P=16 "
        "| vLLM-style blocks (16) | radix P=1, no eviction |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trace in (system_prompts_trace(), multi_turn_trace(), few_shot_tree_trace()):
        num_prompt = sum(req.prompt.size for req in trace.requests)
        unbounded = sum(r.prompt.size + r.output.size for r in trace.requests)
        rates = [
            radix_hit_tokens(trace, 1),
            radix_hit_tokens(trace, 16),
            block_hit_tokens(trace),
            radix_hit_tokens(trace, 1, budget=unbounded),
        ]
        cells = " | ".join(f"{100 * hits / num_prompt:.1f}%" for hits in rates)
        rows.append(
            f"| {trace.name} | {len(trace.requests)} | {num_prompt} | {trace.budget} | {cells} |"
        )
    return "\n".join(rows)


# -- latency ---------------------------------------------------------------------------


def build_tree(
    num_sequences: int, page_size: int, rng: np.random.Generator, room: int
) -> tuple[KVCacheManager, list[np.ndarray]]:
    """A tree of `num_sequences` 1k-token sequences, each branching off an earlier one."""
    seq_len = 1024
    manager = KVCacheManager(
        (num_sequences * seq_len + room) // page_size * page_size + page_size, page_size
    )
    sequences: list[np.ndarray] = []
    for _ in range(num_sequences):
        if sequences:
            base = sequences[int(rng.integers(len(sequences)))]
            keep = int(rng.integers(0, seq_len))
            tokens = np.concatenate([base[:keep], _tokens(rng, seq_len - keep)])
        else:
            tokens = _tokens(rng, seq_len)
        match = manager.tree.match_prefix(tokens)
        new = manager.allocator.alloc(manager.round_up(tokens.size - match.num_tokens))
        manager.tree.insert(tokens, np.concatenate([match.slots, new])[: tokens.size])
        sequences.append(tokens)
    return manager, sequences


def time_match_insert(
    manager: KVCacheManager,
    sequences: list[np.ndarray],
    prompt_len: int,
    rng: np.random.Generator,
    num_queries: int = 30,
) -> tuple[float, float]:
    """(median µs of match_prefix + insert, mean nodes on the inserted path) for prompts
    that branch off a cached sequence."""
    tree, page_size = manager.tree, manager.page_size
    samples, depths = [], []
    for _ in range(num_queries):
        base = sequences[int(rng.integers(len(sequences)))]
        keep = int(rng.integers(base.size // 2, base.size))
        query = np.concatenate([base[:keep], _tokens(rng, prompt_len - keep)])
        fresh = manager.allocator.alloc(manager.round_up(query.size))  # outside the timing
        start = time.perf_counter()
        match = tree.match_prefix(query)
        result = tree.insert(
            query, np.concatenate([match.slots, fresh[: query.size - match.num_tokens]])
        )
        samples.append(time.perf_counter() - start)
        depths.append(_depth(result.last_node))
        num_aligned = query.size - query.size % page_size
        manager.allocator.free(fresh[num_aligned - match.num_tokens :])  # not taken by the tree
    return float(np.median(samples) * 1e6), float(np.mean(depths))


def _depth(node) -> int:
    depth = 0
    while not node.is_root:
        node, depth = node.parent, depth + 1
    return depth


def latency_table(tree_sizes: list[int], prompt_lens: list[int], num_queries: int = 30) -> str:
    page_sizes = (1, 16)
    header = " | ".join(f"{n // 1024}k P={p}" for n in prompt_lens for p in page_sizes)
    rows = [
        f"| tree size (1k-token seqs) | {header} | nodes/path P=1 | nodes/path P=16 |",
        "|---:|" + "---:|" * (len(prompt_lens) * len(page_sizes) + 2),
    ]
    for size in tree_sizes:
        cells: dict[tuple[int, int], float] = {}
        depths: dict[int, float] = {}
        for page_size in page_sizes:
            rng = np.random.default_rng(size)
            room = sum(num_queries * (n + page_size) for n in prompt_lens)
            manager, sequences = build_tree(size, page_size, rng, room)
            for n in prompt_lens:
                cells[(n, page_size)], depths[page_size] = time_match_insert(
                    manager, sequences, n, rng, num_queries
                )
        row = " | ".join(f"{cells[(n, p)]:.0f}" for n in prompt_lens for p in page_sizes)
        rows.append(f"| {size} | {row} | {depths[1]:.0f} | {depths[16]:.0f} |")
    return "\n".join(rows)


def _timed(label: str, make: Callable[[], str]) -> str:
    start = time.perf_counter()
    table = make()
    print(f"### {label}  ({time.perf_counter() - start:.1f} s)\n\n{table}\n", flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree-sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    args = parser.parse_args()
    _timed("Token hit rate (higher is better)", hit_rate_table)
    _timed(
        "µs per match_prefix + insert (median of 30)",
        lambda: latency_table(args.tree_sizes, args.prompt_lens),
    )


if __name__ == "__main__":
    main()
