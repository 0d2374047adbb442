"""Speculative decoding's host side (issue 43, docs/speculative.md): which decoding
requests draft in the next step and how many tokens, and what a verify step accepts.

    plan:    in a decode step with no penalized request, each eligible request (no
             grammar, its last token on the host) proposes drafts (engine/drafts.py: the
             radix tree, then its own n-grams); `plan` keeps the drafts that maximise the
             expected tokens per second of the step, from each request's acceptance
             estimate and what a step of each token bucket costs on this machine
             (StepCosts, timed after warm-up): more drafts where they are likely
             accepted and the larger step is cheap, none in a large batch
    verify:  the request runs as an extend of [x, d1..dk] that samples after each of its
             k + 1 tokens (t0..tk, with the keys plain decoding uses at those positions,
             sampling/sampler.py), so t_i is the token plain decoding would put after
             x, d1..di. Drafts are accepted while d_{i+1} == t_i; the first t_a after
             them is the bonus token: the output is plain decoding's, token for token,
             greedy or sampled (the drafts are deterministic proposals, so sampling the
             target and comparing is the rejection-sampling rule with a one-hot q).

Host side only: the step programs are the buckets that exist (a verify step's tokens are
one more extend), with a runtime `sample_at` row per sampled token.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixjax.cache.radix_cache import RadixCache
from radixjax.engine.config import EngineConfig
from radixjax.engine.drafts import NgramIndex, propose_draft
from radixjax.engine.request import Req

PRIOR_ACCEPT = 0.6  # a new request's assumed chance that a draft token is accepted
ACCEPT_EMA = 0.25  # weight of each observed draft token in the running estimate
RECOVER = 0.05  # per step without drafts, the estimate moves back toward the prior
# A verify step's cost beyond its bucket's, in decode steps of the smallest bucket: it
# is processed before the next step is scheduled (no overlap) and its tokens pass the
# output stage one by one (SmolLM2 one stream: ~1 ms of a ~9 ms step)
VERIFY_OVERHEAD = 0.12
MIN_GAIN = 1.05  # drafts only where the plan expects this many times plain decoding

# Seconds per step of each token bucket relative to the 1-token bucket, where they were
# not timed (a multi-host engine, no warm-up): SmolLM2 w8a16 + bf16 KV at context 512 on
# this project's 2-core CPU (benchmarks/verify_step.py: 1 stream T = 1..16, 8 streams
# T = 8..64; larger buckets extrapolated linearly)
DEFAULT_COSTS = {1: 1.0, 2: 1.1, 4: 1.55, 8: 2.0, 16: 3.4, 32: 4.5, 64: 8.3}


@dataclass(frozen=True)
class StepCosts:
    """Relative seconds per step of each token bucket (the smallest is 1.0)."""

    by_tokens: dict[int, float]
    # a draft model's decode step per token bucket, in the same units ({}: no model)
    draft: dict[int, float] = field(default_factory=dict)

    @staticmethod
    def relative(seconds: dict[int, float],
                 draft_seconds: dict[int, float] | None = None) -> StepCosts:
        """From seconds per bucket (and a draft model's), made non-decreasing (a larger
        step never costs less: timing noise must not make drafts look free), in units
        of the target's smallest step."""
        base = seconds[min(seconds)]

        def scaled(secs: dict[int, float]) -> dict[int, float]:
            out, floor = {}, 0.0
            for t in sorted(secs):
                floor = max(floor, secs[t] / base)
                out[t] = floor
            return out

        return StepCosts(scaled(seconds), scaled(draft_seconds) if draft_seconds else {})

    @staticmethod
    def default(buckets: Sequence[int]) -> StepCosts:
        known = sorted(DEFAULT_COSTS)
        per_token = DEFAULT_COSTS[known[-1]] / known[-1]
        return StepCosts({t: DEFAULT_COSTS.get(t, per_token * t) for t in buckets})

    def bucket(self, num_tokens: int) -> int | None:
        """The token bucket a step of num_tokens runs in (None: past the largest)."""
        return next((t for t in sorted(self.by_tokens) if t >= num_tokens), None)

    def of(self, num_tokens: int) -> float:
        return self.by_tokens[self.bucket(num_tokens)]

    def draft_of(self, num_reqs: int) -> float:
        """A draft model's decode step of num_reqs requests (0: no draft model)."""
        return self.draft[self.bucket(num_reqs)] if self.draft else 0.0


@dataclass
class DraftState:
    """One request's drafting: its n-grams, acceptance estimate and counters."""

    index: NgramIndex
    alpha: float = PRIOR_ACCEPT
    num_verify_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        """After a verify step: the accepted drafts were hits, the first rejected a miss."""
        self.num_verify_steps += 1
        self.num_drafted += num_drafts
        self.num_accepted += num_accepted
        outcomes = [1.0] * num_accepted + ([0.0] if num_accepted < num_drafts else [])
        for hit in outcomes:
            self.alpha += ACCEPT_EMA * (hit - self.alpha)

    def idle(self) -> None:
        """A step without drafts: the estimate drifts back toward the prior."""
        self.alpha += RECOVER * (PRIOR_ACCEPT - self.alpha)


def plan(alphas: Sequence[float], lengths: Sequence[int], costs: StepCosts,
         max_rows: int) -> list[int]:
    """How many of its proposed drafts (lengths[i]) each of a decode step's requests
    verifies: the allocation with the most expected tokens per cost. Drafts are added
    likeliest first (request i's (k + 1)-th is accepted with alpha_i^(k + 1), all of its
    first k accepted); after each, the step's expected tokens over its cost (its token
    bucket's, the verify overhead, and a draft model's decode step per token of the
    longest draft) is compared with the best so far; the best wins if it beats the plain
    step by MIN_GAIN. max_rows: the step's sampling rows (requests + drafts)."""
    b = len(alphas)
    round_cost = costs.draft_of(b)
    best, best_ks = b / costs.of(b) * MIN_GAIN, [0] * b
    ks, gain, used, longest = [0] * b, 0.0, b, 0
    heap = [(-a, i) for i, (a, n) in enumerate(zip(alphas, lengths, strict=True)) if n > 0]
    heapq.heapify(heap)
    while heap and used < max_rows and costs.bucket(used + 1) is not None:
        neg, i = heapq.heappop(heap)
        ks[i] += 1
        longest = max(longest, ks[i])
        gain -= neg
        used += 1
        if ks[i] < lengths[i]:
            heapq.heappush(heap, (neg * alphas[i], i))
        value = (b + gain) / (costs.of(used) + VERIFY_OVERHEAD + round_cost * longest)
        if value > best:
            best, best_ks = value, list(ks)
    return best_ks


def eligible(req: Req) -> bool:
    """Whether a request may draft at all: not under a grammar (its mask per draft
    position is not built) nor with penalties (the counts would miss the drafts)."""
    return req.grammar is None and not req.sampling.has_penalties


def state_of(req: Req, cfg: EngineConfig) -> DraftState:
    """req's DraftState (made on first use), its n-gram index caught up with the
    tokens on the host."""
    if req.draft is None:
        req.draft = DraftState(NgramIndex((), cfg.speculative_ngram_max_match_window_size,
                                          cfg.speculative_ngram_min_match_window_size))
    index = req.draft.index
    index.extend(req.ids(len(index.tokens), len(req.prompt_ids) + len(req.output_ids)))
    return req.draft


def proposal(req: Req, cfg: EngineConfig, max_k: int, tree: RadixCache | None) -> list[int]:
    """Up to max_k drafts after req's tokens (all on the host)."""
    return propose_draft(state_of(req, cfg).index, max_k, tree, req.namespace)[0]


def drafts_likely(req: Req, cfg: EngineConfig, tree: RadixCache | None, costs: StepCosts,
                  num_decoding: int, has_model: bool) -> bool:
    """Whether req would draft after the tokens on the host now (its proposal, or a
    draft model's full length, and the plan of a step of num_decoding requests like it):
    then its next token is worth waiting for. Counts as a step without drafts for its
    acceptance estimate."""
    state = state_of(req, cfg)
    state.idle()
    length = cfg.speculative_num_draft_tokens
    if not has_model:
        length = len(propose_draft(state.index, length, tree, req.namespace)[0])
    return length > 0 and any(plan([state.alpha] * num_decoding, [length] * num_decoding,
                                   costs, cfg.max_running))


def num_accepted(drafts: list[int], sampled: list[int]) -> int:
    """sampled: t0..tk, the target's token after x, d1..dk. Drafts accepted: the longest
    prefix with d_{i+1} == t_i."""
    a = 0
    while a < len(drafts) and drafts[a] == sampled[a]:
        a += 1
    return a
