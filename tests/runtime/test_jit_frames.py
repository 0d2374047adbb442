"""The test processes' stub for XLA's JIT unwind tables (tests/native/no_jit_frames.c)
is the one jaxlib calls: a fresh compile registers its frames there, not with libgcc."""

from __future__ import annotations

import ctypes
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import jit_frames


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stub is Linux's")
def test_a_compile_registers_its_frames_with_the_stub() -> None:
    assert jit_frames.LIB.exists()
    stub = ctypes.CDLL(str(jit_frames.LIB))  # (the handle conftest loaded)
    stub.radixjax_skipped_jit_frames.restype = ctypes.c_long
    before = stub.radixjax_skipped_jit_frames()
    salt = float(np.random.default_rng().integers(1 << 30))  # a program never compiled
    out = jax.jit(lambda x: jnp.sin(x) * salt)(jnp.ones(3))
    assert float(out[0]) == pytest.approx(np.sin(1.0) * salt, rel=1e-5)
    assert stub.radixjax_skipped_jit_frames() > before
