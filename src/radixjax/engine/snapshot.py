"""A scheduler's state as plain data (JSON-ready): the radix tree (its largest nodes),
the running and waiting requests, the KV pool. What the server's /dashboard draws, the
notebook's tree drawing and the tests read (Engine.snapshot), instead of code reaching
into the scheduler. Read on the scheduler's loop, between steps; O(tree nodes)."""

from __future__ import annotations

import time
from typing import Any

from radixjax.cache.tree_node import TreeNode

MAX_NODES = 64  # the largest nodes (by the tokens under them) a snapshot draws
TEXT_TOKENS = 48  # a node's text: its first tokens, decoded


def scheduler_snapshot(s: Any, tokenizer: Any = None, max_nodes: int = MAX_NODES) -> dict:
    """s: an engine/scheduler.Scheduler. The tree: the max_nodes nodes with the most
    tokens under them (a parent always has more than its children, so the set is whole
    up to the roots), each with its tokens, lock count, the running requests whose
    cached prefix runs through it and the text of its first tokens."""
    kvm = s.kvm
    alloc, tree = kvm.allocator, kvm.tree
    pool = dict(usable=alloc.num_usable_slots, free=alloc.num_free_slots,
                evictable=tree.evictable_size(), protected=tree.protected_size(),
                held=kvm.num_held)
    if kvm.window is not None:
        pool["window_usable"] = kvm.window.allocator.num_usable_slots
        pool["window_used"] = kvm.window.num_used_slots()
    return dict(pool=pool, tree=_tree(s, tokenizer, max_nodes),
                running=[_running(r) for r in s.running],
                waiting=[_waiting(r) for r in s.waiting])


def _running(r: Any) -> dict:
    return dict(rid=r.rid, prompt_tokens=len(r.prompt_ids),
                cached_tokens=r.stats.cached_tokens, computed_tokens=r.num_computed,
                generated_tokens=r.num_generated, max_new_tokens=r.sampling.max_new_tokens)


def _waiting(r: Any) -> dict:
    return dict(rid=r.rid, prompt_tokens=len(r.prompt_ids),
                waiting_s=round(time.perf_counter() - r.stats.arrival, 3))


def _tree(s: Any, tokenizer: Any, max_nodes: int) -> dict:
    tree = s.kvm.tree
    roots = [tree.root(ns) for ns in tree.namespaces()]
    under: dict[int, int] = {}  # node id -> tokens in its subtree
    order: list[TreeNode] = []  # parents before children
    stack = [n for root in roots if root is not None for n in root.children.values()]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    for node in reversed(order):
        under[id(node)] = node.key.size + sum(under[id(c)] for c in node.children.values())
    kept = sorted(order, key=lambda n: -under[id(n)])[:max_nodes]
    users: dict[int, list[str]] = {}  # node id -> rids of running requests through it
    for r in s.running:
        node = r.last_node
        while node is not None and not node.is_root:
            users.setdefault(id(node), []).append(r.rid)
            node = node.parent
    nodes = []
    for node in kept:
        parent = node.parent
        nodes.append(dict(
            id=node.node_id, parent=None if parent is None or parent.is_root else parent.node_id,
            namespace=None if node.namespace is None else str(node.namespace),
            tokens=int(node.key.size), subtree_tokens=under[id(node)],
            lock_ref=node.lock_ref, evictable=node.lock_ref == 0,
            requests=users.get(id(node), []), text=_text(node, tokenizer)))
    return dict(num_nodes=len(order), cached_tokens=tree.total_size(),
                shown_nodes=len(nodes), nodes=nodes)


def _text(node: TreeNode, tokenizer: Any) -> str:
    ids = node.key[:TEXT_TOKENS].tolist()
    if tokenizer is None:
        return " ".join(map(str, ids))
    text = tokenizer.decode(ids)
    return text + ("…" if node.key.size > TEXT_TOKENS else "")
