"""JAX's persistent compilation cache: compiled step programs survive restarts, so the
start-up warm-up is fast after the first run."""

from __future__ import annotations

import os

import jax

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "radixjax", "jax")


def enable_persistent_cache(path: str | None = None) -> str:
    """Turn the cache on (idempotent); `RADIXJAX_JAX_CACHE` overrides the folder."""
    path = path or os.environ.get("RADIXJAX_JAX_CACHE") or DEFAULT_DIR
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path

