"""Static tiling choices of the ragged paged-attention kernel (one compiled kernel each).

Heuristics, not yet tuned on a GPU (benchmarks/attention_kernel.py measures them):

- rows: query rows per program, tokens x padded q-heads of one KV head. Triton's
  `tl.dot` needs every dim >= 16, so decode (one token per request) still uses 16 rows,
  of which G are real: decode is HBM-bound, the idle MMA rows cost nothing there.
- block_k: keys per inner-loop step (K/V tiles [block_k, head_dim]).
- num_splits: FlashDecoding split of the KV range. Decode grids are small (B x Hkv
  programs), so a long context is cut into splits that run on separate SMs and are
  merged with their log-sum-exp; prefill already has enough programs and uses 1.
"""

from __future__ import annotations

from dataclasses import dataclass

NUM_SMS_HOPPER = 132  # H100 SXM; H200 has the same count


@dataclass(frozen=True)
class AttentionBlocks:
    rows: int = 16
    block_k: int = 64
    num_splits: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("rows", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.num_splits < 1:
            raise ValueError("num_splits must be >= 1")


DEFAULT_BLOCKS = AttentionBlocks()  # a constant (frozen), not mutable state


def choose_blocks(num_reqs: int, num_kv_heads: int, max_q: int, max_kv: int) -> AttentionBlocks:
    """Decode shapes (max_q == 1) get a KV split sized to fill the SMs about twice."""
    if max_q > 1:
        return AttentionBlocks(rows=64, block_k=64, num_splits=1, num_warps=4, num_stages=2)
    block_k = 128
    programs = num_reqs * num_kv_heads
    max_blocks = -(-max_kv // block_k)
    splits = max(1, min(16, max_blocks // 4, (2 * NUM_SMS_HOPPER) // max(programs, 1)))
    return AttentionBlocks(rows=16, block_k=block_k, num_splits=splits, num_warps=4,
                           num_stages=2)
