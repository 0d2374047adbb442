"""Incremental detokenization and stop-string matching: the cost per step follows the new
tokens, not the output so far.

IncrementalDetokenizer keeps two offsets into the output ids (as vLLM and SGLang do):

    ids:   ... | prefix_offset .. read_offset | read_offset .. end |
                 already emitted, re-decoded     new tokens
                 for context only

Each push decodes only ids[prefix_offset:] and emits what it adds past the decoded
prefix; the context token keeps tokenizer effects that depend on the previous token
(SentencePiece's leading space) right. Text ending in a partial UTF-8 character (U+FFFD)
is held back until the next token completes it.

StopMatcher finds the first stop string in the text so far by scanning only the new text
and the tail it held back (a tail that may be the start of a stop string).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _pending(self) -> tuple[str, str]:
        """(the emitted context decoded alone, the context and the new ids decoded)."""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        return prefix, self._decode(self._ids[self._prefix_offset:])

    def push(self, token_ids: list[int]) -> str:
        """The text the new tokens complete (may be "": a partial character)."""
        self._ids.extend(token_ids)
        prefix, text = self._pending()
        if len(text) <= len(prefix) or text.endswith(REPLACEMENT):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(prefix):]

    def flush(self) -> str:
        """At the end: whatever is held back (a trailing partial character decodes as
        U+FFFD, as a full decode would)."""
        prefix, text = self._pending()
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix):]


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""  # the end of the text so far that may start a stop string

    def push(self, text: str) -> tuple[str, bool]:
        """New text -> (text safe to emit, stopped). When stopped, the emitted text ends
        just before the stop string. A stop string cannot start in text already emitted
        (such a tail is held), so only held + new text is scanned."""
        if not self._stops:
            return text, False
        pending = self._held + text
        cuts = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
        if cuts:
            self._held = ""
            return pending[:min(cuts)], True
        hold = _stop_prefix(pending, self._stops)
        self._held = pending[len(pending) - hold:]
        return pending[:len(pending) - hold], False

    def flush(self) -> str:
        """At the end (no stop string came): the held-back tail."""
        held, self._held = self._held, ""
        return held


def _stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that are a proper start of some stop string."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1)
                if text.endswith(s[:k])), default=0)
