"""A step's host inputs packed into an int32 and a float32 buffer (runtime/packed_inputs.py)
come back unchanged inside a jitted program; equal shapes pack equally."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import numpy as np
import pytest

from radixjax.runtime.packed_inputs import pack, unpack


class Meta(NamedTuple):
    positions: np.ndarray
    flag: np.bool_
    base: int
    scale: np.ndarray
    absent: None = None


def _tree(n: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (rng.integers(-2**31, 2**31 - 1, n).astype(np.int32),
            Meta(np.arange(n, dtype=np.int32).reshape(1, n), np.bool_(True), 7,
                 rng.standard_normal((2, n)).astype(np.float32)),
            rng.random(3) < 0.5)


def test_a_tree_comes_back_unchanged_from_its_two_buffers() -> None:
    tree = _tree(5)
    packing, (ints, floats) = pack(tree)
    assert ints.dtype == np.int32 and floats.dtype == np.float32
    assert packing.sizes == (ints.size, floats.size) == (5 + 5 + 1 + 1 + 3, 10)
    out = jax.jit(partial(unpack, packing=packing))((ints, floats))
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(tree), strict=True):
        want = np.asarray(want)
        assert got.shape == want.shape
        assert got.dtype == (np.bool_ if want.dtype == np.bool_ else
                             np.float32 if want.dtype.kind == "f" else np.int32)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_equal_shapes_pack_equally_and_others_do_not() -> None:
    assert pack(_tree(5, seed=1))[0] == pack(_tree(5, seed=2))[0]
    assert pack(_tree(5))[0] != pack(_tree(6))[0]
    assert pack(_tree(5))[0] != pack(_tree(5)[:2])[0]


def test_a_dtype_it_cannot_carry_is_refused() -> None:
    with pytest.raises(TypeError, match="complex"):
        pack((np.zeros(2, np.complex64),))
