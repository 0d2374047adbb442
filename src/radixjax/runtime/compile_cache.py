"""JAX's persistent compilation cache: compiled step programs survive restarts, so the
start-up warm-up is fast after the first run."""

from __future__ import annotations

import os

import jax

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "radixjax", "jax")


# JAX writes and reads cache files under its file lock only when a size limit is set
# (else a server starting while another writes the same entry can read half a file)
MAX_CACHE_BYTES = 64 << 30
# The process whose id this variable holds reads the cache but never writes it (the
# test suite's worker processes: 2 of 4 clean-clone suites on 2026-12-07 crashed a worker
# inside XLA's executable.serialize() late in the run, never alone; the servers and
# other processes they start still write)
READ_ONLY_PID_VAR = "RADIXJAX_JAX_CACHE_READ_ONLY_PID"


def enable_persistent_cache(path: str | None = None) -> str:
    """Turn the cache on (idempotent); `RADIXJAX_JAX_CACHE` overrides the folder."""
    path = path or os.environ.get("RADIXJAX_JAX_CACHE") or DEFAULT_DIR
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    read_only = os.environ.get(READ_ONLY_PID_VAR) == str(os.getpid())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e12 if read_only else 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path

