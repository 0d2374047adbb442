"""Runs one expression against a program state (on the state's worker thread): text is
appended, gen and select become native /generate requests to the state's backend."""

from __future__ import annotations

from typing import Any, Protocol

from radixjax.api.tool_formats import FORMATS
from radixjax.api.tool_parser import split_calls
from radixjax.lang.backend import Backend
from radixjax.lang.ir import LOGPROB_NAMES, Gen, RoleBegin, RoleEnd, Select, Seq


class State(Protocol):
    """What the interpreter reads and writes of a program's state (lang/state.py's
    ProgramState)."""

    defaults: dict[str, Any]  # the run's sampling defaults
    variables: dict[str, Any]
    meta: dict[str, Any]
    streaming: bool

    def append(self, text: str, var: str | None = None) -> None: ...

    @property
    def current_text(self) -> str: ...

    def begin_role(self, role: str) -> None: ...

    def end_role(self, role: str) -> None: ...


class Interpreter:
    def __init__(self, state: State, backend: Backend) -> None:
        self.state, self.backend = state, backend

    def execute(self, expr: Any) -> None:
        s = self.state
        if isinstance(expr, str):
            s.append(expr)
        elif isinstance(expr, Seq | list | tuple):
            for part in expr.parts if isinstance(expr, Seq) else expr:
                self.execute(part)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            s.begin_role(expr.role)
        elif isinstance(expr, RoleEnd):
            s.end_role(expr.role)
        else:
            raise TypeError(f"cannot add a {type(expr).__name__} to a program")

    def _store(self, name: str | None, value: Any, meta: dict) -> None:
        if name is not None:
            self.state.variables[name] = value
            self.state.meta[name] = meta

    def _gen(self, g: Gen) -> None:
        s = self.state
        sampling = {k: v for k, v in s.defaults.items() if k not in LOGPROB_NAMES}
        sampling.update({k: v for k, v in g.sampling.items() if v is not None})
        logprobs = {k: v for k, v in s.defaults.items() if k in LOGPROB_NAMES}
        logprobs.update(g.logprobs)
        body = {"text": s.current_text, "sampling_params": sampling,
                **{k: v for k, v in logprobs.items() if v is not None}}
        if s.streaming:
            shown, meta = "", {}
            for chunk in self.backend.stream(body):
                s.append(chunk["text"][len(shown):], var=g.name)
                shown, meta = chunk["text"], chunk["meta_info"]
        else:
            out = self.backend.generate(body)
            s.append(out["text"], var=g.name)
            shown, meta = out["text"], out["meta_info"]
        if g.tool_format is not None:  # the calls, as OpenAI's tool_calls
            calls = split_calls(FORMATS[g.tool_format], shown)[1]
            meta = {**meta, "tool_calls": [c.as_openai() for c in calls]}
        self._store(g.name, shown, meta)

    def _select(self, sel: Select) -> None:
        """Score each choice's tokens after the text (prompt logprobs, prefill only: the
        text is cached by the first request and shared by the rest), then append the
        choice the method picks."""
        s, prefix = self.state, self.state.current_text
        if not prefix:
            raise ValueError("select needs some text before it")
        cached = self.backend.generate({"text": prefix, "sampling_params": {
            "max_new_tokens": 0}})
        start = max(cached["meta_info"]["prompt_tokens"] - 1, 0)
        outs = self.backend.generate({
            "text": [prefix + c for c in sel.choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True,
            "logprob_start_len": start})
        entries = [_choice_entries(prefix, out["meta_info"]["input_token_logprobs"])
                   for out in outs]
        conditional = [[lp for lp, _, _ in e] for e in entries]
        unconditional = None
        if sel.method.needs_unconditional:
            priors = self.backend.generate({
                "input_ids": [[t for _, t, _ in e] for e in entries],
                "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                "logprob_start_len": 0})
            unconditional = [[lp for lp, _, _ in p["meta_info"]["input_token_logprobs"]]
                             for p in priors]
        decision = sel.method(conditional, unconditional)
        choice = sel.choices[decision.index]
        s.append(choice, var=sel.name)
        self._store(sel.name, choice, {
            "scores": decision.scores, "choice_token_logprobs": entries,
            "unconditional_token_logprobs": unconditional, **decision.meta_info})


def _choice_entries(prefix: str, entries: list[list]) -> list[list]:
    """The scored entries of `prefix + choice` from the prefix's last token on -> the
    choice's own. The first is the prefix's last token unless the choice's text merged
    into it when tokenized together (then it is the choice's first token)."""
    first_text = entries[0][2]
    if (first_text is not None and prefix.endswith(first_text)) or entries[0][0] is None:
        entries = entries[1:]
    if not entries:
        raise ValueError("a choice has no tokens of its own after the text")
    return entries
