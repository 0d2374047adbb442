"""RadixCache: a compressed trie over token ids whose nodes own KV slots (RadixAttention).

    root(ns=None) ── [The cat sat] ──┬── [on the mat]        each edge is one TreeNode:
                                      └── [down]              key   = run of token ids
    root(ns="lora-7") ── [The cat sat]                        value = KV slots of that run

One root per namespace, so identical tokens under different namespaces (LoRA adapters,
cache salts) never share KV. Host-side only: numpy, never JAX.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator, Sequence

import numpy as np

from radixjax.cache.allocator import KVSlotAllocator
from radixjax.cache.errors import LockError
from radixjax.cache.radix_integrity import check_radix_cache
from radixjax.cache.tree_node import ChildKey, InsertResult, MatchResult, TreeNode

TokenIds = Sequence[int] | np.ndarray

_EMPTY_SLOTS = np.zeros(0, dtype=np.int64)
_EMPTY_SLOTS.setflags(write=False)
_EMPTY_TOKENS = np.zeros(0, dtype=np.int32)
_EMPTY_TOKENS.setflags(write=False)


class RadixCache:
    """Prefix cache over token ids; evicted and duplicate slots go back to `allocator`.

    Ownership: a slot is either free (in the allocator), owned by the tree (in exactly one
    node's value), or private to a running request. `insert` moves a request's new slots
    into the tree and frees its duplicates; `evict` and `reset` free tree slots.
    Sizes: ``evictable_size() + protected_size() == total_size()`` (slots in nodes with
    ``lock_ref == 0`` / ``> 0``).

    Page size P > 1: keys are matched and inserted in whole pages only; a tail of
    ``len(tokens) % P`` tokens is never cached (the caller keeps those slots).
    """

    def __init__(self, allocator: KVSlotAllocator) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self._node_ids = itertools.count()
        self._init_empty()

    def _init_empty(self) -> None:
        self._roots: dict[Hashable | None, TreeNode] = {None: self._new_root(None)}
        self._heap: list[tuple[int, int, TreeNode]] = []  # (last_access, node_id, node)
        self._clock = 0
        self._evictable_size = 0
        self._protected_size = 0

    # -- sizes ----------------------------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    # -- match / insert -------------------------------------------------------------------

    def match_prefix(self, tokens: TokenIds, namespace: Hashable | None = None) -> MatchResult:
        """Longest cached prefix of `tokens` (whole pages only). Touches the matched path.

        Splits the last node when the match ends inside it, so `last_node` covers exactly
        the matched tokens. Does not lock: call `inc_lock_ref(last_node)` to keep them.
        """
        tokens = _as_tokens(tokens)
        num_aligned = self._aligned_len(tokens.size)
        root = self._roots.get(namespace)
        if root is None:
            return MatchResult(_EMPTY_SLOTS, self._new_root(namespace))
        tick = self._tick()
        node, pos, pieces = root, 0, []
        while pos < num_aligned:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            num_common = self._common_len(child.key, tokens[pos:num_aligned])
            is_partial = num_common < child.key.size
            if is_partial:
                child = self._split(child, num_common)
            child.last_access = tick
            pieces.append(child.value)
            pos += num_common
            node = child
            if is_partial:
                break
        slots = np.concatenate(pieces) if pieces else _EMPTY_SLOTS
        return MatchResult(slots, node)

    def match_len(self, tokens: TokenIds, namespace: Hashable | None = None) -> int:
        """How many leading tokens (whole pages) are cached: match_prefix's length,
        without touching or splitting anything (the DP router asks every replica)."""
        tokens = _as_tokens(tokens)
        num_aligned = self._aligned_len(tokens.size)
        node, pos = self._roots.get(namespace), 0
        while node is not None and pos < num_aligned:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            num_common = self._common_len(child.key, tokens[pos:num_aligned])
            pos += num_common
            node = child if num_common == child.key.size else None
        return pos

    def continuation(self, tokens: TokenIds, max_tokens: int,
                     namespace: Hashable | None = None) -> np.ndarray:
        """[<= max_tokens] int32: what the tree holds after the whole of `tokens`, along
        the most recently used branch (a cached reply to the same context: speculative
        decoding's drafts); empty unless every token of `tokens` is cached. Read only:
        nothing is touched or split."""
        tokens = _as_tokens(tokens)
        node, pos = self._roots.get(namespace), 0
        edge, at = None, 0  # the edge the query ends inside, and how far into it
        while node is not None and pos < tokens.size:
            child = node.children.get(self._child_key(tokens, pos)) if (
                pos + self.page_size <= tokens.size) else self._tail_child(node, tokens[pos:])
            if child is None:
                return _EMPTY_TOKENS
            n = min(child.key.size, tokens.size - pos)
            if child.key[:n].tobytes() != tokens[pos:pos + n].tobytes():
                return _EMPTY_TOKENS
            pos += n
            edge, at, node = child, n, child
        if edge is None:
            return _EMPTY_TOKENS
        out = [edge.key[at:]]
        total = out[0].size
        while total < max_tokens and edge.children:
            edge = max(edge.children.values(), key=lambda c: c.last_access)
            out.append(edge.key)
            total += edge.key.size
        return np.concatenate(out)[:max_tokens].astype(np.int32)

    def _tail_child(self, node: TreeNode, tail: np.ndarray) -> TreeNode | None:
        """The child whose first page starts with `tail` (shorter than a page), if any."""
        for child in node.children.values():
            if child.key[:tail.size].tobytes() == tail.tobytes():
                return child
        return None

    def insert(
        self, tokens: TokenIds, slots: np.ndarray, namespace: Hashable | None = None
    ) -> InsertResult:
        """Cache `tokens` (whole pages) with their KV `slots` ([len(tokens)] int64).

        Takes ownership of the slots of the aligned prefix: those of the new suffix move
        into the tree; those where the tree already holds other slots for the same tokens
        are freed to the allocator (slots equal to the tree's, e.g. from `match_prefix`,
        are left alone). The unaligned tail ``slots[num_existing + num_inserted:]`` stays
        with the caller. Touches the whole inserted path.
        """
        tokens = _as_tokens(tokens)
        slots = np.asarray(slots, dtype=np.int64)
        if slots.shape != tokens.shape:
            raise ValueError(f"{tokens.size} tokens but {slots.size} slots")
        num_aligned = self._aligned_len(tokens.size)
        root = self._roots.get(namespace)
        if num_aligned == 0:
            return InsertResult(0, 0, 0, root if root is not None else self._new_root(namespace))
        if root is None:
            root = self._roots[namespace] = self._new_root(namespace)
        tick = self._tick()
        node, pos, duplicates = root, 0, []
        while pos < num_aligned:
            child_key = self._child_key(tokens, pos)
            child = node.children.get(child_key)
            if child is None:
                node = self._add_leaf(
                    node, child_key, tokens[pos:num_aligned], slots[pos:num_aligned], tick
                )
                break
            num_common = self._common_len(child.key, tokens[pos:num_aligned])
            if num_common < child.key.size:
                child = self._split(child, num_common)
            child.last_access = tick
            theirs = slots[pos : pos + num_common]
            if theirs.tobytes() != child.value.tobytes():  # bytes compare: cheap when equal
                duplicates.append(theirs[theirs != child.value])
            pos += num_common
            node = child
        num_freed = 0
        if duplicates:
            freed = np.concatenate(duplicates)
            self.allocator.free(freed)
            num_freed = int(freed.size)
        return InsertResult(pos, num_aligned - pos, num_freed, node)

    # -- locks ----------------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more holder). Roots: no-op."""
        if node.is_evicted:
            raise LockError(f"cannot lock evicted node {node!r}")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable_size -= node.key.size
                self._protected_size += node.key.size
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Drop one holder of `node`'s path; nodes reaching 0 become evictable again."""
        # lock_ref never grows towards the leaves, so checking the first node covers the path
        if node.parent is not None and node.lock_ref <= 0:
            raise LockError(f"dec_lock_ref on unlocked node {node!r}")
        while node.parent is not None:
            if node.lock_ref == 1:
                self._protected_size -= node.key.size
                self._evictable_size += node.key.size
                if node.is_leaf:
                    self._push_candidate(node)
            node.lock_ref -= 1
            node = node.parent

    # -- eviction -------------------------------------------------------------------------

    def evict(self, num_slots: int) -> int:
        """Free `num_slots` tree slots, rounded up to whole pages (fewer only if not that
        many are evictable). Returns the number freed.

        Leaf-first, least recently used first: pops unlocked leaves off a min-heap keyed by
        `last_access`, and a parent left childless becomes a candidate itself. When the
        last leaf taken is longer than needed, only its tail is freed: the rest of the
        prefix stays matchable (a whole-node eviction would throw away, say, most of a
        system prompt to make room for a few decode tokens).
        """
        num_freed, freed = 0, []
        while num_freed < num_slots and self._heap:
            access, _, node = heapq.heappop(self._heap)
            node.is_in_heap = False
            if node.is_evicted or node.lock_ref > 0 or node.children:
                continue  # stale entry: became locked or gained children since the push
            if access != node.last_access:
                # Touched since the push: priorities only grow, so re-queue at the true one.
                self._push_candidate(node)
                continue
            num_wanted = num_slots - num_freed
            num_wanted += -num_wanted % self.page_size
            if node.key.size > num_wanted:
                keep = node.key.size - num_wanted
                freed.append(node.value[keep:])
                # Views, O(1): a later split copies, and nothing ever grows a node in place.
                node.key, node.value = node.key[:keep], node.value[:keep]
                self._evictable_size -= num_wanted
                num_freed += num_wanted
                self._push_candidate(node)
                break
            parent = node.parent
            del parent.children[self._child_key(node.key, 0)]
            node.is_evicted = True
            self._evictable_size -= node.key.size
            num_freed += node.key.size
            freed.append(node.value)
            if parent.is_root:
                if not parent.children and parent.namespace is not None:
                    del self._roots[parent.namespace]  # don't keep one empty root per salt
            elif parent.is_leaf and parent.lock_ref == 0:
                self._push_candidate(parent)
        if freed:
            self.allocator.free(np.concatenate(freed))
        return num_freed

    def reset(self) -> None:
        """Drop the whole tree, freeing its slots. Raises `LockError` if any node is locked
        (its slots are in use by a running request)."""
        if self._protected_size:
            raise LockError(f"reset with {self._protected_size} locked slots")
        values = [node.value for node in self.iter_nodes()]
        if values:
            self.allocator.free(np.concatenate(values))
        for node in self.iter_nodes():
            node.is_evicted = True
        self._init_empty()

    # -- inspection -----------------------------------------------------------------------

    def namespaces(self) -> list[Hashable | None]:
        return list(self._roots)

    def root(self, namespace: Hashable | None = None) -> TreeNode | None:
        """The root of `namespace`, or None when nothing is cached under it."""
        return self._roots.get(namespace)

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children (depth first)."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` on any broken invariant (see `radix_integrity`)."""
        check_radix_cache(self)

    # -- internals ------------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _aligned_len(self, num_tokens: int) -> int:
        return num_tokens - num_tokens % self.page_size

    def _child_key(self, tokens: np.ndarray, pos: int) -> ChildKey:
        if self.page_size == 1:
            return int(tokens[pos])
        return tokens[pos : pos + self.page_size].tobytes()

    def _common_len(self, key: np.ndarray, query: np.ndarray) -> int:
        """Length of the common prefix of two runs, rounded down to whole pages (numpy)."""
        n = min(key.size, query.size)
        # Fast path: most nodes on a path match whole, and a bytes compare runs in C with
        # a fraction of the per-call overhead of the numpy ufunc route below.
        if key[:n].tobytes() == query[:n].tobytes():
            common = n
        else:
            common = int(np.flatnonzero(key[:n] != query[:n])[0])
        return common - common % self.page_size

    def _new_root(self, namespace: Hashable | None) -> TreeNode:
        empty_key = np.zeros(0, dtype=np.int32)
        return TreeNode(empty_key, _EMPTY_SLOTS, None, namespace, next(self._node_ids))

    def _add_leaf(
        self,
        parent: TreeNode,
        child_key: ChildKey,
        key: np.ndarray,
        value: np.ndarray,
        tick: int,
    ) -> TreeNode:
        # Copies: the caller may reuse its arrays, and a view would pin the caller's buffer.
        leaf = TreeNode(
            key.copy(),
            value.copy(),
            parent,
            parent.namespace,
            next(self._node_ids),
            last_access=tick,
        )
        parent.children[child_key] = leaf
        self._evictable_size += key.size
        self._push_candidate(leaf)
        return leaf

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut `node` at token `at`; return the new upper part, which takes node's place.

        The lower part keeps its identity (a lock holder's `last_node` stays valid) and the
        upper part inherits its lock count and access time, so sizes and locks still add up.
        """
        parent = node.parent
        upper = TreeNode(
            node.key[:at].copy(),
            node.value[:at].copy(),
            parent,
            node.namespace,
            next(self._node_ids),
            node.last_access,
            node.lock_ref,
        )
        parent.children[self._child_key(node.key, 0)] = upper
        node.key = node.key[at:].copy()
        node.value = node.value[at:].copy()
        node.parent = upper
        upper.children[self._child_key(node.key, 0)] = node
        return upper

    def _push_candidate(self, node: TreeNode) -> None:
        # One entry per node at most, so the heap stays O(nodes) however often we lock.
        if not node.is_in_heap:
            node.is_in_heap = True
            heapq.heappush(self._heap, (node.last_access, node.node_id, node))


def _as_tokens(tokens: TokenIds) -> np.ndarray:
    array = np.asarray(tokens, dtype=np.int32)
    if array.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {array.shape}")
    return array
