"""Host-side (numpy) step batch: pack requests' new tokens along one axis, pad every size
to a bucket, and point padding at the dummy slot 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from radixjax.model.attention import SHARED_PREFIX_MIN_BATCH, AttentionMetadata, BatchShape

DUMMY_SLOT = 0


class BucketError(ValueError):
    """A step is larger than the largest configured bucket."""


# From this many tokens the buckets also hold the midpoints 1.5 x 2^k (384, 768, ..): a
# step costs its bucket's tokens, not its own, and the large ones are prefill waves.
# SmolLM2 w8a8, 8 requests x 42 new tokens on an 800-token cached prefix (336 tokens):
# bucket 512 1235 ms, 384 946 ms (benchmarks/README.md, fourteenth session).
MIDPOINTS_FROM = 256


def token_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from lo, with the midpoints 3 x 2^k from MIDPOINTS_FROM on, up to
    and including hi (hi itself is added if not one of them)."""
    out, n = [], lo
    while n < hi:
        out.append(n)
        if n >= MIDPOINTS_FROM and n * 3 // 2 < hi:
            out.append(n * 3 // 2)
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
    """Token-count buckets; the request bucket of a step follows from its token bucket
    (a step of T tokens has at most T requests), so T alone names a compiled program."""

    tokens: tuple[int, ...]  # T
    max_reqs: int  # B never exceeds this (the engine's max running requests)
    # DP attention (engine/dp_attention.py): a program runs `ranks` chunks of one bucket
    # each, one per DP rank, so its shape is ranks x the bucket's
    ranks: int = 1

    @staticmethod
    def default(max_tokens: int, max_reqs: int, ranks: int = 1) -> Buckets:
        return Buckets(tokens=token_buckets(1, max_tokens), max_reqs=max_reqs, ranks=ranks)

    def shape_of(self, num_tokens: int) -> BatchShape:
        """The shape of the program for a token bucket."""
        return BatchShape(num_tokens=num_tokens * self.ranks,
                          num_reqs=min(num_tokens, self.max_reqs) * self.ranks)

    @property
    def shapes(self) -> list[BatchShape]:
        """Every shape a step can have: the whole set of compiled step programs."""
        return [self.shape_of(t) for t in self.tokens]

    def shape_for(self, num_tokens: int, num_reqs: int) -> BatchShape:
        if num_reqs > self.max_reqs:
            raise BucketError(f"requests={num_reqs} exceeds the largest bucket {self.max_reqs}")
        return self.shape_of(pick_bucket(num_tokens, self.tokens, "tokens"))


class RequestSlice(NamedTuple):
    """One request's share of a step."""

    new_tokens: np.ndarray  # [q_len] int32, tokens at positions kv_len-q_len .. kv_len-1
    kv_slots: np.ndarray  # [kv_len] int, slot of every position 0..kv_len-1 (a
    # req_to_token row); the last q_len entries are where the new tokens' K/V go. A view
    # of a buffer that outlives the step (numpy .base) must be append-only there: the
    # positions a step saw never change (PrefixMemo relies on it; engine/request.py)
    row: int | None = None  # the request's row of the device req_to_token table and
    # token buffer; None (tests, one-off steps): rows 0, 1, .. in order, always synced
    first_from_device: bool = False  # new_tokens[0] is a placeholder: take the token the
    # previous step sampled for this row (the overlap scheduler's future map)
    # Output-token counts for frequency/presence penalties (runtime/penalties.py):
    reset_counts: bool = False  # zero the row's counts first (a new admission)
    count_from: int = 1 << 30  # fed tokens at positions >= this are added to the counts
    count_sampled: bool = False  # the sampled token is a real output: count it
    sync_row: bool = True  # upload kv_slots as the device row first; False: the device
    # row already holds positions 0 .. kv_len-q_len-1 (the step writes the new ones)
    num_samples: int = 1  # sample after each of the last num_samples new tokens (a
    # verify step's k drafts and the token before them: k + 1; engine/speculative.py)
    # [q_len] int: the new tokens' slots in the sliding-window layers' own pool
    # (cache/window_kv.py); None: the runner has none
    window_slots: np.ndarray | None = None


class TokenSource(NamedTuple):
    """Where each input token comes from, and where sampled tokens go (the future map).

    The device keeps `last_tokens [num_rows]`: each step writes its sampled token of
    request b at req_row[b]; a token with use_last reads last_tokens[token_row[t]]
    instead of input_ids[t], so a decode step can be dispatched before the previous
    step's tokens reach the host."""

    use_last: np.ndarray  # [T] bool
    token_row: np.ndarray  # [T] int32 (padding tokens: the spare row)
    req_row: np.ndarray  # [B] int32 (padded requests: the spare last row)
    count_input: np.ndarray  # [T] bool, add this fed token to its request's counts
    reset_row: np.ndarray  # [B] bool
    count_sampled: np.ndarray  # [B] bool
    # [B] int32, the packed token each sampling row samples after (its logits, and the
    # position + 1 its key folds in); -1: row b samples after request b's last new token.
    # A verify step samples after several tokens of a request: its rows are then sampling
    # rows, not requests (build_batch: sample_rows)
    sample_at: np.ndarray


class PromptScores(NamedTuple):
    """Which tokens of the step score the prompt token after them (prompt logprobs)."""

    next_ids: np.ndarray  # [T] int32, the prompt token that follows token t
    mask: np.ndarray  # [T] bool, token t is scored

    @staticmethod
    def none(num_tokens: int) -> PromptScores:
        return PromptScores(np.zeros(num_tokens, np.int32), np.zeros(num_tokens, bool))


class HostBatch(NamedTuple):
    input_ids: np.ndarray  # [T] int32
    md: AttentionMetadata  # fields as numpy arrays; req_to_token is None (device-side)
    shape: BatchShape
    num_reqs: int  # real (unpadded) requests
    src: TokenSource
    row_syncs: tuple[tuple[int, np.ndarray], ...] = ()  # (row, slots) to upload first
    scores: PromptScores | None = None  # None: nothing scored


SHARED_PREFIX_MIN = 64  # shorter common prefixes are read per request (not worth a pass)


# A request alone takes the pass from this share of the step's rows (1 / this): SmolLM2
# w8a8 + bf16 KV steps, loop vs pass (min ms): 300 new tokens of 384 rows on 1000 cached
# (and another request) 700 -> 599; 60 of 64 on 800 129 -> 123; 200 of 512 on 1000 (and
# two more) 786 -> 783; 100 of 256 on 1000 (and another) 490 -> 512, worse; 38 of 384 on
# 800 (and seven more) 768 -> 780.
ALONE_MIN_SHARE = 2


class PrefixMemo:
    """The last step's shared-prefix group (the buffers its cached slots are views of)
    and its common length. While the group is the same buffers, the length is too: they
    only grow by appending fresh slots, which no other request holds, and a request
    whose slots are replaced gets a new buffer. So a decode step compares nothing."""

    def __init__(self) -> None:
        self.bases: tuple[np.ndarray, ...] = ()  # held: their ids are never reused
        self.length = 0

    def get(self, bases: tuple) -> int | None:
        same = len(bases) == len(self.bases) and all(
            a is not None and a is b for a, b in zip(bases, self.bases, strict=True))
        return self.length if same else None

    def put(self, bases: tuple, length: int) -> None:
        self.bases, self.length = bases, length


def shared_prefix_lens(reqs: list[RequestSlice], num_rows: int | None = None,
                       memo: PrefixMemo | None = None) -> np.ndarray:
    """[len(reqs)] int32: each request's share of the step's shared prefix (0: none),
    the run of slots from position 0 that a group of requests holds in common in their
    cached parts (positions before their new tokens; radix-cached prefixes are the same
    slots). The group: the requests whose first cached slot is the most common one; where
    no two requests share one, the extending request with the most attention over its
    cached part (new tokens x cached keys) alone, if its new tokens are at least
    1 / ALONE_MIN_SHARE of the step's `num_rows` token rows (the pass computes them all):
    a long prompt's later chunk, a chat's next turn, read in the pass's large blocks, not
    the extend loop's query tiles (benchmarks/README.md, nineteenth session).
    The prefix counts only if it is at least SHARED_PREFIX_MIN long. memo: the group's
    length from an earlier step, if the group is the same buffers (O(B), not O(context))."""
    out = np.zeros(len(reqs), np.int32)
    cached = [np.asarray(r.kv_slots[: len(r.kv_slots) - len(r.new_tokens)]) for r in reqs]
    firsts = np.array([c[0] if len(c) else -1 for c in cached])
    values, counts = np.unique(firsts[firsts >= 0], return_counts=True)
    if not len(counts):
        return out
    if counts.max() < 2:
        rows = sum(len(r.new_tokens) for r in reqs) if num_rows is None else num_rows
        best = _alone(reqs, cached, rows)
        if best is not None:
            out[best] = len(cached[best])
        return out
    (group,) = np.nonzero(firsts == values[counts.argmax()])
    bases = tuple(cached[i].base for i in group)
    length = memo.get(bases) if memo is not None else None
    if length is None:
        length = _common_run([cached[i] for i in group])
        if memo is not None:
            memo.put(bases, length)
    if length >= SHARED_PREFIX_MIN:
        out[group] = length
    return out


def _common_run(slots: list[np.ndarray]) -> int:
    """The length of the run from position 0 that every array holds in common."""
    base = slots[0]
    length = len(base)
    for other in slots[1:]:
        n = min(length, len(other))
        differ = np.flatnonzero(base[:n] != other[:n])
        length = int(differ[0]) if differ.size else n
    return length


def _alone(reqs: list[RequestSlice], cached: list[np.ndarray], rows: int) -> int | None:
    """The request that takes the pass alone (none shares a first cached slot): the
    extending one with the most new tokens x cached keys, if its cached part is at least
    SHARED_PREFIX_MIN and its new tokens 1 / ALONE_MIN_SHARE of the step's rows; or None."""
    work = [len(c) * len(r.new_tokens) if len(r.new_tokens) > 1 else 0
            for r, c in zip(reqs, cached, strict=True)]
    best = int(np.argmax(work))
    if (work[best] and len(cached[best]) >= SHARED_PREFIX_MIN
            and len(reqs[best].new_tokens) * ALONE_MIN_SHARE >= rows):
        return best
    return None


def sample_rows(q_start: np.ndarray, q_len: np.ndarray, num_samples: list[int]) -> np.ndarray:
    """[sum(num_samples)] int32: the packed tokens each request samples after, request by
    request: its last num_samples new tokens."""
    return np.concatenate([np.arange(q0 + q - s, q0 + q, dtype=np.int32) for q0, q, s in
                           zip(q_start, q_len, num_samples, strict=False)])


def build_batch(reqs: list[RequestSlice], buckets: Buckets,
                prefix_memo: PrefixMemo | None = None) -> HostBatch:
    """Pack and pad. Request rows are 0 .. max_reqs-1; row max_reqs is the spare row that
    padded requests and tokens point at (the runner's tables have max_reqs + 1 rows).
    prefix_memo: the caller's, kept from step to step (shared_prefix_lens)."""
    spare_row = buckets.max_reqs
    if not reqs:
        raise ValueError("a step needs at least one request")
    q_lens = [len(r.new_tokens) for r in reqs]
    kv_lens = [len(r.kv_slots) for r in reqs]
    for q, k in zip(q_lens, kv_lens, strict=True):
        if q < 1 or k < q:
            raise ValueError(f"bad request slice: q_len={q}, kv_len={k}")
    if all(r.row is None for r in reqs):
        reqs = [r._replace(row=i, sync_row=True) for i, r in enumerate(reqs)]
    rows = [r.row for r in reqs]
    if None in rows or len(set(rows)) != len(rows) or not all(0 <= r < spare_row for r in rows):
        raise ValueError(f"request rows must be distinct and in [0, {spare_row}): {rows}")
    num_samples = [r.num_samples for r in reqs]
    if any(not 1 <= s <= q for s, q in zip(num_samples, q_lens, strict=True)):
        raise ValueError(f"num_samples must be in [1, q_len]: {num_samples}, {q_lens}")
    shape = buckets.shape_for(sum(q_lens), max(len(reqs), sum(num_samples)))
    t, b = shape.num_tokens, shape.num_reqs

    input_ids = np.zeros(t, np.int32)
    positions = np.zeros(t, np.int32)
    out_slots = np.full(t, DUMMY_SLOT, np.int32)
    token_req = np.zeros(t, np.int32)
    q_start = np.zeros(b, np.int32)
    q_len = np.zeros(b, np.int32)
    kv_len = np.zeros(b, np.int32)
    use_last = np.zeros(t, bool)
    token_row = np.full(t, spare_row, np.int32)
    req_row = np.full(b, spare_row, np.int32)
    count_input = np.zeros(t, bool)
    reset_row = np.zeros(b, bool)
    count_sampled = np.zeros(b, bool)
    sample_at = np.full(b, -1, np.int32)
    window_out = (np.full(t, DUMMY_SLOT, np.int32)
                  if any(r.window_slots is not None for r in reqs) else None)
    syncs = []
    start = 0
    for i, (r, q, k) in enumerate(zip(reqs, q_lens, kv_lens, strict=True)):
        end = start + q
        input_ids[start:end] = r.new_tokens
        positions[start:end] = np.arange(k - q, k)
        out_slots[start:end] = r.kv_slots[k - q :]
        if window_out is not None:
            window_out[start:end] = r.window_slots
        token_req[start:end] = i
        q_start[i], q_len[i], kv_len[i] = start, q, k
        if r.sync_row and k > q:
            syncs.append((r.row, np.asarray(r.kv_slots[: k - q], np.int32)))
        use_last[start] = r.first_from_device
        token_row[start:end] = r.row
        req_row[i] = r.row
        count_input[start:end] = positions[start:end] >= r.count_from
        reset_row[i] = r.reset_counts
        count_sampled[i] = r.count_sampled
        start = end
    q_start[len(reqs) :] = start  # padded requests: empty range at the end
    if any(s > 1 for s in num_samples):
        sample_at[: sum(num_samples)] = sample_rows(q_start, q_len, num_samples)
        count_sampled[:] = False  # rows are not requests: nothing is counted (no penalties)
    shared_len = np.zeros(b, np.int32)
    if b >= SHARED_PREFIX_MIN_BATCH:  # (smaller programs have no shared-prefix pass)
        shared_len[: len(reqs)] = shared_prefix_lens(reqs, shape.num_tokens, prefix_memo)
    md = AttentionMetadata(positions, out_slots, token_req, q_start, q_len, kv_len, req_row,
                           None, shared_len=shared_len, window_out_slots=window_out)
    src = TokenSource(use_last, token_row, req_row, count_input, reset_row, count_sampled,
                      sample_at)
    return HostBatch(input_ids, md, shape, len(reqs), src, tuple(syncs))
