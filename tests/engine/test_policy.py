"""Scheduling policies on a real radix tree (host only): LPM, DFS-weight, FCFS fallback,
in-batch prefix caching."""

from __future__ import annotations

import numpy as np

from radixjax.cache.manager import KVCacheManager
from radixjax.engine.policy import SchedulePolicy
from radixjax.engine.request import Req
from radixjax.sampling.params import SamplingParams


def req(rid: str, ids: list[int]) -> Req:
    return Req(rid=rid, prompt_ids=ids, sampling=SamplingParams(), seed=0)


def cache_with(*seqs: list[int]) -> KVCacheManager:
    kvm = KVCacheManager(4096)
    for s in seqs:
        m = kvm.match_and_lock(s)
        slots = np.concatenate([m.slots, kvm.alloc(len(s) - m.slots.size)])
        kvm.cache_finished(s, slots, m.last_node)
    return kvm


A = list(range(100, 140))  # 40 tokens
B = list(range(200, 210))  # 10 tokens


def test_lpm_orders_by_cached_length() -> None:
    kvm = cache_with(A, B)
    waiting = [req("none", [7] * 20), req("b", B + [1, 2]), req("a", A + [3, 4]),
               req("a_short", A[:20] + [9, 9])]
    ordered = SchedulePolicy("lpm", kvm.tree, 128, 32).order(waiting)
    assert [r.rid for r in ordered.reqs] == ["a", "a_short", "b", "none"]


def test_dfs_weight_orders_by_shared_branch_weight() -> None:
    kvm = cache_with(A, B)
    # one request under A (longer match), three under B: B's branch goes first
    waiting = [req("a1", A + [1]), req("b1", B + [1]), req("b2", B + [2]),
               req("b3", B + [3]), req("cold", [5, 6, 7])]
    policy = SchedulePolicy("dfs-weight", kvm.tree, 128, 32)
    # the root's own (unmatched) request, then the heaviest branch (B: 3) before A (1)
    assert [r.rid for r in policy.order(waiting).reqs] == ["cold", "b1", "b2", "b3", "a1"]
    lpm = [r.rid for r in SchedulePolicy("lpm", kvm.tree, 128, 32).order(waiting).reqs]
    assert lpm[0] == "a1"  # LPM would pick the single long match first


def test_cache_aware_policies_fall_back_to_fcfs_past_threshold() -> None:
    kvm = cache_with(A)
    waiting = [req(f"cold{i}", [i + 1] * 5) for i in range(4)] + [req("hot", A + [1])]
    assert SchedulePolicy("lpm", kvm.tree, 10, 32).order(waiting).reqs[0].rid == "hot"
    fallback = SchedulePolicy("lpm", kvm.tree, 3, 32)
    assert fallback.effective(len(waiting)) == "fcfs"
    assert [r.rid for r in fallback.order(waiting).reqs] == [r.rid for r in waiting]


def test_in_batch_prefix_caching_defers_sharers_of_a_cold_prefix() -> None:
    kvm = cache_with()
    cold = list(range(300, 350))
    waiting = [req("first", cold + [1]), req("second", cold + [2]), req("other", [9] * 60),
               req("third", cold + [3, 3])]
    ordered = SchedulePolicy("lpm", kvm.tree, 128, 32).order(waiting)
    deferred = {r.rid for r in ordered.reqs if id(r) in ordered.deferred}
    assert deferred == {"second", "third"}
    # requests already prefilling this step also count
    ordered = SchedulePolicy("lpm", kvm.tree, 128, 32).order(waiting[1:], [waiting[0]])
    assert {r.rid for r in ordered.reqs if id(r) in ordered.deferred} == {"second", "third"}
