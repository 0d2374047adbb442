"""A step's host inputs (token ids, slots, metadata, sampling parameters, flags: ~25 small
arrays) travel to the device as two buffers, one int32 and one float32, and the program
slices them back into the same pytree.

    pack(tree)               -> Packing (static: the tree's structure, each leaf's dtype,
                                shape and offset), (ints [Ni] int32, floats [Nf] float32)
    unpack(buffers, packing) -> tree (inside the jitted step: static slices)

Why: placing each array on the device is a Python call through jax.device_put's
per-array path; for SmolLM2's step on the 2-core VM the ~25 transfers took ~1.6 ms of
the ~24 ms decode step's host time, on the critical path when results are processed
before the next dispatch and on the core the step's second thread wants otherwise
(benchmarks/README.md, sixteenth session)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Leaf(NamedTuple):
    dtype: str  # "bool", "int32" or "float32": the leaf as the program sees it
    shape: tuple[int, ...]
    offset: int  # into its buffer: floats for float32, ints otherwise


class Packing(NamedTuple):
    """Static (hashable): what a program's unpack needs, equal for equal step shapes."""

    treedef: Any  # jax.tree_util.PyTreeDef
    leaves: tuple[Leaf, ...]
    sizes: tuple[int, int]  # elements of the int32 and the float32 buffer


def _kind(a: np.ndarray) -> str:
    if a.dtype.kind == "b":
        return "bool"
    if a.dtype.kind in "iu":
        return "int32"
    if a.dtype.kind == "f":
        return "float32"
    raise TypeError(f"cannot pack a {a.dtype} step input")


def pack(tree: Any) -> tuple[Packing, tuple[np.ndarray, np.ndarray]]:
    """Host arrays (numpy or scalars) -> (Packing, (ints, floats)); bools and integers go to
    the int32 buffer (integers must fit int32, as jax would make them), floats to float32."""
    values, treedef = jax.tree.flatten(tree)
    parts: tuple[list, list] = ([], [])
    sizes, leaves = [0, 0], []
    for v in values:
        a = np.asarray(v)
        kind = _kind(a)
        k = int(kind == "float32")
        leaves.append(Leaf(kind, a.shape, sizes[k]))
        parts[k].append(a.ravel())
        sizes[k] += a.size
    ints = np.concatenate(parts[0], dtype=np.int32) if parts[0] else np.zeros(0, np.int32)
    floats = (np.concatenate(parts[1], dtype=np.float32) if parts[1]
              else np.zeros(0, np.float32))
    return Packing(treedef, tuple(leaves), (sizes[0], sizes[1])), (ints, floats)


def unpack(buffers: tuple[jax.Array, jax.Array], packing: Packing) -> Any:
    """(ints [Ni], floats [Nf]) -> the packed tree, as jax arrays (inside a jitted step)."""
    out = []
    for leaf in packing.leaves:
        buf = buffers[int(leaf.dtype == "float32")]
        size = int(np.prod(leaf.shape, dtype=np.int64))
        x = jax.lax.slice(buf, (leaf.offset,), (leaf.offset + size,)).reshape(leaf.shape)
        out.append(x.astype(jnp.bool_) if leaf.dtype == "bool" else x)
    return jax.tree.unflatten(packing.treedef, out)
