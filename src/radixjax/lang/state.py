"""A program's state: its text, variables, chat messages, and the queue that runs its
expressions in order on a worker thread of its own.

`s += expr` queues expr and returns at once, so the program's Python keeps going; reading
(`s["name"]`, `s.text()`) waits for what was queued before it. Forked states each have
their own worker, so their generations run at the same time (and the engine batches them;
their shared prefix is computed once, through the radix cache).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixjax.lang.backend import Backend
from radixjax.lang.interpreter import Interpreter


class ProgramError(RuntimeError):
    """An expression of the program failed (the backend's message, or a bad value)."""


class ProgramState:
    def __init__(self, backend: Backend, defaults: dict[str, Any], text: str = "",
                 variables: dict | None = None, messages: list | None = None) -> None:
        self.backend = backend
        self.defaults = defaults  # the run's sampling defaults (SGLang's names)
        self._interp = Interpreter(self, backend)
        self._text = text
        self.variables: dict[str, Any] = dict(variables or {})
        self.meta: dict[str, Any] = {}
        self._messages: list[dict[str, str]] = list(messages or [])
        self._role: tuple[str, int] | None = None  # the open role and where its text began
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="radixjax-lang")
        self._pending: list[Future] = []
        self._error: BaseException | None = None
        # Streaming: (variable or None, text) deltas as they are appended.
        self._deltas: list[tuple[str | None, str]] = []
        self._changed = threading.Condition()
        self._done = False  # the program returned and everything it queued ran
        self.streaming = False  # gen streams its text (run(stream=True)); forks inherit

    # -- writing (on the worker) -----------------------------------------------------------

    def append(self, text: str, var: str | None = None) -> None:
        with self._changed:
            self._text += text
            self._deltas.append((var, text))
            self._changed.notify_all()

    @property
    def current_text(self) -> str:
        return self._text

    def begin_role(self, role: str) -> None:
        if self._role is not None:
            raise ProgramError(f"{role} begins inside an open {self._role[0]} turn")
        prefix, _ = self.backend.markers[role]
        self.append(prefix)
        self._role = (role, len(self._text))

    def end_role(self, role: str) -> None:
        if self._role is None or self._role[0] != role:
            raise ProgramError(f"{role} ends, but the open turn is {self._role}")
        start = self._role[1]
        self._messages.append({"role": role, "content": self._text[start:]})
        self._role = None
        self.append(self.backend.markers[role][1])

    # -- the queue -------------------------------------------------------------------------

    def __iadd__(self, expr: Any) -> ProgramState:
        self._pending.append(self._worker.submit(self._run, expr))
        return self

    def _run(self, expr: Any) -> None:
        if self._error is not None:
            return  # a failed program runs nothing more
        try:
            self._interp.execute(expr)
        except BaseException as e:  # noqa: BLE001 (kept, and raised by the next read)
            self._error = e
            with self._changed:
                self._changed.notify_all()

    def sync(self) -> None:
        """Wait for everything queued; raise ProgramError if something failed."""
        while self._pending:
            self._pending.pop(0).result()
        if self._error is not None:
            raise ProgramError(str(self._error)) from self._error

    def finish(self) -> None:
        """The program returned: run what it queued, then end the streams."""
        try:
            self.sync()
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()
            self._worker.shutdown(wait=False)

    def fail(self, error: BaseException) -> None:
        """Record a failure from outside the queue (the program's own Python raised)."""
        self._error = self._error or error

    def error(self) -> BaseException | None:
        return self._error

    # -- reading ---------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        self.sync()
        return self.variables[name]

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.variables

    def text(self) -> str:
        self.sync()
        return self._text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return list(self._messages)

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self.sync()
        return self.meta[name]

    def fork(self, n: int) -> ForkGroup:
        """n states that continue from this one's text and variables, each with its own
        worker (their requests run at once); join() brings their new variables back."""
        self.sync()
        children = [ProgramState(self.backend, self.defaults, self._text, self.variables,
                                 self._messages) for _ in range(n)]
        for child in children:
            child.streaming = self.streaming
        return ForkGroup(self, children)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text as it is appended (only `var_name`'s generation if given), until the
        program is done (run(..., stream=True))."""
        seen = 0
        while True:
            with self._changed:
                while seen == len(self._deltas) and not self._done and self._error is None:
                    self._changed.wait()
                new, seen = self._deltas[seen:], len(self._deltas)
                finished = self._done or self._error is not None
            for var, text in new:
                if var_name is None or var == var_name:
                    yield text
            if finished and seen == len(self._deltas):
                if self._error is not None:
                    raise ProgramError(str(self._error)) from self._error
                return

    async def text_async_iter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """text_iter for an event loop (each wait runs in a worker thread)."""
        it = self.text_iter(var_name)
        end = object()
        while (text := await asyncio.to_thread(next, it, end)) is not end:
            yield text

    def __repr__(self) -> str:
        return f"ProgramState({self._text!r})"  # as far as it has run (no waiting)


class ForkGroup:
    def __init__(self, parent: ProgramState, states: list[ProgramState]) -> None:
        self.parent, self.states = parent, states

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, expr: Any) -> ForkGroup:
        for s in self.states:
            s += expr
        return self

    def join(self) -> None:
        """Wait for every branch; each variable a branch created comes back to the
        parent as a list, one value per branch (its meta info too)."""
        before = set(self.parent.variables)
        for s in self.states:
            s.finish()
        for s in self.states:
            for name in s.variables.keys() - before:
                self.parent.variables.setdefault(name, []).append(s.variables[name])
                self.parent.meta.setdefault(name, []).append(s.meta.get(name))
