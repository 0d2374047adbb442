"""The scheduler's dispatch: on its loop when the step's program is compiled (returns at
once), on a worker thread otherwise (a compile must not stall an HTTP server sharing the
loop), and always on a thread for a runner that cannot say (multi-host's publishing one)."""

from __future__ import annotations

import asyncio
import threading

from radixjax.engine.supervision import dispatch
from radixjax.parallel.multihost import BroadcastRunner


class Runner:
    def __init__(self, compiled: set) -> None:
        self.compiled = compiled
        self.threads: list[int] = []

    def dispatches_at_once(self, shape: object) -> bool:
        return shape in self.compiled

    def step(self, host: object, sp: object, opts: object, mask: object) -> str:
        self.threads.append(threading.get_ident())
        return "out"


class Host:
    def __init__(self, shape: str) -> None:
        self.shape = shape


def _dispatch_threads(runner: object, shapes: list[str]) -> list[bool]:
    """For each shape: whether its step ran on the loop's thread."""
    async def run() -> list[bool]:
        loop_thread = threading.get_ident()
        for s in shapes:
            assert await dispatch(runner, Host(s), None, None, None) == "out"
        inner = getattr(runner, "_runner", runner)
        return [t == loop_thread for t in inner.threads]

    return asyncio.run(run())


def test_compiled_shapes_dispatch_on_the_loop_others_on_a_thread() -> None:
    runner = Runner({"T=1"})
    assert _dispatch_threads(runner, ["T=1", "T=8", "T=1"]) == [True, False, True]


def test_a_publishing_runner_always_dispatches_on_a_thread() -> None:
    class Channel:
        def publish(self, name: str, args: tuple) -> None:
            pass

    runner = BroadcastRunner(Runner({"T=1"}), Channel())
    assert _dispatch_threads(runner, ["T=1"]) == [False]
