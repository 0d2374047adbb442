"""Supervision: the scheduler's loop, and what happens around and after its steps.

    supervise:   wait for work -> run_once -> on any failure recover (fail the requests
                 held, fresh KV accounting and device state); if that fails too, the
                 engine stays unhealthy and holds nothing
    between_steps(fn):  fn runs on the loop between two step dispatches (a KV transfer
                 landing in the pool); its result or error comes back in a future
    dispatch:    a step on this loop when its program is compiled, else on a thread
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from radixjax.engine.request import Req, ReqState
from radixjax.engine.waiting_queue import WaitingQueue
from radixjax.runtime.batch import HostBatch
from radixjax.runtime.model_runner import ModelRunner, StepOptions, StepOutput
from radixjax.sampling.params import SamplingArrays

log = logging.getLogger(__name__)


class Supervision:
    """The Scheduler's supervision (engine/scheduler.py holds the state it reads)."""

    runner: ModelRunner
    drafter: Any  # engine/draft_model.DraftModel | None
    waiting: WaitingQueue
    running: list[Req]
    in_flight: Any  # result_processor.InFlight | None
    healthy: bool
    lost: str | None  # why the engine cannot serve any more (fail_for_good), or None
    num_failures: int
    last_error: str | None
    _fault_pending: bool
    _wakeup: asyncio.Event | None
    _between: list[tuple[Callable[[], Any], asyncio.Future]]

    _mark_finished: Callable[..., None]  # Scheduler._mark_finished

    _fresh_accounting: Callable[..., None]  # Scheduler._fresh_accounting

    check_integrity: Callable[..., None]  # Scheduler.check_integrity

    async def run_forever(self) -> None:
        """Steps while there is work. A step that raises fails the requests the engine
        holds and the engine starts over (recover); it never ends the loop silently."""
        self._wakeup = asyncio.Event()
        await supervise(self, self._wakeup)

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

    def fail_for_good(self, reason: str) -> None:
        """The engine cannot serve any more (a rank of its multi-host cluster is gone):
        every request it holds fails with `reason` now, new ones are refused, and no
        recovery brings it back."""
        self.lost = reason
        self.healthy = False
        self.last_error = reason
        self._fail_held()

    def _fail_held(self) -> None:
        """Every request held ends with finish_reason "error" (Req.error: last_error)."""
        held = list(self.in_flight.batch.reqs) if self.in_flight else []
        held += self.running + list(self.waiting)
        self.in_flight, self.running, self.waiting = None, [], WaitingQueue()
        for r in dict.fromkeys(held):
            if r.state is not ReqState.FINISHED:
                r.row, r.slots, r.last_node, r.num_pending = -1, r.slots[:0], None, 0
                r.error = self.last_error
                self._mark_finished(r, "error")

    def recover(self, error: BaseException) -> None:
        """Fail every request the engine holds (finish_reason "error", `Req.error` set),
        then start over: empty KV accounting and radix cache, fresh device state (the
        failed step may have consumed its donated buffers), checked. If that raises too,
        the engine stays unhealthy and refuses new requests."""
        log.error("a scheduler step failed; failing its requests and recovering",
                  exc_info=error)
        self.healthy = False
        self.num_failures += 1
        if self.lost is None:
            self.last_error = f"{type(error).__name__}: {error}"
        self._fail_held()
        self._fresh_accounting()
        if self.lost is None:  # (a lost cluster's devices are not touched again)
            self.runner.reset_state()
            if self.drafter is not None:
                self.drafter.runner.reset_state()
        self.check_integrity()
        self.healthy = self.lost is None

    def drop_all(self) -> None:
        """After a failed recovery: hold nothing (the engine stays unhealthy)."""
        self.in_flight, self.running, self.waiting = None, [], WaitingQueue()

    def inject_fault(self) -> None:
        """Test hook: the next step raises inside run_once, after its batch took KV."""
        self._fault_pending = True


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
