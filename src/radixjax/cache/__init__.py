"""Host-side KV bookkeeping: radix prefix cache, KV slot allocator, req_to_token table.

Pure Python + numpy; never imports JAX. See docs/radix_cache.md for the module map.
"""

from radixjax.cache.allocator import DUMMY_SLOT, KVSlotAllocator
from radixjax.cache.errors import (
    CacheIntegrityError,
    InvalidFree,
    KVCacheError,
    LockError,
    OutOfKVSlots,
    OutOfRequestSlots,
)
from radixjax.cache.manager import KVCacheManager
from radixjax.cache.radix_cache import RadixCache
from radixjax.cache.req_to_token import ReqToTokenPool
from radixjax.cache.tree_node import InsertResult, MatchResult, TreeNode

__all__ = [
    "DUMMY_SLOT",
    "CacheIntegrityError",
    "InsertResult",
    "InvalidFree",
    "KVCacheError",
    "KVCacheManager",
    "KVSlotAllocator",
    "LockError",
    "MatchResult",
    "OutOfKVSlots",
    "OutOfRequestSlots",
    "RadixCache",
    "ReqToTokenPool",
    "TreeNode",
]
