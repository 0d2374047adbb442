"""Typed errors of the host-side KV bookkeeping (radix cache, slot allocator, req_to_token)."""

from __future__ import annotations


class KVCacheError(RuntimeError):
    """Base class of every error raised by `radixjax.cache`."""


class OutOfKVSlots(KVCacheError):
    """An allocation asked for more slots than are free plus evictable.

    Raised before anything is evicted, so a failed allocation leaves the cache intact.
    """

    def __init__(self, num_requested: int, num_available: int) -> None:
        super().__init__(
            f"cannot allocate {num_requested} KV slots: only {num_available} available "
            "(free + evictable)"
        )
        self.num_requested = num_requested
        self.num_available = num_available


class OutOfRequestSlots(KVCacheError):
    """Every row of the request-to-token table is in use."""


class InvalidFree(KVCacheError):
    """A free of something not currently allocated: double free, the dummy, out of range."""


class LockError(KVCacheError):
    """Unbalanced lock use: unlocking a node that holds no lock, or resetting while locked."""


class CacheIntegrityError(AssertionError):
    """`check_integrity()` found a broken invariant (a bug, never a user error)."""


def require(condition: bool, message: str) -> None:
    """Raise `CacheIntegrityError` unless `condition`; unlike `assert`, survives `python -O`."""
    if not condition:
        raise CacheIntegrityError(message)
