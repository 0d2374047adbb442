"""The scheduler: waiting queue -> (chunked) prefill -> decode -> finished, with the radix
cache, retraction, and the overlap loop that stays one batch ahead of the device.

    loop:  batch = schedule()          host: policy, prefill adder, KV allocation
           out   = dispatch(batch)     device: returns at once (JAX async dispatch)
           process(previous)           host: wait for batch N-1's tokens, stream, finish
           previous = (batch, out)

Decode inputs of batch N are read on the device from the token buffer batch N-1 wrote
(runtime/batch.py TokenSource), so nothing waits for the host in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from radixjax.cache.errors import OutOfKVSlots
from radixjax.cache.manager import KVCacheManager
from radixjax.cache.req_to_token import ReqToTokenPool
from radixjax.engine.config import EngineConfig
from radixjax.engine.constrained import build_token_mask, jump_forward, waits_for_host
from radixjax.engine.output import RequestOutput
from radixjax.engine.policy import SchedulePolicy, match_tokens
from radixjax.engine.request import Req, ReqState
from radixjax.engine.stats import EngineStats
from radixjax.runtime.batch import HostBatch, PromptScores, RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, StepOptions, StepOutput
from radixjax.sampling.params import SamplingArrays

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the engine cannot serve (empty prompt, longer than the context, ...)."""


class EngineError(RuntimeError):
    """The engine failed while serving this request (a step raised). The engine itself
    recovered (see Scheduler.recover) unless `Engine.healthy` says otherwise."""


@dataclass
class ScheduledBatch:
    reqs: list[Req]
    num_new: list[int]  # tokens each request computes in this step
    samples: list[bool]  # whether the request's sampled token is kept
    is_prefill: bool
    host: HostBatch
    opts: StepOptions
    token_mask: np.ndarray | None  # grammar bitmask [B, ceil(V / 32)] int32, if any


@dataclass
class InFlight:
    batch: ScheduledBatch
    out: StepOutput


class Scheduler:
    """Owns every request's host state and the KV bookkeeping. Single-threaded: call it
    only from the loop that runs `run_forever` (or drive `run_once` by hand)."""

    def __init__(self, runner: ModelRunner, cfg: EngineConfig,
                 eos_token_ids: tuple[int, ...], tokenizer: Any = None) -> None:
        """tokenizer: the output stage's (text and stop strings); None: token ids only."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.eos_token_ids = eos_token_ids
        self._fresh_accounting()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.stats = EngineStats()
        self.in_flight: InFlight | None = None
        self._num_decode_steps = 0
        self._wakeup: asyncio.Event | None = None
        self._between: list[tuple[Callable[[], Any], asyncio.Future]] = []
        self.healthy = True  # False while recovering, and for good if recovery failed
        self.num_failures = 0  # steps that raised
        self.last_error: str | None = None
        self._fault_pending = False  # test hook: the next step raises (inject_fault)

    def _fresh_accounting(self) -> None:
        """Empty KV accounting: the pool's allocator and radix tree, the table rows."""
        cfg = self.cfg
        self.kvm = KVCacheManager(cfg.num_slots, cfg.page_size)
        self.rows = ReqToTokenPool(cfg.max_running, cfg.max_context + cfg.page_size)
        self.policy = SchedulePolicy(cfg.policy, self.kvm.tree if cfg.enable_cache else None,
                                     cfg.fcfs_threshold, cfg.in_batch_prefix_min)

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, req: Req) -> None:
        if not self.healthy:
            raise EngineError(f"the engine is unhealthy: {self.last_error}")
        self.validate(req)
        room = self.cfg.max_context - len(req.prompt_ids)
        if req.sampling.max_new_tokens > room:  # as SGLang and vLLM: up to the context
            req.sampling = replace(req.sampling, max_new_tokens=room)
        self.stats.num_requests += 1
        req.out = RequestOutput(self.tokenizer, req.sampling.stop,
                                req.sampling.skip_special_tokens)
        if req.sampling.scores_prompt:
            num_scored = len(req.prompt_ids) - req.sampling.logprob_start_len
            req.prompt_logprobs = [None] * num_scored  # filled by the prefill's steps
            req.prompt_top_logprobs = [None] * num_scored
        if req.is_aborted:  # aborted before it got here: remembered, never run
            self._mark_finished(req, "abort")
            return
        if req.output_ids and req.stats.first_token is None and self._first_token_ends(req):
            return
        self.waiting.append(req)
        if self._wakeup is not None:
            self._wakeup.set()

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

    def validate(self, req: Req) -> None:
        """Raise RequestError for a request this engine can never serve."""
        n = len(req.prompt_ids)
        if n == 0:
            raise RequestError("the prompt is empty")
        if n >= self.cfg.max_context:
            raise RequestError(
                f"the prompt has {n} tokens; this engine's context is {self.cfg.max_context}"
            )
        if self.kvm.round_up(n + 1) > self.kvm.allocator.num_usable_slots:
            raise RequestError(f"the prompt ({n} tokens) does not fit the KV pool")
        if req.sampling.logprob_start_len >= n:
            raise RequestError(f"logprob_start_len ({req.sampling.logprob_start_len}) must be "
                               f"less than the prompt's {n} tokens")

    def abort(self, req: Req) -> None:
        req.is_aborted = True
        if req.state is ReqState.WAITING and req in self.waiting:
            self.waiting.remove(req)
            self._mark_finished(req, "abort")
        elif req.state is ReqState.RUNNING:
            self.finish(req, "abort")

    def finish(self, req: Req, reason: str, new: list[int] = (), text: str = "") -> None:
        """End a running request now; its KV is cached (or freed when the cache is off).
        new / text: the last step's ids and text, for the last chunk."""
        if req.state is not ReqState.RUNNING:
            return
        self.running.remove(req)
        self._export_kv(req, reason)
        if self.cfg.enable_cache:
            tokens = req.all_ids[: req.num_computed]
            self.kvm.cache_finished(tokens, req.slots, req.last_node, req.namespace)
        else:
            self.kvm.release(req.slots, req.last_node, req.num_cached)
        self.rows.free(req.row)
        req.row, req.slots, req.last_node = -1, req.slots[:0], None
        self._mark_finished(req, reason, new, text)

    def _mark_finished(self, req: Req, reason: str, new: list[int] = (),
                       text: str = "") -> None:
        """The one exit of every request: its reason set, its last chunk emitted."""
        self._export_kv(req, reason)  # not done in finish(): there is no KV to export
        req.state = ReqState.FINISHED
        req.finish_reason = reason
        req.stats.finished = self.stats.now()
        self.stats.on_finished(req)
        if req.on_chunk is not None:
            req.on_chunk(req.out.last_chunk(req, list(new), text))

    @staticmethod
    def _export_kv(req: Req, reason: str) -> None:
        """A prefill server's request ends: its hook gets the prompt's slots while the
        request still owns them (nothing is dispatched before the hook returns)."""
        hook, req.on_finish_kv = req.on_finish_kv, None
        if hook is not None:
            n = len(req.prompt_ids)
            owned = req.state is ReqState.RUNNING and req.num_computed >= n
            hook(req, reason, req.slots[:n] if owned and req.slots.size >= n else None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight or self._between)

    def between_steps(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run fn on the loop between two step dispatches (nothing else then touches the
        device state: e.g. KV written into the pool by a transfer); its result or error
        comes back in the future. Call on the scheduler's loop."""
        future = asyncio.get_running_loop().create_future()
        self._between.append((fn, future))
        if self._wakeup is not None:
            self._wakeup.set()
        return future

    def _run_between(self) -> None:
        while self._between:
            fn, future = self._between.pop(0)
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - the caller's error, not the engine's
                if not future.cancelled():
                    future.set_exception(e)
            else:
                if not future.cancelled():  # its caller left: the work stands (no leak)
                    future.set_result(result)

    # -- the loop ---------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Steps while there is work. A step that raises fails the requests the engine
        holds and the engine starts over (recover); it never ends the loop silently."""
        self._wakeup = asyncio.Event()
        await supervise(self, self._wakeup)

    def drop_all(self) -> None:
        """After a failed recovery: hold nothing (the engine stays unhealthy)."""
        self.in_flight, self.running, self.waiting = None, [], []

    def recover(self, error: BaseException) -> None:
        """Fail every request the engine holds (finish_reason "error", `Req.error` set),
        then start over: empty KV accounting and radix cache, fresh device state (the
        failed step may have consumed its donated buffers), checked. If that raises too,
        the engine stays unhealthy and refuses new requests."""
        log.error("a scheduler step failed; failing its requests and recovering",
                  exc_info=error)
        self.healthy = False
        self.num_failures += 1
        self.last_error = f"{type(error).__name__}: {error}"
        held = list(self.in_flight.batch.reqs) if self.in_flight else []
        held += self.running + self.waiting
        self.in_flight, self.running, self.waiting = None, [], []
        for r in dict.fromkeys(held):
            if r.state is not ReqState.FINISHED:
                r.row, r.slots, r.last_node, r.num_pending = -1, r.slots[:0], None, 0
                r.error = self.last_error
                self._mark_finished(r, "error")
        self._fresh_accounting()
        self.runner.reset_state()
        self.check_integrity()
        self.healthy = True

    def inject_fault(self) -> None:
        """Test hook: the next step raises inside run_once, after its batch took KV."""
        self._fault_pending = True

    async def run_once(self) -> None:
        self._run_between()
        if self.in_flight is not None and (self._decode_may_retract()
                                           or waits_for_host(self.in_flight.batch.reqs)):
            await self._drain()  # retraction, and grammar masks, need the tokens on the host
        batch = self.schedule()
        if batch is None:
            await self._drain()
            return
        overlap = self.cfg.enable_overlap and not (
            batch.is_prefill and self.in_flight is not None and self.in_flight.batch.is_prefill
        )
        if not overlap:
            await self._drain()
        if self._fault_pending:
            self._fault_pending = False
            raise RuntimeError("injected fault (test hook)")
        out = await dispatch(self.runner, batch.host, _sampling(batch), batch.opts,
                             batch.token_mask)
        self.stats.on_step(batch.is_prefill, sum(batch.num_new))
        previous, self.in_flight = self.in_flight, InFlight(batch, out)
        if previous is not None:
            await self._process(previous)
        if not self.cfg.enable_overlap:
            await self._drain()

    async def _drain(self) -> None:
        if self.in_flight is not None:
            previous, self.in_flight = self.in_flight, None
            await self._process(previous)

    def _decode_may_retract(self) -> bool:
        """Whether the next decode step could retract (short of KV, or the test hook)."""
        every = self.cfg.retract_every
        if every and (self._num_decode_steps + 1) % every == 0:
            return True
        return self._decode_shortfall([r for r in self.running if self._can_decode(r)]) > 0

    def _decode_shortfall(self, decodes: list[Req]) -> int:
        need = sum(self.kvm.page_size for r in decodes if r.num_computed >= r.slots.size)
        return need - self.kvm.available_size()

    # -- scheduling -------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        prefill = self._schedule_prefill()
        if prefill is not None:
            return prefill
        return self._schedule_decode()

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
        return self._build(reqs, num_new, is_prefill=True, num_extend=num_extend)

    def _admit(self, reqs: list[Req], num_new: list[int], budget: int) -> None:
        ordered = self.policy.order(self.waiting, [r for r in reqs if r.is_prefilling])
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
            r.row = self.rows.alloc()
            r.slots = np.concatenate([match.slots, new_slots])
            r.num_cached = r.num_computed = cached
            r.last_node = match.last_node
            r.state = ReqState.RUNNING
            r.needs_count_reset = True
            r.row_synced = False
            if r.stats.admitted is None:
                r.stats.admitted = self.stats.now()
                r.stats.prompt_tokens = len(r.prompt_ids)
                r.stats.cached_tokens = min(cached, len(r.prompt_ids))
            self.waiting.remove(r)
            self.running.append(r)
            n = min(r.seq_len - cached, self.cfg.chunk_size, budget)
            reqs.append(r)
            num_new.append(n)
            budget -= n
            if n < r.seq_len - cached:
                break  # one chunked request per step

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
        return self._build(decodes, [1] * len(decodes), is_prefill=False)

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
                r.slots = np.concatenate([r.slots, self.kvm.alloc(self.kvm.page_size)])
        return decodes

    def _retract(self, r: Req) -> None:
        """Free a running request's KV at once (not cached) and requeue it first."""
        assert r.num_pending == 0, "drain the in-flight step before retracting"
        self.running.remove(r)
        self.kvm.release(r.slots, r.last_node, r.num_cached)
        self.rows.free(r.row)
        r.row, r.slots, r.last_node = -1, r.slots[:0], None
        r.num_cached = r.num_computed = 0
        r.state = ReqState.WAITING
        r.stats.num_retractions += 1
        self.stats.num_retractions += 1
        self.waiting.insert(0, r)

    def _build(self, reqs: list[Req], num_new: list[int], is_prefill: bool,
               num_extend: int = 0) -> ScheduledBatch:
        """num_extend: the leading requests that extend (prefill); the rest decode."""
        slices, samples = [], []
        for i, (r, n) in enumerate(zip(reqs, num_new, strict=True)):
            start, end = r.num_computed, r.num_computed + n
            from_device = r.num_pending > 0 and end == r.seq_len
            known = r.all_ids
            tokens = np.array(known[start:end] if not from_device
                              else known[start:end - 1] + [0], np.int32)
            self.rows.write(r.row, start, r.slots[start:end])
            # Penalty counts: outputs fed by an extend are (re)counted; a decode's input
            # was counted when it was sampled.
            count_from = len(r.prompt_ids) if i < num_extend else 1 << 30
            slices.append(RequestSlice(
                tokens, r.slots[:end].astype(np.int32), r.row,
                first_from_device=from_device and n == 1, reset_counts=r.needs_count_reset,
                count_from=count_from, count_sampled=end == r.seq_len,
                sync_row=not r.row_synced))
            r.needs_count_reset = False
            r.row_synced = True
            samples.append(end == r.seq_len)
        host = build_batch(slices, self.runner.buckets)
        host = host._replace(scores=_prompt_scores(reqs[:num_extend], num_new, host))
        mask = None
        if any(r.grammar is not None for r in reqs):
            mask = build_token_mask(reqs, samples, host.shape.num_reqs,
                                    self.runner.cfg.vocab_size)
        opts = StepOptions(  # runtime flags of the shape's one program
            do_sample=any(not r.sampling.is_greedy for r in reqs),
            return_logprobs=any(r.sampling.logprobs for r in reqs),
            use_penalties=any(r.sampling.has_penalties for r in reqs),
            use_grammar=mask is not None,
            prompt_logprobs=host.scores is not None,
        )
        batch = ScheduledBatch(reqs, num_new, samples, is_prefill, host, opts, mask)
        self._after_dispatch_bookkeeping(batch)
        return batch

    def _after_dispatch_bookkeeping(self, batch: ScheduledBatch) -> None:
        for r, n, keep in zip(batch.reqs, batch.num_new, batch.samples, strict=True):
            r.num_computed += n
            if keep:
                r.num_pending += 1
            if batch.is_prefill and n > 1 and keep and self.cfg.enable_cache:
                # The prefill is complete: share it now (n > 1 samples, in-batch prefix
                # caching), not only when the request finishes. Steps run in dispatch
                # order, so a later step reading these slots sees them written.
                slots, r.last_node, r.num_cached = self.kvm.cache_unfinished(
                    r.all_ids[: r.num_computed], r.slots, r.last_node, r.num_cached,
                    r.namespace,
                )
                if not np.array_equal(slots[: r.num_computed], r.slots[: r.num_computed]):
                    r.row_synced = False  # the tree's slots replaced duplicates: re-upload
                r.slots = slots

    # -- results ----------------------------------------------------------------------------

    async def _process(self, flight: InFlight) -> None:
        arrays = await asyncio.to_thread(_fetch, flight.out, flight.batch.opts)
        self._process_host(flight, arrays)

    def _process_host(self, flight: InFlight, arrays: tuple) -> None:
        (tokens, logprobs, top_ids, top_lps), prompt = arrays
        now = self.stats.now()
        if prompt is not None:
            _record_prompt_logprobs(flight.batch, prompt)
        for i, (r, keep) in enumerate(zip(flight.batch.reqs, flight.batch.samples,
                                          strict=True)):
            if not keep:
                continue
            r.num_pending -= 1
            if r.state is not ReqState.RUNNING:
                continue  # finished or aborted while this step was in flight
            if r.sampling.max_new_tokens == 0:  # prefill only: the prompt is now cached
                self.finish(r, "length")
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
            if r.sampling.logprobs and logprobs is not None:
                r.logprobs.append(float(logprobs[i]))
                k = r.sampling.top_logprobs
                if k and top_ids is not None:
                    r.top_logprobs.append(
                        [(int(t), float(lp)) for t, lp in zip(top_ids[i][:k], top_lps[i][:k],
                                                              strict=True)])
            if r.stats.first_token is None:
                r.stats.first_token = now
            r.stats.completion_tokens = len(r.output_ids)
            self.stats.num_generated_tokens += len(new)
            text = r.out.push(new)  # may find a stop string
            reason = self._finish_reason(r, token)
            if reason is not None:
                self.finish(r, reason, new, text)
            elif r.on_chunk is not None:
                r.on_chunk(r.out.chunk(r, new, text))

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
            r.slots = np.concatenate([r.slots, self.kvm.alloc(need)])
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

    # -- accounting -------------------------------------------------------------------------

    def kv_usage(self) -> tuple[int, int, int]:
        """(slots not free and not evictable, usable slots, slots held by requests)."""
        usable = self.kvm.allocator.num_usable_slots
        used = usable - self.kvm.allocator.num_free_slots - self.kvm.tree.evictable_size()
        return used, usable, self.kvm.num_held

    def cached_prefix_len(self, ids: Any) -> int:
        return self.kvm.tree.match_len(ids)

    def flush_cache(self) -> None:
        self.kvm.tree.reset()

    def check_integrity(self) -> None:
        self.kvm.check_integrity()
        self.rows.check_integrity()
        assert self.rows.num_free == self.cfg.max_running - len(self.running)


async def supervise(scheduler: Any, wakeup: asyncio.Event) -> None:
    """The loop of a scheduler (Scheduler, DPAttentionScheduler): wait for work, step,
    and on any failure of a step recover (or, if that fails too, drop everything)."""
    while True:
        if not scheduler.has_work:
            wakeup.clear()
            await wakeup.wait()
        try:
            await scheduler.run_once()
        except Exception as e:  # noqa: BLE001 (supervision: any failure of a step)
            try:
                scheduler.recover(e)
            except Exception:  # noqa: BLE001
                log.exception("recovery failed: the engine stays unhealthy")
                scheduler.drop_all()


async def dispatch(runner: Any, host: HostBatch, sp: SamplingArrays, opts: StepOptions,
                   token_mask: np.ndarray | None) -> StepOutput:
    """runner.step, on this loop when its program is compiled (it returns at once; a
    worker thread's hand-offs cost ~0.1-0.3 ms a step of the 2-core CPU), else on a worker
    thread: a shape compiling (seconds) must not stall the HTTP server sharing this loop."""
    at_once = getattr(runner, "dispatches_at_once", None)
    if at_once is not None and at_once(host.shape):
        return runner.step(host, sp, opts, token_mask)
    return await asyncio.to_thread(runner.step, host, sp, opts, token_mask)


def _fetch(out: StepOutput, opts: StepOptions) -> tuple:
    """The step's results on the host (logprob arrays only when some request asked):
    ((tokens, logprobs, top_ids, top_logprobs), prompt logprobs or None)."""
    if opts.return_logprobs:
        sample = tuple(np.asarray(x) for x in out.sample)
    else:
        sample = (np.asarray(out.sample.tokens), None, None, None)
    prompt = tuple(np.asarray(x) for x in out.prompt) if opts.prompt_logprobs else None
    return sample, prompt


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


def _sampling(batch: ScheduledBatch) -> SamplingArrays:
    return SamplingArrays.build([r.sampling for r in batch.reqs],
                                [r.seed for r in batch.reqs], batch.host.shape.num_reqs)
