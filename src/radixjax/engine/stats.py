"""Engine counters (the server's /metrics reads a snapshot of these)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from radixjax.engine.request import Req


@dataclass
class EngineStats:
    num_requests: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_prompt_tokens: int = 0  # of finished requests
    num_cached_tokens: int = 0  # of those, supplied by the radix cache
    num_generated_tokens: int = 0
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_computed_tokens: int = 0  # tokens fed through the model
    num_retractions: int = 0
    num_jump_forward_tokens: int = 0  # outputs a grammar forced, appended without decoding
    # speculative decoding (engine/speculative.py): verify steps' requests with drafts,
    # their draft tokens, and the drafts accepted
    num_verify_reqs: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def on_step(self, is_prefill: bool, num_tokens: int) -> None:
        if is_prefill:
            self.num_prefill_steps += 1
        else:
            self.num_decode_steps += 1
        self.num_computed_tokens += num_tokens

    def on_finished(self, req: Req) -> None:
        self.num_finished += 1
        self.num_aborted += req.finish_reason == "abort"
        self.num_prompt_tokens += req.stats.prompt_tokens
        self.num_cached_tokens += req.stats.cached_tokens

    def on_verify(self, num_drafts: int, num_accepted: int) -> None:
        self.num_verify_reqs += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a request gets per verify step: its accepted drafts and the bonus."""
        n = self.num_verify_reqs
        return (self.num_accepted_tokens + n) / n if n else 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    def snapshot(self, **live: float) -> dict[str, float]:
        """Counters plus derived rates and the live gauges the caller passes
        (running, waiting, kv_usage)."""
        elapsed = max(self.now() - self.started, 1e-9)
        out = {k: v for k, v in asdict(self).items() if k != "started"}
        out.update(cache_hit_rate=self.cache_hit_rate,
                   mean_accepted_length=self.mean_accepted_length,
                   generated_tokens_per_s=self.num_generated_tokens / elapsed, **live)
        return out
