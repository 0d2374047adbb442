"""The compiled step programs of a ModelRunner: one executable per step shape.

    warm(shapes):  trace each program on this thread and compile it on two worker threads
                   (XLA releases the GIL, so tracing the next program overlaps compiling
                   the last: warm-up takes about half as long on the 2-core CPU); JAX's
                   persistent compilation cache answers the compile on a restart
    get(shape, packing):  the executable; a shape that was not warmed is compiled now and
                   counted as a late compile (a bucket bug: every step shape should be warm)

Each program is lowered with its example arguments' static packing of the host inputs
(runtime/packed_inputs.py); a step whose packing differs is refused (a layout bug).

(Serializing the executables themselves would also skip tracing on a restart, but
jax 0.10's CPU executables do not survive deserialization in another process:
"Function wrapped_convert not found", measured 2026-12-03.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tqdm.auto import tqdm

from radixjax.model.attention import BatchShape
from radixjax.runtime.packed_inputs import Packing

log = logging.getLogger(__name__)

COMPILE_THREADS = 2  # the 2-core CPU: tracing on the caller, compiling on both cores


class StepPrograms:
    """jitted: the runner's jitted step (static argument `packing`); example_args(shape) ->
    (the arguments of a step of that shape, placed as real steps place them, and their
    packing)."""

    def __init__(self, jitted: Any,
                 example_args: Callable[[BatchShape], tuple[tuple, Packing]]) -> None:
        self._jitted = jitted
        self._example_args = example_args
        self._programs: dict[BatchShape, Any] = {}
        self._packings: dict[BatchShape, Packing] = {}
        self.is_warm = False
        self.num_late_compiles = 0

    def __len__(self) -> int:
        return len(self._programs)

    def _lower(self, shape: BatchShape) -> Any:
        args, packing = self._example_args(shape)
        self._packings[shape] = packing
        return self._jitted.lower(*args, packing=packing)  # traces, on this thread

    def warm(self, shapes: Iterable[BatchShape], progress: bool = True) -> None:
        shapes = [s for s in dict.fromkeys(shapes) if s not in self._programs]
        bar = tqdm(total=len(shapes), desc="compiling step programs", disable=not progress)
        pending: dict[BatchShape, Future] = {}
        with ThreadPoolExecutor(COMPILE_THREADS) as pool:
            for shape in shapes:
                pending[shape] = pool.submit(self._lower(shape).compile)
                pending[shape].add_done_callback(lambda _: bar.update(1))
            for shape, future in pending.items():
                self._programs[shape] = future.result()
        bar.close()
        self.is_warm = True

    def has(self, shape: BatchShape) -> bool:
        return shape in self._programs

    def get(self, shape: BatchShape, packing: Packing | None = None) -> Any:
        """The program of this shape; packing: the step's, which must be the program's."""
        program = self._programs.get(shape)
        if program is None:
            if self.is_warm:
                self.num_late_compiles += 1
                log.warning("compiling a step after warm-up: %s", shape)
            program = self._programs[shape] = self._lower(shape).compile()
        if packing is not None and packing != self._packings[shape]:
            raise ValueError(f"a step's inputs are not packed as its program's ({shape})")
        return program
