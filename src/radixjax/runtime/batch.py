"""Host-side (numpy) step batch: pack requests' new tokens along one axis, pad every size
to a bucket, and point padding at the dummy slot 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from radixjax.model.attention import AttentionMetadata, BatchShape

DUMMY_SLOT = 0


class BucketError(ValueError):
    """A step is larger than the largest configured bucket."""


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from lo up to and including hi (hi itself is added if not a power)."""
    out, n = [], lo
    while n < hi:
        out.append(n)
        n *= 2
    out.append(hi)
    return tuple(out)


def pick_bucket(n: int, buckets: tuple[int, ...], what: str) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise BucketError(f"{what}={n} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Buckets:
    tokens: tuple[int, ...]  # T
    reqs: tuple[int, ...]  # B
    kv: tuple[int, ...]  # K

    @staticmethod
    def default(max_tokens: int, max_reqs: int, max_context: int) -> Buckets:
        return Buckets(
            tokens=pow2_buckets(1, max_tokens),
            reqs=pow2_buckets(1, max_reqs),
            kv=pow2_buckets(min(128, max_context), max_context),
        )

    def shape_for(self, num_tokens: int, num_reqs: int, max_q: int, max_kv: int) -> BatchShape:
        t = pick_bucket(num_tokens, self.tokens, "tokens")
        return BatchShape(
            num_tokens=t,
            num_reqs=pick_bucket(num_reqs, self.reqs, "requests"),
            max_q=min(pick_bucket(max_q, self.tokens, "q_len"), t),
            max_kv=pick_bucket(max_kv, self.kv, "kv_len"),
        )


class RequestSlice(NamedTuple):
    """One request's share of a step."""

    new_tokens: np.ndarray  # [q_len] int32, tokens at positions kv_len-q_len .. kv_len-1
    kv_slots: np.ndarray  # [kv_len] int32, slot of every position 0..kv_len-1 (a
    # req_to_token row); the last q_len entries are where the new tokens' K/V go
    row: int = 0  # the request's row in the device token buffer (its req_to_token row)
    first_from_device: bool = False  # new_tokens[0] is a placeholder: take the token the
    # previous step sampled for this row (the overlap scheduler's future map)
    # Output-token counts for frequency/presence penalties (runtime/penalties.py):
    reset_counts: bool = False  # zero the row's counts first (a new admission)
    count_from: int = 1 << 30  # fed tokens at positions >= this are added to the counts
    count_sampled: bool = False  # the sampled token is a real output: count it


class TokenSource(NamedTuple):
    """Where each input token comes from, and where sampled tokens go (the future map).

    The device keeps `last_tokens [num_rows]`: each step writes its sampled token of
    request b at req_row[b]; a token with use_last reads last_tokens[token_row[t]]
    instead of input_ids[t], so a decode step can be dispatched before the previous
    step's tokens reach the host."""

    use_last: np.ndarray  # [T] bool
    token_row: np.ndarray  # [T] int32
    req_row: np.ndarray  # [B] int32 (padded requests: the spare last row)
    count_input: np.ndarray  # [T] bool, add this fed token to its request's counts
    reset_row: np.ndarray  # [B] bool
    count_sampled: np.ndarray  # [B] bool


class HostBatch(NamedTuple):
    input_ids: np.ndarray  # [T] int32
    md: AttentionMetadata  # fields as numpy arrays
    shape: BatchShape
    num_reqs: int  # real (unpadded) requests
    src: TokenSource | None = None


def build_batch(
    reqs: list[RequestSlice], buckets: Buckets, spare_row: int = 0
) -> HostBatch:
    """Pack and pad; `spare_row` is the token-buffer row padded requests write to."""
    if not reqs:
        raise ValueError("a step needs at least one request")
    q_lens = [len(r.new_tokens) for r in reqs]
    kv_lens = [len(r.kv_slots) for r in reqs]
    for q, k in zip(q_lens, kv_lens, strict=True):
        if q < 1 or k < q:
            raise ValueError(f"bad request slice: q_len={q}, kv_len={k}")
    shape = buckets.shape_for(sum(q_lens), len(reqs), max(q_lens), max(kv_lens))
    t, b = shape.num_tokens, shape.num_reqs

    input_ids = np.zeros(t, np.int32)
    positions = np.zeros(t, np.int32)
    out_slots = np.full(t, DUMMY_SLOT, np.int32)
    token_req = np.zeros(t, np.int32)
    q_start = np.zeros(b, np.int32)
    q_len = np.zeros(b, np.int32)
    kv_len = np.zeros(b, np.int32)
    kv_slots = np.full((b, shape.max_kv), DUMMY_SLOT, np.int32)
    use_last = np.zeros(t, bool)
    token_row = np.zeros(t, np.int32)
    req_row = np.full(b, spare_row, np.int32)
    count_input = np.zeros(t, bool)
    reset_row = np.zeros(b, bool)
    count_sampled = np.zeros(b, bool)
    start = 0
    for i, (r, q, k) in enumerate(zip(reqs, q_lens, kv_lens, strict=True)):
        end = start + q
        input_ids[start:end] = r.new_tokens
        positions[start:end] = np.arange(k - q, k)
        out_slots[start:end] = r.kv_slots[k - q :]
        token_req[start:end] = i
        q_start[i], q_len[i], kv_len[i] = start, q, k
        kv_slots[i, :k] = r.kv_slots
        use_last[start] = r.first_from_device
        token_row[start:end] = r.row
        req_row[i] = r.row
        count_input[start:end] = positions[start:end] >= r.count_from
        reset_row[i] = r.reset_counts
        count_sampled[i] = r.count_sampled
        start = end
    q_start[len(reqs) :] = start  # padded requests: empty range at the end
    md = AttentionMetadata(positions, out_slots, token_req, q_start, q_len, kv_len, kv_slots)
    src = TokenSource(use_last, token_row, req_row, count_input, reset_row, count_sampled)
    return HostBatch(input_ids, md, shape, len(reqs), src)
