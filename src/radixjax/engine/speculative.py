"""Speculative decoding's host side (issue 43, docs/speculative.md): which decoding
requests draft in the next step and how many tokens, and what a verify step accepts.

    plan:    a decode step of at most cfg.speculative_max_batch requests, none with
             penalties: each eligible request (no grammar, its last token on the host)
             gets up to k drafts (engine/drafts.py: the radix tree, then its own n-grams),
             k chosen by its recent acceptance (DraftState.choose_k)
    verify:  the request runs as an extend of [x, d1..dk] that samples after each of its
             k + 1 tokens (t0..tk, with the keys plain decoding uses at those positions,
             sampling/sampler.py), so t_i is the token plain decoding would put after
             x, d1..di. Drafts are accepted while d_{i+1} == t_i; the first t_a after
             them is the bonus token. The output is plain decoding's, token for token,
             greedy or sampled (the drafts are deterministic proposals, so sampling the
             target and comparing is the rejection-sampling rule with a one-hot q).

Host side only: the step programs are the decode buckets that exist (a verify step's
tokens are one more extend), with a runtime `sample_at` row per sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixjax.cache.radix_cache import RadixCache
from radixjax.engine.config import EngineConfig
from radixjax.engine.drafts import NgramIndex, propose_draft
from radixjax.engine.request import Req

# The cost of a verify step of k drafts, in decode steps of one stream: 1 + the lost
# overlap (the step is processed before the next is scheduled) + per draft token.
# benchmarks/verify_step.py (SmolLM2, default form, context 512): k = 1 0.99-1.38,
# k = 3 1.46-1.58, k = 7 2.02-2.44 decode steps.
VERIFY_BASE_COST = 1.1
VERIFY_TOKEN_COST = 0.17
PRIOR_ACCEPT = 0.6  # a new request's assumed chance that a draft token is accepted
ACCEPT_EMA = 0.25  # weight of each observed draft token in the running estimate
MIN_GAIN = 1.1  # draft only where the model expects this many times plain decoding
RECOVER = 0.05  # per step without drafts, the estimate moves back toward the prior


def expected_gain(alpha: float, k: int) -> float:
    """Tokens per decode step's cost of a verify step of k drafts, each accepted with
    probability alpha given the one before it was: (1 + a + .. + a^k) / cost(k)."""
    tokens = sum(alpha ** i for i in range(k + 1))
    return tokens / (VERIFY_BASE_COST + VERIFY_TOKEN_COST * k)


@dataclass
class DraftState:
    """One request's drafting: its n-grams, acceptance estimate and counters."""

    index: NgramIndex
    alpha: float = PRIOR_ACCEPT
    num_verify_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    last_source: str = ""
    history: list[int] = field(default_factory=list)  # accepted per verify step (tests)

    def choose_k(self, max_k: int) -> int:
        """The draft length with the best expected gain, 0 if none beats plain decoding
        by MIN_GAIN (the cost model's error)."""
        best_k, best = 0, MIN_GAIN
        for k in range(1, max_k + 1):
            gain = expected_gain(self.alpha, k)
            if gain > best:
                best_k, best = k, gain
        return best_k

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        """After a verify step: the accepted drafts were hits, the first rejected a miss."""
        self.num_verify_steps += 1
        self.num_drafted += num_drafts
        self.num_accepted += num_accepted
        self.history.append(num_accepted)
        outcomes = [1.0] * num_accepted + ([0.0] if num_accepted < num_drafts else [])
        for hit in outcomes:
            self.alpha += ACCEPT_EMA * (hit - self.alpha)

    def idle(self) -> None:
        """A step without drafts: the estimate drifts back toward the prior."""
        self.alpha += RECOVER * (PRIOR_ACCEPT - self.alpha)


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


def draft_for(req: Req, cfg: EngineConfig, max_k: int,
              tree: RadixCache | None) -> list[int]:
    """Up to max_k drafts after req's tokens (all on the host), fewer or none as its
    acceptance says."""
    state = state_of(req, cfg)
    k = state.choose_k(max_k)
    drafts, state.last_source = propose_draft(state.index, k, tree, req.namespace)
    if not drafts:
        state.idle()
    return drafts


def drafts_likely(req: Req, cfg: EngineConfig, tree: RadixCache | None) -> bool:
    """Whether req would draft after the tokens on the host now (no state changes but
    the index catching up): then its next token is worth waiting for."""
    state = state_of(req, cfg)
    if not state.choose_k(cfg.speculative_num_draft_tokens):
        return False
    return bool(propose_draft(state.index, 1, tree, req.namespace)[0])


def num_accepted(drafts: list[int], sampled: list[int]) -> int:
    """sampled: t0..tk, the target's token after x, d1..dk. Drafts accepted: the longest
    prefix with d_{i+1} == t_i."""
    a = 0
    while a < len(drafts) and drafts[a] == sampled[a]:
        a += 1
    return a
