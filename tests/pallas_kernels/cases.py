"""Random ragged paged-attention inputs (never zeros): scattered pages, padded tokens and
padded requests, garbage in the dummy page and in unused pages."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np


class Case(NamedTuple):
    q: jnp.ndarray  # [T, Hq, D]
    k_pages: jnp.ndarray  # [N, P, Hkv, D]
    v_pages: jnp.ndarray  # [N, P, Hkv, D]
    page_table: jnp.ndarray  # [B, max_pages] int32
    cu_q_lens: jnp.ndarray  # [B + 1] int32
    kv_lens: jnp.ndarray  # [B] int32
    max_q: int


def make_case(reqs: list[tuple[int, int]], *, page_size: int, kv_heads: int, group: int,
              head_dim: int = 16, dtype=jnp.float32, pad_tokens: int = 3, pad_reqs: int = 1,
              seed: int = 0) -> Case:
    """reqs: (q_len, kv_len) per request; the last q_len of kv_len positions are new."""
    rng = np.random.default_rng(seed)
    pages_per_req = [-(-kv // page_size) for _, kv in reqs]
    max_pages = max(pages_per_req)
    num_pages = sum(pages_per_req) + 3  # + dummy page 0 + two never-used pages
    perm = rng.permutation(np.arange(1, num_pages))
    b = len(reqs) + pad_reqs
    page_table = np.zeros((b, max_pages), np.int32)
    start = 0
    for i, n in enumerate(pages_per_req):
        page_table[i, :n] = perm[start : start + n]
        start += n
    q_lens = np.array([q for q, _ in reqs] + [0] * pad_reqs, np.int32)
    kv_lens = np.array([kv for _, kv in reqs] + [0] * pad_reqs, np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    num_tokens = int(cu[-1]) + pad_tokens
    shape = (num_pages, page_size, kv_heads, head_dim)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    q = rng.standard_normal((num_tokens, kv_heads * group, head_dim)).astype(np.float32)
    return Case(jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(v, dtype),
                jnp.asarray(page_table), jnp.asarray(cu), jnp.asarray(kv_lens),
                max(q for q, _ in reqs))


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    assert np.isfinite(ours).all()
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))
