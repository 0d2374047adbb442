"""Prompt logprobs inside the step: for each scored token t of the packed axis, log p of
the prompt token that follows it, given everything up to t, and the top alternatives.

Only where asked (`PromptScores.mask`) and only there: the step's hidden states are cut
into blocks of SCORE_BLOCK tokens and a block runs the LM head only if one of its tokens
is scored (a lax.cond per block), so scoring a 5-token span in a 1,024-token step costs
one block's head, not 1,024 rows of it. The whole function runs behind the step's
`prompt_logprobs` flag; without it the step skips it entirely.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from radixjax.model.config import ModelConfig
from radixjax.model.llama import lm_head
from radixjax.model.params import Params
from radixjax.parallel.rules import Layout
from radixjax.sampling.params import MAX_TOP_LOGPROBS

SCORE_BLOCK = 32  # tokens per LM-head block


class PromptLogprobs(NamedTuple):
    logprobs: jax.Array  # [T] f32, log p(next_ids[t] | tokens <= t); 0 where not scored
    top_ids: jax.Array  # [T, MAX_TOP_LOGPROBS] int32
    top_logprobs: jax.Array  # [T, MAX_TOP_LOGPROBS] f32


def no_prompt_logprobs(num_tokens: int) -> PromptLogprobs:
    k = MAX_TOP_LOGPROBS
    return PromptLogprobs(jnp.zeros(num_tokens, jnp.float32),
                          jnp.zeros((num_tokens, k), jnp.int32),
                          jnp.zeros((num_tokens, k), jnp.float32))


def prompt_logprobs(params: Params, hidden: jax.Array, next_ids: jax.Array,
                    mask: jax.Array, *, cfg: ModelConfig,
                    layout: Layout | None) -> PromptLogprobs:
    """hidden [T, D] (final-normed), next_ids [T] int32, mask [T] bool -> PromptLogprobs."""
    t, d = hidden.shape
    block = min(SCORE_BLOCK, t)  # T is a power of two (or the largest bucket)
    pad = -t % block
    hb = jnp.pad(hidden, ((0, pad), (0, 0))).reshape(-1, block, d)
    ib = jnp.pad(next_ids, (0, pad)).reshape(-1, block)
    mb = jnp.pad(mask, (0, pad)).reshape(-1, block)

    def one_block(xs: tuple) -> PromptLogprobs:
        h, ids, m = xs

        def score(h: jax.Array) -> PromptLogprobs:
            logp = jax.nn.log_softmax(lm_head(params, h, cfg, layout), axis=-1)  # [blk, V]
            chosen = jnp.take_along_axis(logp, ids[:, None], axis=-1)[:, 0]
            top_lp, top_ids = lax.top_k(logp, MAX_TOP_LOGPROBS)
            return PromptLogprobs(chosen, top_ids.astype(jnp.int32), top_lp)

        return lax.cond(m.any(), score, lambda _: no_prompt_logprobs(block), h)

    out = lax.map(one_block, (hb, ib, mb))
    return PromptLogprobs(*(x.reshape(-1, *x.shape[2:])[:t] for x in out))
