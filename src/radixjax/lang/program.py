"""`@function` programs and how they run: one state (run), many at once (run_batch), or
streaming (run(stream=True), then state.text_iter())."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm.auto import tqdm

from radixjax.lang.backend import Backend
from radixjax.lang.state import ProgramError, ProgramState

# The run's sampling defaults, in SGLang's names (each gen may override its own).
DEFAULTS = dict(max_new_tokens=128, stop=None, stop_token_ids=None, temperature=1.0,
                top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
                ignore_eos=False, return_logprob=None, logprob_start_len=None,
                top_logprobs_num=None, return_text_in_logprobs=None)


class DefaultBackend:
    """SGLang's set_default_backend: the backend a run uses when given none. The one
    process-wide setting of the language, as in SGLang (pass backend= to avoid it)."""

    backend: Backend | None = None


def set_default_backend(backend: Backend) -> None:
    DefaultBackend.backend = backend


def _backend(backend: Backend | None) -> Backend:
    backend = backend or DefaultBackend.backend
    if backend is None:
        raise ValueError("no backend: pass backend=... or call set_default_backend first")
    return backend


class Program:
    """A function `f(s, ...)` that writes to a program state `s`."""

    def __init__(self, func: Callable, bound: dict[str, Any] | None = None) -> None:
        params = list(inspect.signature(func).parameters)
        if not params or params[0] != "s":
            raise TypeError("a program's first argument must be named s")
        self.func, self.bound = func, dict(bound or {})
        self.__name__ = getattr(func, "__name__", "program")

    def bind(self, **kwargs: Any) -> Program:
        return Program(self.func, {**self.bound, **kwargs})

    def _split(self, kwargs: dict) -> tuple[dict, dict]:
        defaults = dict(DEFAULTS)
        args = dict(self.bound)
        for k, v in kwargs.items():
            (defaults if k in DEFAULTS else args)[k] = v
        return defaults, args

    def run(self, *args: Any, backend: Backend | None = None, stream: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run the program; returns its state (an error in it is raised when the state is
        read). stream=True returns at once: read state.text_iter() as it runs."""
        defaults, fargs = self._split(kwargs)
        state = ProgramState(_backend(backend), defaults)
        state.streaming = stream

        def body() -> None:
            try:
                self.func(state, *args, **fargs)
            except Exception as e:  # noqa: BLE001 (kept in the state, raised on reading)
                state.fail(e)
            try:
                state.finish()
            except ProgramError:
                pass

        if stream:
            threading.Thread(target=body, daemon=True).start()
        else:
            body()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *,
                  backend: Backend | None = None, num_threads: int | str = "auto",
                  progress_bar: bool = False, **sampling: Any) -> list[ProgramState]:
        """Run the program once per kwargs dict, concurrently (the engine batches their
        requests); states in input order."""
        backend = _backend(backend)
        workers = min(64, max(1, len(batch_kwargs))) if num_threads == "auto" else num_threads
        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(self.run, backend=backend, **sampling, **kw)
                       for kw in batch_kwargs]
            states = []
            for f in tqdm(futures, disable=not progress_bar, desc=self.__name__):
                states.append(f.result())
        return states

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)


def function(func: Callable | None = None) -> Program | Callable[[Callable], Program]:
    """Decorator: `@function def f(s, ...)` (or `@function()`)."""
    if func is None:
        return Program
    return Program(func)
