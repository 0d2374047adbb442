"""The engine's request lifecycle, end to end: match + lock, alloc (evicting), req_to_token
rows, decode, finish (insert, free duplicates and tail, unlock), retract."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from radixjax.cache import KVCacheManager, OutOfKVSlots, ReqToTokenPool


class Running:
    def __init__(self, engine: Engine, tokens: list[int], namespace=None) -> None:
        manager = engine.manager
        self.tokens = list(tokens)
        self.namespace = namespace
        self.row = engine.pool.alloc()
        self.match = manager.match_and_lock(tokens, namespace)
        new = manager.alloc(manager.round_up(len(tokens) - self.match.num_tokens))
        self.slots = np.concatenate([self.match.slots, new])  # whole pages
        engine.pool.write(self.row, 0, self.slots[: len(tokens)])


class Engine:
    """What the scheduler will do, minus the device."""

    def __init__(self, num_slots: int, page_size: int) -> None:
        self.manager = KVCacheManager(num_slots, page_size)
        self.pool = ReqToTokenPool(max_running_requests=4, max_context=512)
        self.running: list[Running] = []

    def start(self, tokens: list[int], namespace=None) -> Running:
        req = Running(self, tokens, namespace)
        self.running.append(req)
        self.check()
        return req

    def decode(self, req: Running, new_tokens: list[int]) -> None:
        for token in new_tokens:
            position = len(req.tokens)
            if position == req.slots.size:  # the last page is full: one more page
                page = self.manager.alloc(self.manager.round_up(1))
                req.slots = np.concatenate([req.slots, page])
            self.pool.write(req.row, position, req.slots[position : position + 1])
            req.tokens.append(token)
        self.check()

    def finish(self, req: Running) -> None:
        self.manager.cache_finished(req.tokens, req.slots, req.match.last_node, req.namespace)
        self.pool.free(req.row)
        self.running.remove(req)
        self.check()

    def retract(self, req: Running) -> None:
        self.manager.release(req.slots, req.match.last_node, req.match.num_tokens)
        self.pool.free(req.row)
        self.running.remove(req)
        self.check()

    def check(self) -> None:
        manager = self.manager
        manager.check_integrity()
        self.pool.check_integrity()
        private = sum(req.slots.size - req.match.num_tokens for req in self.running)
        assert manager.num_held == private
        free, tree = manager.allocator.num_free_slots, manager.tree
        assert (
            free + tree.evictable_size() + tree.protected_size() + private
            == manager.allocator.num_usable_slots
        )
        for req in self.running:
            row = self.pool.read(req.row, len(req.tokens))
            assert row.tolist() == req.slots[: len(req.tokens)].tolist()
        if not self.running:
            assert tree.protected_size() == 0
            assert free + tree.evictable_size() == manager.allocator.num_usable_slots


@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_flow(page_size: int) -> None:
    engine = Engine(num_slots=page_size * 24 if page_size > 1 else 1 + 300, page_size=page_size)
    manager = engine.manager

    def aligned(num_tokens: int) -> int:
        return num_tokens - num_tokens % page_size

    system = list(range(1000, 1050))

    # Two concurrent requests over the same system prompt: nothing cached yet.
    a = engine.start(system + [1, 2, 3])
    b = engine.start(system + [7, 8])
    assert a.match.num_tokens == 0 and b.match.num_tokens == 0
    engine.decode(a, [4, 5, 6])
    engine.finish(a)
    assert manager.tree.total_size() == aligned(len(a.tokens))
    # b computed the system prompt too: its copy is a duplicate, freed when it finishes.
    num_free = manager.allocator.num_free_slots
    engine.finish(b)
    assert manager.allocator.num_free_slots > num_free

    # A third request reuses the cached system prompt slots (the first request's).
    c = engine.start(system + [9])
    assert c.match.num_tokens == aligned(len(system))
    assert c.slots[: c.match.num_tokens].tolist() == a.slots[: aligned(len(system))].tolist()
    assert manager.tree.protected_size() == aligned(len(system))

    # Retraction: private slots come back at once, nothing is inserted.
    size_before = manager.tree.total_size()
    private = c.slots[c.match.num_tokens :]
    engine.retract(c)
    assert manager.allocator.is_free(private).all()
    assert manager.tree.total_size() == size_before and manager.tree.protected_size() == 0

    # Multi-turn chat: turn 2 extends turn 1 (prompt + answer) and hits all of it.
    turn1 = engine.start(system + [20, 21])
    engine.decode(turn1, [22, 23, 24])
    engine.finish(turn1)
    turn2 = engine.start(turn1.tokens + [25, 26])
    assert turn2.match.num_tokens == aligned(len(turn1.tokens))
    engine.finish(turn2)

    # Memory pressure: unique long prompts force evictions of old branches; the system
    # prompt, locked by a running request, survives.
    keeper = engine.start(system + [30])
    for i in range(12):
        req = engine.start([5000 + i] * 40)
        engine.decode(req, [1, 2])
        engine.finish(req)
    assert manager.tree.match_prefix([5000] * 40).num_tokens < aligned(40)  # evicted
    assert manager.tree.match_prefix(system).num_tokens == aligned(len(system))
    engine.finish(keeper)
    assert not engine.running


def test_alloc_beyond_free_plus_evictable_raises_without_evicting() -> None:
    manager = KVCacheManager(num_slots=1 + 20)
    match = manager.match_and_lock(list(range(8)))
    slots = manager.alloc(8)
    manager.cache_finished(list(range(8)), slots, match.last_node)
    assert manager.available_size() == 20
    held = manager.alloc(5)  # 12 free: no eviction needed
    assert manager.tree.total_size() == 8
    with pytest.raises(OutOfKVSlots):
        manager.alloc(16)
    assert manager.tree.total_size() == 8  # nothing was evicted for the failed alloc
    got = manager.alloc(15)  # 7 free + 8 evictable
    assert manager.tree.total_size() == 0 and got.size == 15
    manager.check_integrity()
    assert manager.num_held == 20
    manager.release(np.concatenate([held, got]), manager.tree.root(), 0)
    assert manager.num_held == 0
    manager.check_integrity()


def test_cache_package_never_imports_jax() -> None:
    code = (
        "import sys, radixjax.cache\n"
        "bad = [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
