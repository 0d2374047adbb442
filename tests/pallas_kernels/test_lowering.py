"""The kernels lower for CUDA on a CPU machine (interpret=False), so a GPU-only break
(a primitive without a Triton lowering rule, a non-power-of-two block, a bad index
expression, a lost alias) fails here rather than on the first GPU run.

What this does not cover: Triton's own passes and ptxas run only when XLA compiles
the module on a GPU (`.compile()` needs a CUDA backend); the gpu-marked test in
test_ragged_attention.py runs the compiled kernel there."""

from __future__ import annotations

import re
from functools import partial

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.blocks import choose_blocks
from pallas_kernels.compat import lower_for_cuda
from pallas_kernels.kv_write import write_kv_pages
from pallas_kernels.ragged_attention import ragged_paged_attention
from radixjax.model.attention import AttentionMetadata
from radixjax.model.config import ModelConfig
from radixjax.model.layer_stack import layer_groups, stack_layers
from radixjax.model.llama import forward, init_kv_pool
from radixjax.model.pallas_backend import pallas_attention
from radixjax.model.params import init_params

TRITON_CALL = "stablehlo.custom_call @__gpu$xla.gpu.triton"
sd = jax.ShapeDtypeStruct


def _cuda_text(fn, *args, **jit_kw) -> str:
    return lower_for_cuda(fn, *args, **jit_kw).as_text()


def _grid(text: str) -> tuple[int, int, int]:
    m = re.search(r"grid_x = (\d+) : i32, grid_y = (\d+) : i32, grid_z = (\d+) : i32", text)
    assert m, "no Triton grid in the lowered module"
    return tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize(("max_q", "window", "soft_cap"), [(1, None, None), (64, 512, 30.0)])
def test_attention_lowers_for_cuda(dtype, max_q: int, window, soft_cap) -> None:
    num_reqs, kv_heads, group, head_dim, page_size, max_kv = 8, 8, 4, 128, 16, 8192
    num_tokens = num_reqs * max_q
    blocks = choose_blocks(num_reqs, kv_heads, max_q, max_kv)
    args = (sd((num_tokens, kv_heads * group, head_dim), jnp.float32),
            sd((1024, page_size, kv_heads, head_dim), dtype),
            sd((1024, page_size, kv_heads, head_dim), dtype),
            sd((num_reqs, max_kv // page_size), jnp.int32),
            sd((num_reqs + 1,), jnp.int32), sd((num_reqs,), jnp.int32))
    fn = partial(ragged_paged_attention, scale=head_dim**-0.5, max_q=max_q, window=window,
                 soft_cap=soft_cap, blocks=blocks, interpret=False)
    text = _cuda_text(fn, *args)
    assert text.count(TRITON_CALL) == 1
    assert "stablehlo.gather" not in text  # K/V are read by the kernel, never gathered
    num_q_blocks = -(-max_q // (blocks.rows // group))
    assert _grid(text) == (num_reqs * num_q_blocks, kv_heads, blocks.num_splits)
    assert (blocks.num_splits > 1) == (max_q == 1)  # decode at 8k context is split


def test_kv_write_lowers_for_cuda_aliased_in_place() -> None:
    pool = sd((1024, 16, 8, 128), jnp.bfloat16)
    new = sd((64, 8, 128), jnp.float32)
    text = _cuda_text(partial(write_kv_pages, interpret=False), pool, pool, new, new,
                      sd((64,), jnp.int32), donate_argnums=(0, 1))
    assert text.count(TRITON_CALL) == 1
    assert "operand_index = 3" in text and "operand_index = 4" in text  # pools aliased
    assert text.count("tf.aliasing_output") == 2  # and donated through the jit
    assert "stablehlo.scatter" not in text and "stablehlo.gather" not in text
    assert _grid(text) == (64 // 16, 8, 1)


def test_model_forward_with_pallas_backend_lowers_for_cuda() -> None:
    cfg = ModelConfig(model_type="qwen3", vocab_size=256, hidden_size=128,
                      intermediate_size=256, num_layers=3, num_heads=8, num_kv_heads=2,
                      head_dim=64, qk_norm=True, sliding_windows=(None, None, 32))
    params = jax.eval_shape(
        lambda: stack_layers(cfg, init_params(cfg, jax.random.key(0), jnp.bfloat16)))
    kv = jax.tree.map(lambda a: sd(a.shape, jnp.bfloat16), init_kv_pool(cfg, 256, jnp.float32))
    i32 = partial(sd, dtype=jnp.int32)
    md = AttentionMetadata(i32((32,)), i32((32,)), i32((32,)), i32((4,)), i32((4,)),
                           i32((4,)), i32((4,)), i32((5, 512)))
    backend = partial(pallas_attention, page_size=16, interpret=False)
    fn = partial(forward, cfg=cfg, backend=backend)
    text = _cuda_text(fn, params, kv, i32((32,)), md, donate_argnums=(1,))
    # One KV write and one attention kernel per layer group, in its scan's body: layers
    # 0-1 share theirs, the window makes layer 2's attention a different kernel
    # (identical kernels may be shared private functions).
    assert len(layer_groups(cfg)) == 2
    assert text.count(TRITON_CALL) == 3
    for kernel in ("write_kv_pages", "ragged_paged_attention"):
        assert len(re.findall(rf"call @{kernel}(_\d+)?\(", text)) == 2


def test_unsupported_head_dim_is_a_clear_error_not_a_triton_crash() -> None:
    args = (sd((4, 4, 96), jnp.float32), sd((8, 16, 2, 96), jnp.bfloat16),
            sd((8, 16, 2, 96), jnp.bfloat16), sd((2, 4), jnp.int32), sd((3,), jnp.int32),
            sd((2,), jnp.int32))
    fn = partial(ragged_paged_attention, scale=0.1, interpret=False)
    with pytest.raises(ValueError, match="head_dim to be a power of two"):
        _cuda_text(fn, *args)
