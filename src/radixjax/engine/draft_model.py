"""Drafts from a small draft model sharing the target's tokenizer (speculative_algorithm
"standalone", SGLang's name): the verify step, acceptance and KV handling are the n-gram
path's (engine/speculative.py); only the proposer differs.

The draft model has its own ModelRunner built from the target's runner config: the same
KV slots, table rows and token buckets, a pool of its own. Every step the target runs,
the draft runs on the same host batch (`mirror`), so its KV is valid wherever the
target's is (prompts, cached prefixes, accepted tokens: the radix tree's slots hold
both). To propose k tokens for the requests of a decode step:

    round 1:      each request feeds its last token x (on the host) at its next position
    rounds 2..k:  each feeds the token round j - 1 sampled (the draft runner's token
                  buffer on the device, no host trip in between)
    -> the k tokens of each request, greedy (argmax): deterministic proposals, so the
       verify step's sample-and-compare keeps the output plain decoding's, token for
       token (a sampled draft with min(1, p / q) acceptance would raise acceptance at
       temperature 1 but lose that identity)

The rounds write the draft's KV of x, d1..d(k-1) at the slots the verify step then
writes the target's (and the mirrored verify step the draft's again, the same values).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from radixjax.engine.request import Req
from radixjax.runtime.batch import HostBatch, RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class DraftModel:
    """runner: the draft model's, with the target runner's config (slots, rows, buckets)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def before(self, target: ModelRunner) -> None:
        """Before the target's next step: its token buffer (the tokens its steps sampled)
        copied to the draft's, so a mirrored decode reads the target's last tokens, not
        the draft's own."""
        self.runner.last_tokens = jnp.copy(target.last_tokens)

    def mirror(self, host: HostBatch) -> None:
        """Run the target's step on the draft model (its KV at the same slots); the
        sampled tokens are not used. Dispatched, not waited for."""
        sp = SamplingArrays.build([GREEDY] * host.num_reqs, [0] * host.num_reqs,
                                  host.shape.num_reqs)
        md = host.md._replace(window_out_slots=None)  # (its pool is one: no window pool)
        self.runner.step(host._replace(scores=None, md=md), sp, StepOptions())

    def propose(self, reqs: list[Req], ks: list[int]) -> list[list[int]]:
        """ks[i] greedy draft tokens after each request's tokens (its last one on the
        host, its KV slots allocated through position seq_len - 1 + ks[i])."""
        rounds = max(ks, default=0)
        active = [i for i, k in enumerate(ks) if k > 0]
        outs = []
        for j in range(rounds):
            slices = []
            for i in active:
                r = reqs[i]
                pos = r.seq_len - 1 + j  # the position of the token fed in this round
                token = r.ids(pos, pos + 1) if j == 0 else [0]
                slices.append(RequestSlice(np.array(token, np.int32), r.slots[:pos + 1],
                                           r.row, first_from_device=j > 0, sync_row=False))
            host = build_batch(slices, self.runner.buckets)
            sp = SamplingArrays.build([GREEDY] * len(slices), [0] * len(slices),
                                      host.shape.num_reqs)
            outs.append(self.runner.step(host, sp, StepOptions()).tokens)
        tokens = [np.asarray(t) for t in outs]  # [rounds] x [B]: one wait, at the end
        drafts: list[list[int]] = [[] for _ in reqs]
        for n, i in enumerate(active):
            drafts[i] = [int(tokens[j][n]) for j in range(ks[i])]
        return drafts
