"""A request's host-side record: tokens, sampling, KV ownership, progress, counters."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from radixjax.engine.output import OnChunk, ReqStats, RequestOutput
from radixjax.sampling.params import SamplingParams

_NO_SLOTS = np.zeros(0, np.int64)


class ReqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    """Mutated only by the scheduler. Positions 0..num_computed-1 have KV in `slots`
    (dispatched steps count: the device runs them in order); `num_pending` sampled tokens
    are still on the device (0 or 1, the overlap scheduler's in-flight token)."""

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    namespace: Hashable | None = None
    on_chunk: OnChunk | None = None  # gets each StreamChunk, on the scheduler's loop
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # Prompt logprobs (sampling.logprob_start_len >= 0): one entry per prompt position
    # from logprob_start_len on, filled as the prefill's steps score them (None: position
    # 0, which nothing predicts)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]] | None] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    # KV ownership (valid while RUNNING)
    row: int = -1  # req_to_token row, also the device token-buffer row
    # `slots` (below): a view of the first _num_slots entries of _slot_buf
    _slot_buf: np.ndarray = field(default_factory=lambda: _NO_SLOTS, init=False, repr=False)
    _num_slots: int = field(default=0, init=False, repr=False)
    num_cached: int = 0  # leading slots owned by the tree (locked via last_node)
    last_node: Any = None
    num_computed: int = 0
    num_pending: int = 0
    is_aborted: bool = False
    needs_count_reset: bool = False  # set at admission: the penalty counts start over
    row_synced: bool = False  # the device req_to_token row holds this request's slots
    window: Any = None  # cache/window_kv.WindowClaim, with a window pool (while RUNNING)
    grammar: Any = None  # grammar/xgr.Matcher of a constrained request (engine/constrained.py)
    draft: Any = None  # engine/speculative.DraftState once the request has drafted
    wants_drafts: bool = False  # drafts likely next step: process its in-flight token first
    out: RequestOutput | None = None  # set when the scheduler takes the request
    # A prefill server's disaggregated request: called once as it finishes, with the
    # prompt's slots (None if its KV is not there), before they go back to the tree
    on_finish_kv: Callable[[Req, str, np.ndarray | None], None] | None = None
    stats: ReqStats = field(default_factory=ReqStats)

    @property
    def slots(self) -> np.ndarray:
        """[n] int64: the KV slot of each position 0..n-1 (a view, grown in place)."""
        return self._slot_buf[: self._num_slots]

    @slots.setter
    def slots(self, value: np.ndarray) -> None:
        """Replace them all (admission, the tree's slots for duplicates, release): a
        fresh buffer, so a view kept elsewhere (the tree, a step's upload) never changes."""
        self._slot_buf = np.array(value, np.int64)
        self._num_slots = len(self._slot_buf)

    def append_slots(self, new: np.ndarray) -> None:
        """Slots for the next positions, O(len(new)) amortized: written past the views
        handed out; a full buffer is copied into one twice as large (old views stay)."""
        n, k = self._num_slots, len(new)
        if n + k > len(self._slot_buf):
            buf = np.empty(max(2 * len(self._slot_buf), n + k, 64), np.int64)
            buf[:n] = self._slot_buf[:n]
            self._slot_buf = buf
        self._slot_buf[n : n + k] = new
        self._num_slots = n + k

    @property
    def all_ids(self) -> list[int]:
        """Every known token (a new list: O(context); a step reads `ids(start, end)`)."""
        return self.prompt_ids + self.output_ids

    def ids(self, start: int, end: int) -> list[int]:
        """Known tokens start..end-1, O(end - start)."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def seq_len(self) -> int:
        """Tokens known to the host plus the in-flight one."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def num_generated(self) -> int:
        return len(self.output_ids) + self.num_pending

    @property
    def is_prefilling(self) -> bool:
        """More than one token to compute. The last known token is always fed by the
        step that samples the next one, so a decoding request has exactly one."""
        return self.seq_len - self.num_computed > 1

    @property
    def remaining_tokens(self) -> int:
        return self.sampling.max_new_tokens - self.num_generated
