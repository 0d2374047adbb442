"""Everything that depends on the installed JAX version or the platform, in one place.

Pallas' GPU API moves between releases (``TritonCompilerParams`` became
``CompilerParams``; ``pl.load`` / ``pl.store`` moved to ``plgpu.load`` / ``plgpu.store``),
so the kernels call these wrappers only. Supported: jax >= 0.10.2 (Python 3.11) and
0.11 / 0.12 (Python 3.12).

Interpret mode: Pallas' Triton and Mosaic GPU backends only compile for NVIDIA GPUs; on
any other backend the kernels run with ``interpret=True`` (slow: tiny shapes only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def default_interpret() -> bool:
    """True unless the default JAX backend is a GPU: the one place this is decided."""
    return jax.default_backend() != "gpu"


def resolve_interpret(interpret: bool | None) -> bool:
    return default_interpret() if interpret is None else interpret


def triton_params(num_warps: int, num_stages: int) -> Any:
    """Triton compiler parameters for `pl.pallas_call(compiler_params=...)`."""
    cls = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams  # < 0.5
    return cls(num_warps=num_warps, num_stages=num_stages)


def dot(a: jax.Array, b: jax.Array, *, trans_b: bool = False) -> jax.Array:
    """2-D matmul inside a Triton kernel; f32 operands in IEEE f32 (not TF32) so f32
    pools match the reference to 1e-5; bf16 operands use bf16 tensor cores."""
    fn = getattr(plgpu, "dot", None) or pl.dot
    return fn(a, b, trans_b=trans_b, precision=lax.Precision.HIGHEST)


def masked_store(ref: Any, value: jax.Array, mask: jax.Array) -> None:
    """ref[...] = value where mask (same shape as value); ref is a view (`ref.at[...]`)."""
    plgpu.store(ref, value, mask=mask)


def check_triton_dim(name: str, size: int, interpret: bool) -> None:
    """Triton tiles need power-of-two sizes and `tl.dot` dims >= 16 (interpret: any)."""
    if not interpret and (size < 16 or size & (size - 1)):
        raise ValueError(f"the Triton kernel needs {name} to be a power of two >= 16, "
                         f"got {size}")


# What `lower_for_cuda` targets when no GPU is present: a Hopper part (sm_90).
ABSTRACT_GPU = jax.sharding.AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")


def lower_for_cuda(fn: Callable, *args: Any, **jit_kwargs: Any) -> Any:
    """`jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))`, also on a machine
    without a GPU. jax 0.10 falls back to sm_90 on its own; from 0.11 Pallas' Triton
    lowering asks the abstract mesh which GPU it targets and raises "No supported GPU
    devices found" without one, so the lowering runs under a one-device abstract mesh
    of ABSTRACT_GPU (which both versions accept)."""
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=ABSTRACT_GPU)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn, **jit_kwargs).trace(*args).lower(lowering_platforms=("cuda",))
