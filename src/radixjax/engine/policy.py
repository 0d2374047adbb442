"""Waiting-queue order: LPM (longest cached prefix first), DFS-weight (the most shared
branches of the cache first), FCFS; the cache-aware ones fall back to FCFS past a queue
length. In-batch prefix caching: of several waiting requests that start with the same
uncached run of tokens, only the first is admitted this round; the rest reuse its KV
next round."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from radixjax.cache.radix_cache import RadixCache
from radixjax.cache.tree_node import TreeNode
from radixjax.engine.request import Req


class Ordered(NamedTuple):
    reqs: list[Req]  # in admission order
    deferred: set[int]  # id(req) of requests to hold back this round


def match_tokens(req: Req) -> list[int]:
    """What to look up: all known tokens but the last, so at least one is computed. A
    request with penalties matches its prompt only: its outputs are re-fed so the device
    can count them again after a retraction (runtime/penalties.py). A request scoring its
    prompt from position p matches at most p - 1 tokens: position p's logprob comes from
    the logits at p - 1, which only a computed (not cached) token has."""
    if req.sampling.scores_prompt:  # the scored span is computed: logits before it too
        return req.all_ids[: max(req.sampling.logprob_start_len - 1, 0)]
    if req.sampling.has_penalties:
        return req.all_ids[: min(len(req.prompt_ids), req.seq_len - 1)]
    return req.all_ids[:-1]


class SchedulePolicy:
    def __init__(self, name: str, tree: RadixCache | None, fcfs_threshold: int,
                 in_batch_prefix_min: int) -> None:
        self.name = name
        self.tree = tree  # None: cache off, every policy is FCFS
        self.fcfs_threshold = fcfs_threshold
        self.in_batch_prefix_min = in_batch_prefix_min

    def effective(self, num_waiting: int) -> str:
        if self.tree is None or self.name == "fcfs" or num_waiting > self.fcfs_threshold:
            return "fcfs"
        return self.name

    def order(self, waiting: list[Req], in_progress: list[Req] = ()) -> Ordered:
        """`in_progress`: requests prefilling in this step; their prompts are cached right
        after it, so waiting requests that share a cold prefix with them wait a round."""
        policy = self.effective(len(waiting))
        if policy == "fcfs":
            return Ordered(list(waiting), set())
        assert self.tree is not None
        matches = {id(r): self.tree.match_prefix(match_tokens(r), r.namespace) for r in waiting}
        if policy == "lpm":
            reqs = sorted(waiting, key=lambda r: -matches[id(r)].slots.size)  # stable
        else:
            reqs = _dfs_weight_order(waiting, {k: m.last_node for k, m in matches.items()})
        return Ordered(reqs, self._in_batch_deferred(reqs, matches, in_progress))

    def _in_batch_deferred(self, reqs: list[Req], matches: dict,
                           in_progress: list[Req]) -> set[int]:
        n = self.in_batch_prefix_min
        seen: set[tuple] = set()
        deferred: set[int] = set()
        for r in reqs:
            cached = matches[id(r)].slots.size
            ids = match_tokens(r)
            if len(ids) < cached + n:
                continue
            head = tuple(ids[: cached + n])
            key = (r.namespace, head)
            if key in seen or any(q.namespace == r.namespace
                                  and tuple(q.all_ids[: cached + n]) == head
                                  for q in in_progress):
                deferred.add(id(r))
            seen.add(key)
        return deferred


def _dfs_weight_order(waiting: list[Req], last_nodes: dict[int, TreeNode]) -> list[Req]:
    """Walk the cache tree depth-first, heaviest child first; a node's weight is the
    number of waiting requests whose matched prefix ends in its subtree."""
    weight: dict[int, int] = defaultdict(int)
    attached: dict[int, list[Req]] = defaultdict(list)
    children: dict[int, list[TreeNode]] = defaultdict(list)
    roots: list[TreeNode] = []
    nodes: dict[int, TreeNode] = {}
    for r in waiting:
        node = last_nodes[id(r)]
        attached[id(node)].append(r)
        while node is not None:
            if id(node) not in nodes:
                nodes[id(node)] = node
                if node.parent is None:
                    roots.append(node)
                else:
                    children[id(node.parent)].append(node)
            weight[id(node)] += 1
            node = node.parent
    out: list[Req] = []
    stack = sorted(roots, key=lambda n: weight[id(n)])
    while stack:
        node = stack.pop()
        out.extend(attached[id(node)])
        stack.extend(sorted(children[id(node)], key=lambda n: weight[id(n)]))
    return out
