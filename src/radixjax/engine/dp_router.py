"""Which data-parallel replica serves a request (SGLang's router policies, in process).

    cache_aware     the replica whose radix tree holds the longest prefix of the prompt,
                    if it covers at least `cache_threshold` of it; otherwise (or when the
                    load is out of balance) the least loaded replica
    shortest_queue  the least loaded replica (requests it holds, not yet finished)
    round_robin     in turn

Load imbalance, as SGLang's router: max load - min load > balance_abs and max load >
balance_rel x min load. Ties go to the lowest index. Pure host logic: the caller measures
loads and prefix matches (DataParallelEngine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DP_POLICIES = ("cache_aware", "shortest_queue", "round_robin")


@dataclass
class DPRouter:
    policy: str = "cache_aware"
    cache_threshold: float = 0.5
    balance_abs: int = 8
    balance_rel: float = 1.5
    _next: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in DP_POLICIES:
            raise ValueError(f"unknown DP routing policy {self.policy!r}; choose from "
                             f"{DP_POLICIES}")

    def pick(self, loads: list[int], num_tokens: int,
             cached: Callable[[], list[int]]) -> int:
        """loads: per replica; cached(): per replica, the prompt's tokens its tree holds
        (asked only by cache_aware, only when the load is balanced)."""
        if self.policy == "round_robin":
            self._next = (self._next + 1) % len(loads)
            return (self._next - 1) % len(loads)
        least = loads.index(min(loads))
        if self.policy == "shortest_queue" or self._imbalanced(loads):
            return least
        hits = cached()
        best = hits.index(max(hits))
        if hits[best] >= self.cache_threshold * num_tokens and hits[best] > 0:
            return best
        return least

    def _imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs and hi > self.balance_rel * lo
