"""oneDNN's int8 matmul as an XLA custom call (model/onednn.py): exact int32 products
against numpy's, from one row to past a prefill's, in one or several parts, read in place
from a stack of layers inside a scan; and W8A8 through it equal to XLA's int8 GEMM."""

from __future__ import annotations

import platform
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model import onednn
from radixjax.model.quant import PackedInt8Weight, int8_head, int8_linear, pack_int8, quantize_int8


def _ints(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(-127, 128, shape, dtype=np.int8)


def _exact(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) @ w.astype(np.int64).T


def test_built_on_this_machine() -> None:
    """scripts/setup.sh builds the handler: on an x86-64 Linux CPU backend the W8A8
    products must take it (a missing build would silently cost ~25 % of every step)."""
    assert platform.machine() == "x86_64" and jax.default_backend() == "cpu"
    assert onednn.available(), f"{onednn.LIBRARY} missing: python -m radixjax.model.onednn --build"
    # SmolLM2's matrices: one packed layout at every row count, a fast kernel
    assert all(onednn.packable(n, k) for n, k in [(576, 576), (192, 576), (1536, 576),
                                                  (576, 1536), (49152, 576)])


@pytest.mark.parametrize("num_parts", [1, 2, 3])
def test_products_are_exact_for_every_row_count(num_parts: int) -> None:
    rng = np.random.default_rng(num_parts)
    w = _ints(rng, 96, 200)  # [N, K]: K not a multiple of the kernel's 4-byte groups
    packed = jnp.asarray(onednn.pack(w, num_parts))
    assert packed.shape[0] == num_parts
    f = jax.jit(lambda x, p: onednn.int8_matmul(x, p, 96))
    for m in (1, 3, 8, 130):
        x = _ints(rng, m, 200)
        np.testing.assert_array_equal(np.asarray(f(x, packed)), _exact(x, w))


def test_a_scan_reads_each_layer_of_the_stack_in_place() -> None:
    """The layer index picks the layer; the stack goes into the loop whole (no slice of
    it in the program)."""
    rng = np.random.default_rng(7)
    w = _ints(rng, 5, 64, 48)  # [L, N, K]
    packed = jnp.asarray(onednn.pack(w))
    x = _ints(rng, 8, 48)

    def run(x: jax.Array, packed: jax.Array) -> jax.Array:
        def body(c: jax.Array, i: jax.Array) -> tuple:
            return c, onednn.int8_matmul(x, packed, 64, i)
        return jax.lax.scan(body, 0, jnp.arange(5, dtype=jnp.int32))[1]

    out = jax.jit(run)(x, packed)
    np.testing.assert_array_equal(np.asarray(out), np.stack([_exact(x, wl) for wl in w]))
    hlo = jax.jit(run).lower(x, packed).compile().as_text()
    assert onednn.TARGET in hlo and not re.search(r"= s8\[[^\n]*dynamic-slice\(", hlo)


def test_bad_layer_index_is_an_error_not_a_read_past_the_stack() -> None:
    rng = np.random.default_rng(1)
    packed = jnp.asarray(onednn.pack(_ints(rng, 2, 32, 32)))
    with pytest.raises(Exception, match="layer out of range"):
        onednn.int8_matmul(jnp.asarray(_ints(rng, 2, 32)), packed, 32, 2).block_until_ready()


def test_w8a8_through_onednn_equals_xlas_int8_gemm() -> None:
    """The same integer sums scaled the same way: equal outputs, the layers' products
    and the LM head's (which then takes W8A8 from one row)."""
    rng = np.random.default_rng(3)
    q = quantize_int8(jnp.asarray(rng.standard_normal((576, 192)), jnp.float32))
    packed = pack_int8(q)
    assert isinstance(packed, PackedInt8Weight) and packed.layer is None
    for t in (1, 2, 8, 140):
        x = jnp.asarray(rng.standard_normal((t, 576)), jnp.float32)
        want = jax.jit(lambda x: int8_linear(x, q, one_row_gemm=True, as_bf16=False))(x)
        np.testing.assert_allclose(np.asarray(jax.jit(lambda x: int8_linear(x, packed))(x)),
                                   np.asarray(want), rtol=1e-6, atol=0)
        np.testing.assert_allclose(np.asarray(jax.jit(lambda x: int8_head(x, packed))(x)),
                                   np.asarray(want), rtol=1e-6, atol=0)


def test_the_layout_is_checked_at_the_runners_own_row_counts(monkeypatch) -> None:
    """A runner whose buckets hold row counts that are neither 2^i nor 3 x 2^i (48, a
    --max-prefill-tokens of 48) asks oneDNN about exactly those: its steps and its head."""
    from radixjax.runtime.batch import Buckets

    asked: list[tuple[int, ...]] = []
    real = onednn._packed_bytes

    def spy(n: int, k: int, rows: tuple[int, ...] = (1,)) -> int:
        asked.append(rows)
        return real(n, k, rows)

    monkeypatch.setattr(onednn, "_packed_bytes", spy)
    buckets = Buckets.default(48, 4)
    rows = tuple(sorted({n for s in buckets.shapes for n in (s.num_tokens, s.num_reqs)}))
    assert 48 in rows and all(r in onednn.STEP_ROWS or r == 48 for r in rows)
    assert onednn.packable(96, 64, rows)
    assert asked[-1] == rows


def test_a_stale_or_foreign_handler_falls_back_to_xla(tmp_path, caplog) -> None:
    """Older than its source (its functions may have changed), or not a library at all:
    not loaded, a warning; the products stay in XLA's forms (no failing step)."""
    import os
    import time as _time

    from radixjax.model.ffi_library import load_handlers

    source, library = tmp_path / "h.cc", tmp_path / "h.so"
    library.write_bytes(onednn.LIBRARY.read_bytes())
    source.write_text("// newer than the library")
    old = _time.time() - 100
    os.utime(library, (old, old))
    targets = {"radixjax_test_int8": "RadixjaxInt8Matmul"}
    assert load_handlers("m", source, library, targets, "XLA runs it") is None
    assert "older than its source" in caplog.text
    library.write_bytes(b"not a shared library")
    assert load_handlers("m", source, library, targets, "XLA runs it") is None
    assert "cannot be used" in caplog.text
