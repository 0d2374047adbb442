"""Shared fixtures: tiny random models of every supported family, saved as real HF
folders (config.json + model.safetensors) by HF transformers itself."""

from __future__ import annotations

import faulthandler
import os

# Tests run on the CPU with a persistent compile cache of their own, which this process
# reads and the processes it starts (servers, ranks, CLIs) also write
# (runtime/compile_cache.py READ_ONLY_PID_VAR says why).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
    "RADIXJAX_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".jax_cache")
)
os.environ["RADIXJAX_JAX_CACHE_READ_ONLY_PID"] = str(os.getpid())

import pytest  # noqa: E402

from tests.tiny_models import FAMILIES, save_tiny_model  # noqa: E402

# A test stuck where no Python runs (a C thread deadlocked holding the GIL) never lets
# pytest-timeout's alarm (600 s, pyproject.toml) run: after this long, faulthandler's own
# C thread prints every thread's stack and ends the worker, which xdist reports as a
# crashed test and replaces, instead of CI hanging to its 90-minute limit.
HARD_TIMEOUT_S = 720


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 (pytest's hook signature)
    faulthandler.dump_traceback_later(HARD_TIMEOUT_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session", autouse=True)
def _compile_cache() -> None:
    from radixjax.runtime.compile_cache import enable_persistent_cache

    enable_persistent_cache()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """tiny_model_dir(family) -> Path of a saved HF folder (cached per session)."""
    cache: dict[str, object] = {}

    def make(family: str):
        if family not in cache:
            cache[family] = save_tiny_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return make


__all__ = ["FAMILIES"]


# Every SmolLM2 engine and server in the suite uses this one runner configuration, so they
# share one set of compiled step programs (the persistent compile cache): compiled once,
# loaded from disk by the rest. Scheduler-only options (chunk size, overlap, policy,
# jump-forward, retraction) may differ freely; these may not.
SMOLLM2_ENGINE = dict(num_slots=4096, max_running=8, max_context=512, max_prefill_tokens=256,
                      chunk_size=256)


@pytest.fixture(scope="session")
def smollm2():
    """The default model (SmolLM2-135M-Instruct Q4_1 GGUF), loaded once per session."""
    from radixjax.loaders import load_model

    return load_model(None)


@pytest.fixture(scope="session")
def smollm2_served():
    """The default model as an engine or server given its path loads it by default: its
    matrices in their GGUF blocks where this machine multiplies them (the gguf form)."""
    from radixjax.engine.config import EngineConfig
    from radixjax.engine.load_form import in_blocks
    from radixjax.loaders import load_model

    return load_model(None, gguf_blocks=in_blocks(EngineConfig(), None))


@pytest.fixture(scope="session")
def server():
    """One warmed real server (SmolLM2) that every server-level test shares; after all of
    them nothing compiled late and no request holds KV."""
    from tests.server.conftest import running_server, wait_idle

    with running_server(["--enable-debug-endpoints", "--max-request-bytes", "1000000"]) as url:
        yield url
        stats = wait_idle(url)
        assert stats["num_late_compiles"] == 0, "a step compiled after warm-up"
        assert stats["kv_held"] == 0, "KV still held by requests"


# A worker's memory mappings before its compiled programs are dropped: XLA's JIT maps
# each program's sections separately (~670 maps for a tiny model's step program), and at
# the kernel's vm.max_map_count (65,530) the next program's JIT link fails: LLVM aborts
# ("Unable to allocate section memory", RuntimeDyld::emitSection; core dump of the
# 2026-12-07 CI failure: 65,531 mappings), or a throw in jaxlib crashes in the unwinder.
MAX_MAPS = 25_000


def _num_maps() -> int:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:  # (not Linux)
        return 0


@pytest.fixture(scope="module", autouse=True)
def _release_module_memory():
    """After each module's fixtures are gone (engines, models, HF references), their freed
    memory goes back to the OS: glibc would keep it (a worker grew to 6.7 GB, the suite
    peaked at 23.4 of the VM's 23.4 GB, and one CI run lost a worker to the OOM killer);
    past MAX_MAPS mappings, the compiled programs no module holds any more go too."""
    yield
    import gc

    from radixjax.runtime.host_memory import release_free_memory
    from radixjax.runtime.model_runner import clear_compiled_programs

    if _num_maps() > MAX_MAPS:
        clear_compiled_programs()
        gc.collect()
    release_free_memory()
