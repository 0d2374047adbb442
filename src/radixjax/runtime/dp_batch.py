"""DP attention's step batch (host side, numpy): every rank's own batch (or none: an idle
rank) padded to one bucket and laid end to end, one chunk per rank, as
parallel/dp_attention.py expects:

    rank r's batch (Tr tokens, Br requests, local rows and slots)
        -> padded to (Tl, Bl) = the largest rank's bucket
        -> token_req + r * Bl, q_start + r * Tl, rows + r * rows_per_rank
    merged: T = N * Tl, B = N * Bl; slots stay each rank's own (its pool chunk)

Results come back per rank by slicing the [B] and [T] arrays (`rank_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from radixjax.model.attention import AttentionMetadata, BatchShape
from radixjax.runtime.batch import DUMMY_SLOT, Buckets, HostBatch, PromptScores, TokenSource
from radixjax.runtime.model_runner import StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams


@dataclass(frozen=True)
class RankStep:
    """One rank's share of a DP attention step (host is None: the rank is idle)."""

    host: HostBatch | None
    params: list[SamplingParams]
    seeds: list[int]
    opts: StepOptions | None
    token_mask: np.ndarray | None


@dataclass(frozen=True)
class MergedStep:
    host: HostBatch
    sampling: SamplingArrays
    opts: StepOptions
    token_mask: np.ndarray | None
    tokens_per_rank: int  # Tl
    reqs_per_rank: int  # Bl


def _pad(a: np.ndarray, n: int, value: object) -> np.ndarray:
    """Pad the leading axis of a to n with value."""
    extra = np.full((n - a.shape[0], *a.shape[1:]), value, a.dtype)
    return np.concatenate([a, extra])


def _idle(spare_row: int) -> HostBatch:
    """A rank with nothing to run: no tokens, no requests (padding fills it)."""
    z = np.zeros(0, np.int32)
    md = AttentionMetadata(z, z, z, z, z, z, z, None, shared_len=z)
    src = TokenSource(np.zeros(0, bool), z, z, np.zeros(0, bool), np.zeros(0, bool),
                      np.zeros(0, bool), z)
    return HostBatch(z, md, BatchShape(0, 0), 0, src)


def _pad_batch(h: HostBatch, tl: int, bl: int, spare: int, rank: int,
               row_offset: int) -> HostBatch:
    """h padded to (tl, bl) and moved to rank's chunk (indices and rows offset)."""
    md, src = h.md, h.src
    end = int(md.q_len.sum())  # padded requests: an empty range after the real tokens
    md = AttentionMetadata(
        positions=_pad(md.positions, tl, 0),
        out_slots=_pad(md.out_slots, tl, DUMMY_SLOT),
        token_req=_pad(md.token_req, tl, 0) + rank * bl,
        q_start=_pad(md.q_start, bl, end) + rank * tl,
        q_len=_pad(md.q_len, bl, 0),
        kv_len=_pad(md.kv_len, bl, 0),
        req_row=_pad(md.req_row, bl, spare) + row_offset,
        req_to_token=None,
        shared_len=_pad(md.shared_len, bl, 0),  # the rank's own (its own pool's slots)
    )
    src = TokenSource(
        use_last=_pad(src.use_last, tl, False),
        token_row=_pad(src.token_row, tl, spare) + row_offset,
        req_row=md.req_row,
        count_input=_pad(src.count_input, tl, False),
        reset_row=_pad(src.reset_row, bl, False),
        count_sampled=_pad(src.count_sampled, bl, False),
        sample_at=_pad(src.sample_at, bl, -1),  # (no verify steps with DP attention)
    )
    scores = None
    if h.scores is not None:
        scores = PromptScores(_pad(h.scores.next_ids, tl, 0), _pad(h.scores.mask, tl, False))
    syncs = tuple((row + row_offset, slots) for row, slots in h.row_syncs)
    return HostBatch(_pad(h.input_ids, tl, 0), md, BatchShape(tl, bl), h.num_reqs, src,
                     syncs, scores)


def merge_rank_steps(steps: list[RankStep], buckets: Buckets, rows_per_rank: int,
                     mask_width: int) -> MergedStep:
    """buckets: one rank's (ranks = 1); rows_per_rank: its table rows, the last its spare."""
    busy = [s.host for s in steps if s.host is not None]
    if not busy:
        raise ValueError("a DP attention step needs at least one busy rank")
    shape = buckets.shape_of(max(h.shape.num_tokens for h in busy))
    tl, bl = shape.num_tokens, shape.num_reqs
    spare = rows_per_rank - 1
    padded = [_pad_batch(s.host if s.host is not None else _idle(spare), tl, bl, spare, r,
                         r * rows_per_rank) for r, s in enumerate(steps)]

    def cat(get) -> np.ndarray:
        return np.concatenate([get(h) for h in padded])

    md = AttentionMetadata(*(cat(lambda h, i=i: h.md[i]) for i in range(7)), None,
                           shared_len=cat(lambda h: h.md.shared_len))
    src = TokenSource(*(cat(lambda h, i=i: h.src[i]) for i in range(len(TokenSource._fields))))
    scores = None
    if any(h.scores is not None for h in padded):
        none = PromptScores.none(tl)
        scores = PromptScores(cat(lambda h: (h.scores or none).next_ids),
                              cat(lambda h: (h.scores or none).mask))
    host = HostBatch(cat(lambda h: h.input_ids), md, BatchShape(tl * len(steps), bl * len(steps)),
                     sum(h.num_reqs for h in padded), src,
                     tuple(s for h in padded for s in h.row_syncs), scores)
    sampling = [SamplingArrays.build(s.params, s.seeds, bl) for s in steps]
    sampling = SamplingArrays(*(np.concatenate(f) for f in zip(*sampling, strict=True)))
    mask = None
    if any(s.token_mask is not None for s in steps):
        ones = np.full((bl, mask_width), -1, np.int32)
        mask = np.concatenate([ones if s.token_mask is None else _pad(s.token_mask, bl, -1)
                               for s in steps])
    opts = StepOptions(**{f.name: any(getattr(s.opts, f.name) for s in steps if s.opts)
                          for f in fields(StepOptions)})
    return MergedStep(host, sampling, opts, mask, tl, bl)


def rank_rows(arrays: tuple, rank: int, step: MergedStep) -> tuple:
    """The step's fetched results ((tokens, logprobs, top ids, top logprobs), prompt
    logprobs or None) -> rank's own rows of them (None entries stay None)."""
    sample, prompt = arrays
    b, t = step.reqs_per_rank, step.tokens_per_rank

    def cut(x: np.ndarray | None, n: int) -> np.ndarray | None:
        return None if x is None else x[rank * n:(rank + 1) * n]

    return (tuple(cut(x, b) for x in sample),
            None if prompt is None else tuple(cut(x, t) for x in prompt))
