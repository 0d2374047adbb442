"""`RadixCache.check_integrity`: recompute everything the tree tracks incrementally.

Kept apart from `radix_cache.py` so the data structure reads without the audit. It reads
the cache's private fields on purpose: it checks them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np

from radixjax.cache.errors import require
from radixjax.cache.tree_node import ChildKey, TreeNode


class AuditedTree(Protocol):
    """What the audit reads of a RadixCache (radix_cache.py), private fields included."""

    allocator: Any  # KVSlotAllocator: num_slots, is_free, pages_to_slots
    page_size: int
    _roots: dict[Hashable | None, TreeNode]
    _heap: list[tuple[int, int, TreeNode]]
    _clock: int
    _evictable_size: int
    _protected_size: int

    def _child_key(self, tokens: np.ndarray, pos: int) -> ChildKey: ...


def check_radix_cache(cache: AuditedTree) -> None:
    """Raise `CacheIntegrityError` unless all of these hold:

    - roots: one per namespace, empty key, no parent, never locked; a non-default
      namespace's root has children (empty ones are pruned);
    - links: every child's parent is the node holding it, under the key of its first
      token/page; no evicted node is reachable;
    - nodes: non-empty key and value of equal length, a multiple of the page size, value
      slots made of whole pages; ``lock_ref >= sum(children's lock_ref) >= 0``;
      ``last_access`` never grows towards the leaves;
    - sizes: evictable / protected counters equal the sums over unlocked / locked nodes;
    - slots: distinct across the tree, outside the dummy page, in range, none marked free
      in the allocator;
    - heap: at most one entry per node, exactly the nodes flagged `is_in_heap`, every
      unlocked leaf among them, no entry newer than its node.
    """
    page_size = cache.page_size
    num_evictable = num_protected = 0
    values: list[np.ndarray] = []
    nodes: list[TreeNode] = []
    for namespace, root in cache._roots.items():
        require(root.is_root and root.key.size == 0, f"bad root for namespace {namespace!r}")
        require(root.namespace == namespace, "root filed under the wrong namespace")
        require(root.lock_ref == 0 and not root.is_evicted, "root locked or evicted")
        require(namespace is None or bool(root.children), f"empty root kept for {namespace!r}")
        stack = [root]
        while stack:
            node = stack.pop()
            child_lock_sum = 0
            for child_key, child in node.children.items():
                _check_node(cache, node, child_key, child)
                child_lock_sum += child.lock_ref
                stack.append(child)
            if not node.is_root:
                require(
                    child_lock_sum <= node.lock_ref,
                    f"{node!r}: children hold more locks than the node",
                )
                nodes.append(node)
                values.append(node.value)
                if node.lock_ref:
                    num_protected += node.key.size
                else:
                    num_evictable += node.key.size
    require(
        num_evictable == cache._evictable_size,
        f"evictable_size {cache._evictable_size} != recomputed {num_evictable}",
    )
    require(
        num_protected == cache._protected_size,
        f"protected_size {cache._protected_size} != recomputed {num_protected}",
    )

    slots = np.concatenate(values) if values else np.zeros(0, dtype=np.int64)
    if slots.size:
        require(np.unique(slots).size == slots.size, "a KV slot is held by two tree positions")
        require(int(slots.min()) >= page_size, "the tree holds a slot of the dummy page")
        require(int(slots.max()) < cache.allocator.num_slots, "tree slot out of range")
        require(not cache.allocator.is_free(slots).any(), "the tree holds a freed slot")
    _check_heap(cache, nodes)


def _check_node(cache: AuditedTree, parent: TreeNode, child_key: object, node: TreeNode) -> None:
    page_size = cache.page_size
    require(node.parent is parent, f"{node!r}: parent link broken")
    require(not node.is_evicted, f"{node!r}: evicted node still linked")
    require(node.namespace == parent.namespace, f"{node!r}: namespace differs from parent")
    require(node.key.size > 0, f"{node!r}: empty key below the root")
    require(node.key.dtype == np.int32 and node.value.dtype == np.int64, "bad key/value dtype")
    require(node.key.shape == node.value.shape, f"{node!r}: key and value lengths differ")
    require(node.key.size % page_size == 0, f"{node!r}: key not page aligned")
    require(cache._child_key(node.key, 0) == child_key, f"{node!r}: filed under a wrong key")
    require(node.lock_ref >= 0, f"{node!r}: negative lock_ref")
    require(node.last_access <= cache._clock, f"{node!r}: access time in the future")
    if not parent.is_root:
        require(node.last_access <= parent.last_access, f"{node!r}: touched after its parent")
    if page_size > 1:
        pages = node.value[::page_size] // page_size
        expected = cache.allocator.pages_to_slots(pages)
        require(np.array_equal(node.value, expected), f"{node!r}: value not whole pages")


def _check_heap(cache: AuditedTree, nodes: list[TreeNode]) -> None:
    entry_ids = [node.node_id for _, _, node in cache._heap]
    require(len(set(entry_ids)) == len(entry_ids), "a node has two heap entries")
    for access, node_id, node in cache._heap:
        require(node.node_id == node_id, "heap entry tie-break differs from its node id")
        require(node.is_in_heap and not node.is_evicted, f"{node!r}: stray heap entry")
        require(access <= node.last_access, f"{node!r}: heap entry newer than the node")
    flagged = {node.node_id for node in nodes if node.is_in_heap}
    require(flagged == set(entry_ids), "is_in_heap flags disagree with the heap")
    for node in nodes:
        if node.is_leaf and node.lock_ref == 0:
            require(node.is_in_heap, f"{node!r}: evictable leaf missing from the heap")
