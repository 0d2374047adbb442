"""Result processing: a finished step's tokens become outputs, and requests end.

    per request that kept a sample:  the token (grammar-checked, then the tokens the
        grammar forces next: jump-forward) -> output ids, logprobs -> the output stage
        (text, stop strings) -> finished? (stop string, EOS, grammar end, length)
        -> a StreamChunk to its consumer, or Scheduler.finish with the last one
    prompt logprobs a step scored go into each request's list by position
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from radixjax.cache.manager import KVCacheManager
from radixjax.engine.batch_builder import ScheduledBatch
from radixjax.engine.config import EngineConfig
from radixjax.engine.constrained import jump_forward
from radixjax.engine.draft_model import DraftModel
from radixjax.engine.request import Req, ReqState
from radixjax.engine.speculative import StepCosts, drafts_likely, eligible, num_accepted
from radixjax.engine.stats import EngineStats
from radixjax.runtime.model_runner import StepOptions, StepOutput

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    batch: ScheduledBatch
    out: StepOutput


def fetch_results(out: StepOutput, opts: StepOptions) -> tuple:
    """The step's results on the host (logprob arrays only when some request asked):
    ((tokens, logprobs, top_ids, top_logprobs), prompt logprobs or None)."""
    if opts.return_logprobs:
        sample = tuple(np.asarray(x) for x in out.sample)
    else:
        sample = (np.asarray(out.sample.tokens), None, None, None)
    prompt = tuple(np.asarray(x) for x in out.prompt) if opts.prompt_logprobs else None
    return sample, prompt


class ResultProcessing:
    """The Scheduler's result processing (engine/scheduler.py holds the state it reads)."""

    cfg: EngineConfig
    kvm: KVCacheManager
    stats: EngineStats
    eos_token_ids: tuple[int, ...]

    running: list[Req]
    step_costs: StepCosts | None
    drafter: DraftModel | None

    finish: Callable[..., None]  # Scheduler.finish

    _mark_finished: Callable[..., None]  # Scheduler._mark_finished

    async def _process(self, flight: InFlight) -> None:
        arrays = await asyncio.to_thread(fetch_results, flight.out, flight.batch.opts)
        self.process_results(flight, arrays)

    def process_results(self, flight: InFlight, arrays: tuple) -> None:
        """arrays: fetch_results of the flight's step (a DP rank's rows of it)."""
        (tokens, logprobs, top_ids, top_lps), prompt = arrays
        now = self.stats.now()
        if prompt is not None:
            _record_prompt_logprobs(flight.batch, prompt)
        batch = flight.batch
        drafts = batch.drafts or [[]] * len(batch.reqs)
        for r, keep, i, draft in zip(batch.reqs, batch.samples, batch.first_rows, drafts,
                                     strict=True):
            if not keep:
                continue
            r.num_pending -= 1
            if r.state is not ReqState.RUNNING:
                continue  # finished or aborted while this step was in flight
            if r.sampling.max_new_tokens == 0:  # prefill only: the prompt is now cached
                self.finish(r, "length")
                continue
            if draft:
                self._verified(r, draft, (tokens, logprobs, top_ids, top_lps), i, now)
                continue
            token = int(tokens[i])
            new = [token]
            if r.grammar is not None:
                if not r.grammar.accept(token):  # the mask allowed it: a bug if it happens
                    log.error("request %s: token %d breaks its grammar", r.rid, token)
                    self.finish(r, "abort")
                    continue
                new += self._jump_forward(r)
            r.output_ids.extend(new)
            _add_logprobs(r, (logprobs, top_ids, top_lps), i)
            if r.stats.first_token is None:
                r.stats.first_token = now
            self._emit(r, new, token)
            if self.cfg.speculative_algorithm and r.state is ReqState.RUNNING:
                r.wants_drafts = eligible(r) and drafts_likely(
                    r, self.cfg, self.kvm.tree if self.cfg.enable_cache else None,
                    self.step_costs, len(self.running), self.drafter is not None)

    def _verified(self, r: Req, draft: list[int], sample: tuple, first: int,
                  now: float) -> None:
        """A verify step's outcome for r (engine/speculative.py): its tokens t0..tk at
        rows first.., the drafts accepted while equal, then the bonus token; taken one by
        one, so that r ends where plain decoding would (EOS, a stop string, its length).
        The KV of the positions past what r keeps is freed at once."""
        tokens = [int(t) for t in sample[0][first:first + len(draft) + 1]]
        accepted = num_accepted(draft, tokens)
        r.draft.observe(len(draft), accepted)
        self.stats.on_verify(len(draft), accepted)
        known = len(r.prompt_ids) + len(r.output_ids)
        new, text, reason = [], "", None
        for j, token in enumerate(tokens[:accepted + 1]):
            new.append(token)
            r.output_ids.append(token)
            _add_logprobs(r, sample[1:], first + j)
            text += r.out.push([token])
            reason = self._finish_reason(r, token)
            if reason is not None:
                break
        r.num_computed = known + len(new) - 1  # the last new token is fed by the next step
        keep = max(self.kvm.round_up(r.num_computed), r.num_cached)
        if r.slots.size > keep:  # the rejected drafts' slots (and any unused page)
            self.kvm.give_back(r.slots[keep:])
            r.slots = r.slots[:keep]  # a fresh buffer: views handed out stay as they were
        if r.stats.first_token is None:
            r.stats.first_token = now
        self._send(r, new, text, reason)

    def _emit(self, r: Req, new: list[int], token: int) -> None:
        """r's new tokens (the last sampled: `token`) to its consumer; r ends if due."""
        text = r.out.push(new)  # may find a stop string
        self._send(r, new, text, self._finish_reason(r, token))

    def _send(self, r: Req, new: list[int], text: str, reason: str | None) -> None:
        """r's new tokens and their text to its consumer; r ends if `reason`."""
        r.stats.completion_tokens = len(r.output_ids)
        self.stats.num_generated_tokens += len(new)
        if reason is not None:
            self.finish(r, reason, new, text)
        elif r.on_chunk is not None:
            r.on_chunk(r.out.chunk(r, new, text))

    def _first_token_ends(self, req: Req) -> bool:
        """A disaggregated request arrives with its first token (the prefill server's) and
        its prompt in the radix tree: emit that token; whether the request ends with it."""
        new = list(req.output_ids)
        req.stats.first_token = self.stats.now()
        req.stats.completion_tokens = len(new)
        self.stats.num_generated_tokens += len(new)
        text = req.out.push(new)
        reason = self._finish_reason(req, new[-1])
        if reason is not None:
            self._mark_finished(req, reason, new, text)
            return True
        if req.on_chunk is not None:
            req.on_chunk(req.out.chunk(req, new, text))
        return False

    def _jump_forward(self, r: Req) -> list[int]:
        """After r's sampled token was accepted: the tokens its grammar forces next, with
        KV slots for them; the next step extends over them instead of decoding each."""
        sp = r.sampling
        if (not self.cfg.enable_jump_forward or r.grammar.is_terminated or sp.logprobs
                or sp.has_penalties):  # jumped tokens have no logprobs, no device counts
            return []
        limit = min(r.remaining_tokens - 1, self.cfg.max_context - r.seq_len - 2)
        tokens = jump_forward(r, limit)
        need = self.kvm.round_up(r.seq_len + 1 + len(tokens)) - r.slots.size
        if tokens and need > 0:
            if need > self.kvm.available_size():
                r.grammar.rollback(len(tokens))  # no room: decode them one by one
                return []
            r.append_slots(self.kvm.alloc(need))
        self.stats.num_jump_forward_tokens += len(tokens)
        return tokens

    def _finish_reason(self, r: Req, token: int) -> str | None:
        """Whether r ends after this step's `token` (the one place a step's outcome
        decides it; aborts, errors and a full pool end requests from outside a step)."""
        sp = r.sampling
        if r.out.stopped:  # a stop string in the text (output stage)
            return "stop"
        if r.grammar is not None and r.grammar.is_terminated:
            return "stop"
        if token in sp.stop_token_ids or (not sp.ignore_eos and token in self.eos_token_ids):
            return "stop"
        # Known tokens only: with overlap the next step may already be in flight for r
        # (seq_len counts it), and its token is still inside the context.
        known = len(r.prompt_ids) + len(r.output_ids)
        if len(r.output_ids) >= sp.max_new_tokens or known >= self.cfg.max_context:
            return "length"
        return None


def _add_logprobs(r: Req, arrays: tuple, row: int) -> None:
    """The logprob (and top alternatives) of r's token sampled at `row`, if r asked."""
    logprobs, top_ids, top_lps = arrays
    if not r.sampling.logprobs or logprobs is None:
        return
    r.logprobs.append(float(logprobs[row]))
    k = r.sampling.top_logprobs
    if k and top_ids is not None:
        r.top_logprobs.append([(int(t), float(lp)) for t, lp in
                               zip(top_ids[row][:k], top_lps[row][:k], strict=True)])


def _record_prompt_logprobs(batch: ScheduledBatch, prompt: tuple) -> None:
    """The prompt logprobs a finished step computed, into each request's list (by
    position, so a request recomputed after a retraction overwrites, not appends)."""
    lps, top_ids, top_lps = prompt
    scores = batch.host.scores
    for i, r in enumerate(batch.reqs):
        start = r.sampling.logprob_start_len
        if start < 0 or not r.prompt_logprobs:
            continue
        q0, n = batch.host.md.q_start[i], batch.host.md.q_len[i]
        first = batch.host.md.kv_len[i] - n
        k = r.sampling.top_logprobs
        for t in range(q0, q0 + n):
            if not scores.mask[t]:
                continue
            j = first + (t - q0) + 1 - start  # the scored position, in the request's list
            r.prompt_logprobs[j] = float(lps[t])
            if k:
                r.prompt_top_logprobs[j] = [(int(a), float(b)) for a, b in
                                            zip(top_ids[t][:k], top_lps[t][:k], strict=True)]
