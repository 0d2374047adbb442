"""DP attention's scheduler: one Scheduler per DP rank (its own waiting queue, KV pool
slots, radix tree and table rows, as SGLang's DP ranks), stepped in lockstep through one
device program over the whole mesh (parallel/dp_attention.py):

    each step:  every rank schedules its own batch (or none: idle)
                -> one merged step, a chunk per rank (runtime/dp_batch.py); idle ranks
                   run a chunk of padding, so every device joins the MLP's collectives
                -> each rank processes its own rows of the results

A new request goes to the rank whose radix tree holds the longest prefix of its prompt
(ties: the rank with the fewest requests), so cached prefixes are reused. Lockstep steps
do not overlap with the host (each waits for its tokens before the next is scheduled).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from radixjax.engine.config import EngineConfig
from radixjax.engine.request import Req, ReqState
from radixjax.engine.result_processor import InFlight, fetch_results
from radixjax.engine.scheduler import Scheduler
from radixjax.engine.stats import EngineStats
from radixjax.engine.supervision import dispatch, supervise
from radixjax.runtime.batch import Buckets
from radixjax.runtime.dp_batch import RankStep, merge_rank_steps, rank_rows
from radixjax.runtime.model_runner import ModelRunner
from radixjax.sampling.bitmask import bitmask_width

log = logging.getLogger(__name__)


class RankRunner:
    """What a rank's Scheduler sees of the runner: its own buckets and the model config.
    Device work goes through DPAttentionScheduler (one step for every rank)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.cfg = runner.cfg
        c = runner.config
        self.buckets = Buckets.default(c.max_batch_tokens, c.max_running)
        self.num_rows = c.max_running + 1

    def reset_state(self) -> None:
        """The shared device state is reset once, by DPAttentionScheduler.recover."""


class DPAttentionScheduler:
    """The Scheduler interface the Engine uses, over N rank Schedulers."""

    def __init__(self, num_ranks: int, runner: ModelRunner, cfg: EngineConfig,
                 eos_token_ids: tuple[int, ...], tokenizer: Any = None) -> None:
        self.runner = runner
        self.cfg = cfg
        self.rank_runner = RankRunner(runner)
        self.ranks = [Scheduler(self.rank_runner, cfg, eos_token_ids, tokenizer)  # type: ignore[arg-type]
                      for _ in range(num_ranks)]
        self.stats = EngineStats()
        for s in self.ranks:
            s.stats = self.stats  # one set of counters for the engine
        self._rank_of: dict[int, tuple[Scheduler, Req]] = {}  # id(req) -> its rank
        self._wakeup: asyncio.Event | None = None
        self._fault_pending = False

    # -- requests ---------------------------------------------------------------------------

    def validate(self, req: Req) -> None:
        self.ranks[0].validate(req)

    def add_request(self, req: Req) -> None:
        """To the rank caching the longest prefix of the prompt, else the least loaded."""
        def load(s: Scheduler) -> int:
            return len(s.waiting) + len(s.running)

        best = max(self.ranks, key=lambda s: (s.cached_prefix_len(req.prompt_ids), -load(s)))
        best.add_request(req)
        self._rank_of[id(req)] = (best, req)
        if self._wakeup is not None:
            self._wakeup.set()

    def abort(self, req: Req) -> None:
        rank, _ = self._rank_of.get(id(req), (None, None))
        if rank is not None:
            rank.abort(req)
        else:  # not added yet: remembered, as a single scheduler does
            req.is_aborted = True

    @property
    def waiting(self) -> list[Req]:
        return [r for s in self.ranks for r in s.waiting]

    @property
    def running(self) -> list[Req]:
        return [r for s in self.ranks for r in s.running]

    @property
    def has_work(self) -> bool:
        return any(s.has_work for s in self.ranks)

    @property
    def healthy(self) -> bool:
        return all(s.healthy for s in self.ranks)

    @property
    def num_failures(self) -> int:
        return self.ranks[0].num_failures  # every rank recovers together

    def inject_fault(self) -> None:
        self._fault_pending = True

    def between_steps(self, fn: Any) -> asyncio.Future:
        raise NotImplementedError("DP attention does not take KV transfers")

    # -- the loop ---------------------------------------------------------------------------

    async def run_forever(self) -> None:
        self._wakeup = asyncio.Event()
        await supervise(self, self._wakeup)

    def drop_all(self) -> None:
        for s in self.ranks:
            s.drop_all()

    async def run_once(self) -> None:
        """One lockstep step of every rank (a no-op when no rank can schedule)."""
        batches = [s.schedule() for s in self.ranks]
        if all(b is None for b in batches):
            await asyncio.sleep(0)  # e.g. finishing requests: let the loop run
            return
        if self._fault_pending:
            self._fault_pending = False
            raise RuntimeError("injected fault (test hook)")
        steps = [RankStep(None, [], [], None, None) if b is None else RankStep(
            b.host, [r.sampling for r in b.reqs], [r.seed for r in b.reqs], b.opts,
            b.token_mask) for b in batches]
        merged = merge_rank_steps(steps, self.rank_runner.buckets, self.rank_runner.num_rows,
                                  bitmask_width(self.runner.cfg.vocab_size))
        out = await dispatch(self.runner, merged.host, merged.sampling, merged.opts,
                             merged.token_mask)
        arrays = await asyncio.to_thread(fetch_results, out, merged.opts)
        for rank, (s, batch) in enumerate(zip(self.ranks, batches, strict=True)):
            if batch is not None:
                self.stats.on_step(batch.is_prefill, sum(batch.num_new))
                s.process_results(InFlight(batch, out), rank_rows(arrays, rank, merged))
        self._rank_of = {k: (s, r) for k, (s, r) in self._rank_of.items()
                         if r.state is not ReqState.FINISHED}

    def recover(self, error: BaseException) -> None:
        """Every rank fails its requests and starts over; the shared device state once."""
        for s in self.ranks:
            s.recover(error)
        self.runner.reset_state()
        self._rank_of.clear()

    # -- accounting -------------------------------------------------------------------------

    def check_integrity(self) -> None:
        for s in self.ranks:
            s.check_integrity()

    def kv_usage(self) -> tuple[int, int, int]:
        used, usable, held = zip(*(s.kv_usage() for s in self.ranks), strict=True)
        return sum(used), sum(usable), sum(held)

    def cached_prefix_len(self, ids: Any) -> int:
        return max(s.cached_prefix_len(ids) for s in self.ranks)

    def flush_cache(self) -> None:
        for s in self.ranks:
            s.flush_cache()
