"""release_free_memory gives freed C-heap pages back to the OS (glibc keeps them)."""

from __future__ import annotations

import ctypes

import pytest

from radixjax.runtime.host_memory import release_free_memory


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="needs glibc")
def test_freed_heap_pages_go_back_to_the_os() -> None:
    # 300 MB in 2 KB blocks: glibc's heap, not mmap (blocks under 128 KB), and not
    # Python's small-object allocator (blocks over 512 bytes). The block allocated last
    # stays: the heap's top cannot shrink, so free() alone returns nothing.
    blocks = [bytes(2048) for _ in range(150_000)]
    pinned = bytes(2048)
    before = _rss_mb()
    del blocks
    freed_only = _rss_mb()
    release_free_memory()
    after = _rss_mb()
    assert freed_only > before - 100, (before, freed_only)  # glibc kept the pages
    assert after < freed_only - 200, (freed_only, after)
    del pinned
