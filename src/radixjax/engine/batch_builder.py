"""Batch building: which requests run in the next step, and their host batch.

    schedule():  prefill first  - chunked prefills continue, then waiting requests are
                                  admitted in the policy's order (radix match, KV
                                  allocated, a table row) while the token budget and
                                  the pool's reserve for running decodes allow
                                  (SGLang's PrefillAdder); with mixed steps, decodes ride
                                  along; a chunked prefill takes the rest of the step's
                                  token bucket (no padding)
                 else decode    - every running request one token; short of KV, the most
                                  recently admitted are retracted (freed, requeued first)
                 -> ScheduledBatch: the host batch (runtime/batch.py), sampling options,
                                  the grammar bitmask

Host work per step follows the new tokens: a request's tokens are read by position
(Req.ids), its slots are a view of its slot list (appended, never rebuilt), and its
device table row is written only where it changed (RequestSlice.sync_row), and the
shared-prefix group's common length is remembered while the group stays (PrefixMemo).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from radixjax.cache.errors import OutOfKVSlots
from radixjax.cache.manager import KVCacheManager
from radixjax.cache.req_to_token import ReqToTokenPool
from radixjax.engine.config import EngineConfig
from radixjax.engine.constrained import build_token_mask
from radixjax.engine.draft_model import DraftModel
from radixjax.engine.policy import SchedulePolicy, match_tokens
from radixjax.engine.request import Req, ReqState
from radixjax.engine.speculative import StepCosts, eligible, plan, proposal, state_of
from radixjax.engine.stats import EngineStats
from radixjax.engine.waiting_queue import WaitingQueue
from radixjax.runtime.batch import (
    HostBatch,
    PrefixMemo,
    PromptScores,
    RequestSlice,
    build_batch,
    pick_bucket,
)
from radixjax.runtime.model_runner import ModelRunner, StepOptions
from radixjax.sampling.params import SamplingArrays


@dataclass
class ScheduledBatch:
    reqs: list[Req]
    num_new: list[int]  # tokens each request computes in this step
    samples: list[bool]  # whether the request's sampled token is kept
    is_prefill: bool
    host: HostBatch
    opts: StepOptions
    token_mask: np.ndarray | None  # grammar bitmask [B, ceil(V / 32)] int32, if any
    # a verify step (engine/speculative.py): each request's draft tokens, fed after its
    # last token; it samples after each of its 1 + len(drafts) tokens. None: no drafts
    drafts: list[list[int]] | None = None

    @property
    def num_samples(self) -> list[int]:
        """Sampling rows of each request (1, or 1 + its drafts in a verify step)."""
        return rows_per_request(self.drafts, len(self.reqs))

    @property
    def first_rows(self) -> list[int]:
        """Each request's first sampling row (its rows follow one another)."""
        return first_rows(self.num_samples)

    def sampling(self) -> SamplingArrays:
        reqs = [r for r, n in zip(self.reqs, self.num_samples, strict=True) for _ in range(n)]
        return SamplingArrays.build([r.sampling for r in reqs], [r.seed for r in reqs],
                                    self.host.shape.num_reqs)


def rows_per_request(drafts: list[list[int]] | None, num_reqs: int) -> list[int]:
    """Sampling rows of each request: 1, or 1 + its drafts in a verify step."""
    return [1] * num_reqs if drafts is None else [1 + len(d) for d in drafts]


def first_rows(num_samples: list[int]) -> list[int]:
    """Each request's first sampling row, its num_samples rows following one another."""
    return list(itertools.accumulate(num_samples[:-1], initial=0))


class BatchBuilding:
    """The Scheduler's batch building (engine/scheduler.py holds the state it reads)."""

    cfg: EngineConfig
    runner: ModelRunner
    kvm: KVCacheManager
    rows: ReqToTokenPool
    policy: SchedulePolicy
    prefix_memo: PrefixMemo
    stats: EngineStats
    waiting: WaitingQueue
    running: list[Req]
    _num_decode_steps: int
    step_costs: StepCosts | None
    drafter: DraftModel | None

    finish: Callable[..., None]  # Scheduler.finish

    def schedule(self) -> ScheduledBatch | None:
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        return self._schedule_decode()

    # -- prefill ----------------------------------------------------------------------------

    def _schedule_prefill(self) -> ScheduledBatch | None:
        budget = self.cfg.max_prefill_tokens
        reqs: list[Req] = []
        num_new: list[int] = []
        # Requests in the middle of a chunked prefill continue first.
        for r in self.running:
            if r.is_prefilling and budget > 0:
                n = min(r.seq_len - r.num_computed, self.cfg.chunk_size, budget)
                reqs.append(r)
                num_new.append(n)
                budget -= n
        chunking = any(n < r.seq_len - r.num_computed for r, n in zip(reqs, num_new,
                                                                       strict=True))
        # A full running set admits nothing: skip ordering the queue (a prefix match
        # per waiting request) on every decode iteration.
        if (self.waiting and budget > 0 and not chunking
                and len(self.running) < self.cfg.max_running):
            self._admit(reqs, num_new, budget)
        if not reqs:
            return None
        num_extend = len(reqs)
        if self.cfg.enable_mixed:
            decodes = [r for r in self.running if r not in reqs and self._can_decode(r)]
            decodes = self._reserve_decode_slots(decodes, may_retract=False)
            reqs += decodes
            num_new += [1] * len(decodes)
        self._fill_bucket(reqs, num_new, num_extend)
        return self._build(reqs, num_new, is_prefill=True, num_extend=num_extend)

    def _fill_bucket(self, reqs: list[Req], num_new: list[int], num_extend: int) -> None:
        """A step costs its token bucket, not its tokens: chunked prefills take the
        padding the step would carry, up to their prompts' ends (8 distinct 832-token
        prompts, chunks of 512: steps of 832 tokens ran as 1024; issue 53)."""
        total = sum(num_new)
        room = pick_bucket(total, self.runner.buckets.tokens, "tokens") - total
        for i in range(num_extend):
            r = reqs[i]
            more = min(room, r.seq_len - r.num_computed - num_new[i])
            if more > 0:
                num_new[i] += more
                room -= more

    def _admit(self, reqs: list[Req], num_new: list[int], budget: int) -> None:
        """Admit waiting requests in the policy's order into reqs / num_new."""
        ordered = self.policy.order(list(self.waiting), [r for r in reqs if r.is_prefilling])
        reserve = sum(
            int(r.remaining_tokens * self.cfg.new_token_ratio) for r in self.running
        )
        for r in ordered.reqs:
            if budget <= 0 or len(self.running) >= self.cfg.max_running:
                break
            if id(r) in ordered.deferred:
                continue
            if self.cfg.enable_cache:
                match = self.kvm.match_and_lock(match_tokens(r), r.namespace)
            else:
                match = self.kvm.match_and_lock([], r.namespace)
            cached = match.slots.size
            need = self.kvm.round_up(r.seq_len - cached)
            # Nothing running: admit on the prompt alone, or nothing would ever run.
            future = int(r.remaining_tokens * self.cfg.new_token_ratio) if self.running else 0
            if need + reserve + future > self.kvm.available_size():
                self.kvm.tree.dec_lock_ref(match.last_node)
                break
            try:
                new_slots = self.kvm.alloc(need)
            except OutOfKVSlots:
                self.kvm.tree.dec_lock_ref(match.last_node)
                break
            reserve += future
            self._take(r, match.slots, new_slots, match.last_node)
            n = min(r.seq_len - cached, self.cfg.chunk_size, budget)
            reqs.append(r)
            num_new.append(n)
            budget -= n
            if n < r.seq_len - cached:
                break  # one chunked request per step

    def _take(self, r: Req, cached: np.ndarray, new: np.ndarray, last_node: object) -> None:
        """r runs from now: a table row, its cached prefix's slots and new ones."""
        r.row = self.rows.alloc()
        r.slots = np.concatenate([cached, new])
        r.num_cached = r.num_computed = cached.size
        r.last_node = last_node
        r.window = self.kvm.claim_window(r.slots, r.num_cached)
        r.state = ReqState.RUNNING
        r.needs_count_reset = True
        r.row_synced = False
        if r.stats.admitted is None:
            r.stats.admitted = self.stats.now()
            r.stats.prompt_tokens = len(r.prompt_ids)
            r.stats.cached_tokens = min(cached.size, len(r.prompt_ids))
        self.waiting.remove(r)
        self.running.append(r)

    # -- decode and retraction --------------------------------------------------------------

    def _can_decode(self, r: Req) -> bool:
        return (not r.is_prefilling and r.remaining_tokens > 0
                and r.seq_len < self.cfg.max_context)

    def _schedule_decode(self) -> ScheduledBatch | None:
        decodes = [r for r in self.running if self._can_decode(r)]
        if not decodes:
            return None
        self._num_decode_steps += 1
        every = self.cfg.retract_every
        if every and self._num_decode_steps % every == 0 and len(decodes) > 1 \
                and decodes[-1].num_pending == 0:
            self._retract(decodes.pop())
        decodes = self._reserve_decode_slots(decodes, may_retract=True)
        if not decodes:
            return None
        drafts = self._plan_drafts(decodes) if self.cfg.speculative_algorithm else None
        num_new = [1] * len(decodes) if drafts is None else [1 + len(d) for d in drafts]
        return self._build(decodes, num_new, is_prefill=False, drafts=drafts)

    def _plan_drafts(self, decodes: list[Req]) -> list[list[int]] | None:
        """Each request's drafts for this decode step (engine/speculative.py: proposals,
        then the plan; or the draft model's), with KV slots for them; None when no
        request drafts."""
        cfg = self.cfg
        if any(r.sampling.has_penalties for r in decodes):
            return None
        max_ks = [min(cfg.speculative_num_draft_tokens, r.remaining_tokens - 1,
                      cfg.max_context - r.seq_len - 1)
                  if r.num_pending == 0 and eligible(r) else 0 for r in decodes]
        if self.drafter is None:
            tree = self.kvm.tree if cfg.enable_cache else None
            proposals = [proposal(r, cfg, k, tree) if k > 0 else []
                         for r, k in zip(decodes, max_ks, strict=True)]
            lengths = [len(p) for p in proposals]
        else:
            lengths = [max(k, 0) for k in max_ks]
        if not any(lengths):
            return None
        alphas = [state_of(r, cfg).alpha if n else 0.0
                  for r, n in zip(decodes, lengths, strict=True)]
        ks = plan(alphas, lengths, self.step_costs, cfg.max_running)
        ks = [self._draft_slots(r, k) for r, k in zip(decodes, ks, strict=True)]
        if not any(ks):
            return None
        if self.drafter is not None:
            proposals = self.drafter.propose(decodes, ks)
        return [p[:k] for p, k in zip(proposals, ks, strict=True)]

    def _draft_slots(self, r: Req, k: int) -> int:
        """KV slots for r's k drafts; the drafts it can have (0: no room, never evict or
        retract for drafts)."""
        need = self.kvm.round_up(r.num_computed + 1 + k) - r.slots.size
        if k and need > 0:
            if need > self.kvm.available_size():
                return 0
            r.append_slots(self.kvm.alloc(need))
        return k

    def decode_may_retract(self) -> bool:
        """Whether the next decode step could retract (short of KV, or the test hook):
        then the step in flight is drained first (retraction needs its tokens)."""
        every = self.cfg.retract_every
        if every and (self._num_decode_steps + 1) % every == 0:
            return True
        return self._decode_shortfall([r for r in self.running if self._can_decode(r)]) > 0

    def _decode_shortfall(self, decodes: list[Req]) -> int:
        need = sum(self.kvm.page_size for r in decodes if r.num_computed >= r.slots.size)
        return need - self.kvm.available_size()

    def _reserve_decode_slots(self, decodes: list[Req], may_retract: bool) -> list[Req]:
        """Give each request a slot for its next position. While the pool (free +
        evictable) is short, retract the most recently admitted requests (run_once has
        drained the in-flight step first), or, in a mixed step, skip decoding."""
        if self._decode_shortfall(decodes) > 0:
            if not may_retract or any(r.num_pending for r in decodes):
                return []
            while len(decodes) > 1 and self._decode_shortfall(decodes) > 0:
                self._retract(decodes.pop())
            if decodes and self._decode_shortfall(decodes) > 0:  # one request fills the pool
                self.finish(decodes.pop(), "length")
        for r in decodes:
            if r.num_computed >= r.slots.size:
                r.append_slots(self.kvm.alloc(self.kvm.page_size))
        return decodes

    def _retract(self, r: Req) -> None:
        """Free a running request's KV at once (not cached) and requeue it first."""
        assert r.num_pending == 0, "drain the in-flight step before retracting"
        self.running.remove(r)
        self.kvm.release(r.slots, r.last_node, r.num_cached, r.window)
        self.rows.free(r.row)
        r.row, r.slots, r.last_node, r.window = -1, r.slots[:0], None, None
        r.num_cached = r.num_computed = 0
        r.state = ReqState.WAITING
        r.stats.num_retractions += 1
        self.stats.num_retractions += 1
        self.waiting.push_front(r)

    # -- the host batch ---------------------------------------------------------------------

    def _build(self, reqs: list[Req], num_new: list[int], is_prefill: bool,
               num_extend: int = 0, drafts: list[list[int]] | None = None) -> ScheduledBatch:
        """num_extend: the leading requests that extend (prefill); the rest decode.
        drafts: a verify step's (each request's draft tokens, fed after its last one)."""
        slices, samples = [], []
        for r in self.running:  # window KV behind each request's window goes back first
            self.kvm.advance_window(r.window, r.slots, r.num_computed)
        for i, (r, n) in enumerate(zip(reqs, num_new, strict=True)):
            draft = drafts[i] if drafts is not None else []
            start, end = r.num_computed, r.num_computed + n
            known_end = end - len(draft)  # the drafts follow the request's known tokens
            from_device = r.num_pending > 0 and known_end == r.seq_len
            tokens = np.array((r.ids(start, known_end) if not from_device
                               else r.ids(start, known_end - 1) + [0]) + draft, np.int32)
            self.rows.write(r.row, start, r.slots[start:end])
            # Penalty counts: outputs fed by an extend are (re)counted; a decode's input
            # was counted when it was sampled.
            count_from = len(r.prompt_ids) if i < num_extend else 1 << 30
            slices.append(RequestSlice(
                tokens, r.slots[:end], r.row,
                first_from_device=from_device and n == 1, reset_counts=r.needs_count_reset,
                count_from=count_from, count_sampled=known_end == r.seq_len,
                sync_row=not r.row_synced, num_samples=1 + len(draft),
                window_slots=self.kvm.assign_window(r.slots[start:end])))
            r.needs_count_reset = False
            r.row_synced = True
            samples.append(known_end == r.seq_len)
        host = build_batch(slices, self.runner.buckets, self.prefix_memo)
        host = host._replace(scores=_prompt_scores(reqs[:num_extend], num_new, host))
        mask = None
        if any(r.grammar is not None for r in reqs):
            rows = first_rows(rows_per_request(drafts, len(reqs)))
            mask = build_token_mask(reqs, samples, rows, host.shape.num_reqs,
                                    self.runner.cfg.vocab_size)
        opts = StepOptions(  # runtime flags of the shape's one program
            do_sample=any(not r.sampling.is_greedy for r in reqs),
            return_logprobs=any(r.sampling.logprobs for r in reqs),
            use_penalties=any(r.sampling.has_penalties for r in reqs),
            use_grammar=mask is not None,
            prompt_logprobs=host.scores is not None,
            use_logit_bias=any(r.sampling.logit_bias for r in reqs),
        )
        batch = ScheduledBatch(reqs, num_new, samples, is_prefill, host, opts, mask, drafts)
        self._after_dispatch_bookkeeping(batch)
        return batch

    def _after_dispatch_bookkeeping(self, batch: ScheduledBatch) -> None:
        for r, n, keep in zip(batch.reqs, batch.num_new, batch.samples, strict=True):
            r.num_computed += n
            if keep:
                r.num_pending += 1
            # (with a window pool every chunk, as SGLang does: a chunk's window KV then
            # stays cached, the tree's, instead of freed once behind the window)
            chunk_done = keep or self.kvm.window is not None
            if batch.is_prefill and n > 1 and chunk_done and self.cfg.enable_cache:
                # The prefill is complete: share it now (n > 1 samples, in-batch prefix
                # caching), not only when the request finishes. Steps run in dispatch
                # order, so a later step reading these slots sees them written.
                slots, r.last_node, r.num_cached = self.kvm.cache_unfinished(
                    r.all_ids[: r.num_computed], r.slots, r.last_node, r.num_cached,
                    r.namespace, r.window,
                )
                if not np.array_equal(slots[: r.num_computed], r.slots[: r.num_computed]):
                    r.row_synced = False  # the tree's slots replaced duplicates: re-upload
                    r.slots = slots


def _prompt_scores(extends: list[Req], num_new: list[int],
                   host: HostBatch) -> PromptScores | None:
    """Where this step scores prompt tokens: each extending request that asked, at the
    positions p of its chunk whose next prompt token p + 1 is in its scored span."""
    scores = None
    for i, r in enumerate(extends):
        start = r.sampling.logprob_start_len
        if start < 0:
            continue
        first = r.num_computed  # this chunk's first position (bookkeeping comes after)
        pos = np.arange(first, first + num_new[i])
        ok = (pos + 1 >= start) & (pos + 1 < len(r.prompt_ids))
        if not ok.any():
            continue
        if scores is None:
            scores = PromptScores.none(host.shape.num_tokens)
        at = host.md.q_start[i] + np.nonzero(ok)[0]
        scores.next_ids[at] = np.asarray(r.prompt_ids, np.int32)[pos[ok] + 1]
        scores.mask[at] = True
    return scores
