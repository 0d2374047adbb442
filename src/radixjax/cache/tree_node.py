"""TreeNode and the result records of `RadixCache` (see radix_cache.py)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

ChildKey = int | bytes  # first token (P == 1) or the bytes of the first page (P > 1)


class TreeNode:
    """One edge of the trie: `key` tokens whose KV lives in `value` slots.

    Mutated only by `RadixCache`. Holds for every non-root node: ``key.size == value.size``,
    both non-empty multiples of the page size; ``lock_ref`` >= the sum of its children's
    (each lock increments a whole path); ``last_access`` >= any child's.
    """

    __slots__ = (
        "key",
        "value",
        "children",
        "parent",
        "lock_ref",
        "last_access",
        "namespace",
        "node_id",
        "is_in_heap",
        "is_evicted",
    )

    def __init__(
        self,
        key: np.ndarray,  # [n] int32
        value: np.ndarray,  # [n] int64
        parent: TreeNode | None,
        namespace: Hashable | None,
        node_id: int,
        last_access: int = 0,
        lock_ref: int = 0,
    ) -> None:
        self.key = key
        self.value = value
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.namespace = namespace
        self.node_id = node_id  # deterministic heap tie-break
        self.is_in_heap = False  # has an entry in the eviction heap (maybe a stale one)
        self.is_evicted = False

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.node_id}, len={self.key.size}, lock_ref={self.lock_ref}, "
            f"children={len(self.children)}, last_access={self.last_access})"
        )


class MatchResult(NamedTuple):
    slots: np.ndarray  # [num_tokens] int64: KV slots of the longest cached (aligned) prefix
    last_node: TreeNode  # deepest matched node (maybe a root); lock it while using `slots`

    @property
    def num_tokens(self) -> int:
        return int(self.slots.size)


class InsertResult(NamedTuple):
    num_existing: int  # aligned prefix tokens the tree already held before this insert
    num_inserted: int  # tokens added; their slots now belong to the tree
    num_duplicates_freed: int  # caller slots in the existing prefix that differed: freed
    last_node: TreeNode  # node ending the inserted (aligned) sequence
