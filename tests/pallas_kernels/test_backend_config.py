"""attention_backend: "auto" resolves by JAX's default backend, bad names and page sizes
are rejected once, at config time."""

from __future__ import annotations

import jax
import pytest

from pallas_kernels.compat import default_interpret
from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.model.backends import get_backend, resolve_backend_name
from radixjax.model.native_attention import native_attention
from radixjax.runtime.model_runner import RunnerConfig


def test_auto_is_pallas_only_on_gpu_and_interpret_elsewhere() -> None:
    on_gpu = jax.default_backend() == "gpu"
    assert resolve_backend_name("auto") == ("pallas" if on_gpu else "native")
    assert default_interpret() is not on_gpu
    assert EngineConfig().attention_backend == "auto"
    assert RunnerConfig().attention_backend == "auto"
    assert get_backend("native", page_size=16) is native_attention
    assert get_backend("pallas", page_size=16).keywords == {"page_size": 16, "soft_cap": None}


def test_bad_backend_and_page_size_are_rejected() -> None:
    with pytest.raises(EngineConfigError, match="attention_backend"):
        EngineConfig(attention_backend="flash")
    with pytest.raises(ValueError, match="unknown attention backend"):
        RunnerConfig(attention_backend="flash")
    with pytest.raises(ValueError, match="multiple of page_size"):
        RunnerConfig(num_slots=100, page_size=16)
