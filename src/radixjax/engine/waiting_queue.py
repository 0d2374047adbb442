"""The scheduler's waiting requests, in order, with O(1) removal: a client that leaves a
batch of W waiting requests aborts each of them, and W list removals would cost O(W^2)
on the event loop."""

from __future__ import annotations

from collections.abc import Iterator

from radixjax.engine.request import Req


class WaitingQueue:
    def __init__(self) -> None:
        self._reqs: dict[Req, None] = {}  # insertion-ordered; Req hashes by identity

    def append(self, r: Req) -> None:
        self._reqs[r] = None

    def push_front(self, r: Req) -> None:
        """A retracted request goes first (O(W): retractions are rare)."""
        self._reqs = {r: None, **self._reqs}

    def remove(self, r: Req) -> None:
        del self._reqs[r]

    def __contains__(self, r: object) -> bool:
        return r in self._reqs

    def __len__(self) -> int:
        return len(self._reqs)

    def __iter__(self) -> Iterator[Req]:
        return iter(list(self._reqs))  # a snapshot: callers remove while iterating
