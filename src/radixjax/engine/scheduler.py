"""The scheduler: waiting queue -> (chunked) prefill -> decode -> finished, with the radix
cache, retraction, and the overlap loop that stays one batch ahead of the device.

    loop:  batch = schedule()          host: policy, prefill adder, KV allocation
           out   = dispatch(batch)     device: returns at once (JAX async dispatch)
           process(previous)           host: wait for batch N-1's tokens, stream, finish
           previous = (batch, out)

Decode inputs of batch N are read on the device from the token buffer batch N-1 wrote
(runtime/batch.py TokenSource), so nothing waits for the host in between.

This file holds the state (queues, KV accounting) and a request's life (added, aborted,
finished); the rest lives in rooms of its own:
    engine/batch_builder.py     schedule(): admission, chunked prefill, decode, retraction
    engine/result_processor.py  a step's tokens -> outputs, stop checks, jump-forward
    engine/supervision.py       the loop, recovery after a failed step, between-steps work
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from radixjax.cache.errors import OutOfKVSlots
from radixjax.cache.manager import KVCacheManager
from radixjax.cache.req_to_token import ReqToTokenPool
from radixjax.cache.window_kv import WindowKV
from radixjax.engine.batch_builder import BatchBuilding
from radixjax.engine.config import EngineConfig
from radixjax.engine.constrained import waits_for_host
from radixjax.engine.draft_model import DraftModel
from radixjax.engine.errors import EngineError, RequestError
from radixjax.engine.output import RequestOutput
from radixjax.engine.policy import SchedulePolicy
from radixjax.engine.request import Req, ReqState
from radixjax.engine.result_processor import InFlight, ResultProcessing
from radixjax.engine.speculative import StepCosts
from radixjax.engine.stats import EngineStats
from radixjax.engine.supervision import Supervision, dispatch
from radixjax.engine.waiting_queue import WaitingQueue
from radixjax.runtime.batch import PrefixMemo
from radixjax.runtime.model_runner import ModelRunner


class Scheduler(BatchBuilding, ResultProcessing, Supervision):
    """Owns every request's host state and the KV bookkeeping. Single-threaded: call it
    only from the loop that runs `run_forever` (or drive `run_once` by hand)."""

    def __init__(self, runner: ModelRunner, cfg: EngineConfig,
                 eos_token_ids: tuple[int, ...], tokenizer: Any = None,
                 window_pool: tuple[int, int] | None = None) -> None:
        """tokenizer: the output stage's (text and stop strings); None: token ids only.
        window_pool: (the model's widest window, the window layers' pool slots) where the
        runner keeps them a pool of their own (RunnerConfig.window_slots)."""
        self.runner = runner
        self.window_pool = window_pool
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.eos_token_ids = eos_token_ids
        self._fresh_accounting()
        self.waiting = WaitingQueue()
        self.running: list[Req] = []
        self.stats = EngineStats()
        self.in_flight: InFlight | None = None
        self._num_decode_steps = 0
        self._wakeup: asyncio.Event | None = None
        self._between: list[tuple[Callable[[], Any], asyncio.Future]] = []
        self.healthy = True  # False while recovering, and for good if recovery failed
        self.lost: str | None = None  # fail_for_good's reason
        self.num_failures = 0  # steps that raised
        self.last_error: str | None = None
        self._fault_pending = False  # test hook: the next step raises (inject_fault)
        # speculative decoding's cost of a step per token bucket (Engine times them)
        self.step_costs: StepCosts | None = (StepCosts.default(runner.buckets.tokens)
                                             if cfg.speculative_algorithm else None)
        self.drafter: DraftModel | None = None  # speculative "standalone": Engine sets it

    def _fresh_accounting(self) -> None:
        """Empty KV accounting: the pool's allocator and radix tree, the table rows."""
        cfg = self.cfg
        window = None
        if self.window_pool is not None:  # the sliding-window layers' own pool
            window = WindowKV(self.window_pool[0], cfg.num_slots, self.window_pool[1],
                              cfg.page_size)
        self.kvm = KVCacheManager(cfg.num_slots, cfg.page_size, window)
        self.rows = ReqToTokenPool(cfg.max_running, cfg.max_context + cfg.page_size)
        self.policy = SchedulePolicy(cfg.policy, self.kvm.tree if cfg.enable_cache else None,
                                     cfg.fcfs_threshold, cfg.in_batch_prefix_min)
        self.prefix_memo = PrefixMemo()

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
        if req.sampling.logit_bias:
            vocab = self.runner.cfg.vocab_size
            if any(t >= vocab for t, _ in req.sampling.logit_bias):
                raise RequestError(f"logit_bias names a token id past the vocabulary "
                                   f"({vocab})")
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
            self.kvm.cache_finished(tokens, req.slots, req.last_node, req.namespace,
                                    req.window)
        else:
            self.kvm.release(req.slots, req.last_node, req.num_cached, req.window)
        self.rows.free(req.row)
        req.row, req.slots, req.last_node, req.window = -1, req.slots[:0], None, None
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

    def land_prompt(self, req: Req, write: Callable[[np.ndarray], None]) -> None:
        """A disaggregated request's prompt KV, computed elsewhere (engine/handoff.py):
        slots for it, `write(slots)` fills them, the prompt cached in the radix tree as a
        finished request would leave it. Raises RequestError, OutOfKVSlots, or what
        write raised (then nothing is held)."""
        self.validate(req)
        n = len(req.prompt_ids)
        root = self.kvm.match_and_lock([], req.namespace)
        try:
            slots = self.kvm.alloc(self.kvm.round_up(n))
        except OutOfKVSlots:
            self.kvm.tree.dec_lock_ref(root.last_node)
            raise
        try:
            write(slots[:n])
        except BaseException:
            self.kvm.release(slots, root.last_node, 0)
            raise
        self.kvm.cache_finished(req.prompt_ids, slots, root.last_node, req.namespace)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight or self._between)

    # -- the loop ---------------------------------------------------------------------------

    async def run_once(self) -> None:
        self._run_between()
        if self.in_flight is not None and (self.decode_may_retract()
                                           or self.in_flight.batch.drafts is not None
                                           or waits_for_host(self.in_flight.batch.reqs)):
            # retraction, grammar masks and drafts need the tokens on the host; after a
            # verify step, what the requests accepted
            await self._drain()
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
        if self.drafter is not None:
            self.drafter.before(self.runner)
        out = await dispatch(self.runner, batch.host, batch.sampling(), batch.opts,
                             batch.token_mask)
        if self.drafter is not None:
            self.drafter.mirror(batch.host)  # the draft model's KV, at the same slots
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
        if self.kvm.window is not None:  # the pins are the running requests' claims
            pins = np.zeros_like(self.kvm.window.pins)
            for r in self.running:
                pages = self.kvm.window.page_ids(r.slots[r.window.start:r.window.pinned_end])
                pins[pages] += 1
            assert np.array_equal(pins, self.kvm.window.pins), "window pins != claims"
        self.rows.check_integrity()
        assert self.rows.num_free == self.cfg.max_running - len(self.running)
