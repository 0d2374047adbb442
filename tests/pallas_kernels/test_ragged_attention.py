"""The ragged paged-attention kernel (interpret mode on CPU) against its jnp reference:
decode, prefill, extend-with-prefix and mixed batches; page sizes 1 and 16; GQA 1/3/8;
lengths 1 and page boundaries +-1; split-K; sliding window; soft-cap; bf16."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pallas_kernels.blocks import AttentionBlocks
from pallas_kernels.ragged_attention import ragged_paged_attention
from pallas_kernels.ref import ragged_paged_attention_ref
from tests.pallas_kernels.cases import make_case, rel_err

# Several q tiles and key blocks per request, and still valid Triton tiles (>= 16), so
# on a GPU these tests run the compiled kernel unchanged.
SMALL = AttentionBlocks(rows=16, block_k=16)


def _mixed(p: int) -> list[tuple[int, int]]:
    """(q_len, kv_len): decodes at kv 1 and a page boundary -1/0/+1, a fresh prefill past
    a boundary, an extend whose cached prefix ends mid-page."""
    return [(1, 1), (1, p - 1 if p > 1 else 2), (1, p), (1, p + 1), (p + 1, p + 1),
            (3, 2 * p + 1)]


def _run(case, **kw):
    args = (case.q, case.k_pages, case.v_pages, case.page_table, case.cu_q_lens, case.kv_lens)
    ours = ragged_paged_attention(*args, max_q=case.max_q, **kw)
    ref = ragged_paged_attention_ref(*args, **{k: v for k, v in kw.items() if k != "blocks"})
    return np.asarray(ours), np.asarray(ref)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_mixed_batch_matches_reference(page_size: int, group: int) -> None:
    case = make_case(_mixed(page_size), page_size=page_size, kv_heads=2, group=group,
                     seed=page_size + group)
    ours, ref = _run(case, scale=0.3, blocks=SMALL)
    assert rel_err(ours, ref) < 1e-5
    assert np.all(ours[int(case.cu_q_lens[-1]):] == 0)  # padded tokens


def test_prefill_only_with_window_and_soft_cap() -> None:
    case = make_case([(17, 17), (1, 1), (16, 16)], page_size=16, kv_heads=1, group=3, seed=7)
    for window, cap in [(None, None), (5, None), (None, 2.0), (9, 4.0)]:
        ours, ref = _run(case, scale=0.5, window=window, soft_cap=cap, blocks=SMALL)
        assert rel_err(ours, ref) < 1e-5, (window, cap)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_only_split_k(num_splits: int) -> None:
    """FlashDecoding: each split's partial output and log-sum-exp, merged by the wrapper;
    3 splits over 1..3 key blocks leave some splits empty for the short requests."""
    case = make_case([(1, 1), (1, 15), (1, 16), (1, 17), (1, 40)], page_size=16,
                     kv_heads=2, group=8, seed=11)
    blocks = AttentionBlocks(rows=16, block_k=16, num_splits=num_splits)
    ours, ref = _run(case, scale=0.25, blocks=blocks)
    assert rel_err(ours, ref) < 1e-5
    ours_w, ref_w = _run(case, scale=0.25, window=6, blocks=blocks)
    assert rel_err(ours_w, ref_w) < 1e-5


def test_bf16_pool_and_default_blocks() -> None:
    case = make_case(_mixed(16), page_size=16, kv_heads=2, group=3,
                     dtype=jax.numpy.bfloat16, seed=5)
    ours, ref = _run(case, scale=0.3)
    assert rel_err(ours, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs an NVIDIA GPU")
def test_compiled_kernel_on_gpu_matches_reference() -> None:
    """The real Triton kernel (interpret=False) at serving-like sizes; CPU twin: the
    interpret-mode tests above run the same kernel body."""
    reqs = [(1, 1), (1, 2047), (1, 2048), (1, 2049), (128, 128), (37, 1200)]  # ref: ~1.4 GB
    case = make_case(reqs, page_size=16, kv_heads=8, group=4, head_dim=128, seed=3)
    for splits in (1, 8):
        ours, ref = _run(case, scale=128**-0.5,
                         blocks=AttentionBlocks(rows=64, block_k=64, num_splits=splits),
                         interpret=False)
        assert rel_err(ours, ref) < 1e-5
