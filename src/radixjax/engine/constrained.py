"""Host side of grammar-constrained requests (Req.grammar, a grammar/xgr.Matcher): the
per-step token bitmask, feeding sampled tokens to the matcher, and jump-forward.

The overlap loop's exception: a constrained request's next mask depends on the token
its previous step sampled, so that step is processed before the next one is scheduled
(Scheduler.run_once drains it)."""

from __future__ import annotations

import numpy as np

from radixjax.engine.request import Req
from radixjax.sampling.bitmask import bitmask_width


def waits_for_host(reqs: list[Req]) -> bool:
    """Whether a request among `reqs` has its last token still on the device and needs
    it on the host for the next step: a constrained request's mask, a request about to
    draft (engine/speculative.py)."""
    return any((r.grammar is not None or r.wants_drafts) and r.num_pending for r in reqs)


def build_token_mask(reqs: list[Req], samples: list[bool], rows: list[int],
                     num_rows: int, vocab_size: int) -> np.ndarray | None:
    """[num_rows, ceil(V / 32)] int32 bitmask, all ones but the constrained requests'
    rows (rows[i]: request i's sampling row) that sample in this step; None when there
    are none (the step then skips the mask)."""
    constrained = [i for i, (r, keep) in enumerate(zip(reqs, samples, strict=True))
                   if keep and r.grammar is not None]
    if not constrained:
        return None
    mask = np.full((num_rows, bitmask_width(vocab_size)), -1, np.int32)
    for i in constrained:
        reqs[i].grammar.fill_bitmask(mask, rows[i])
    return mask


def jump_forward(r: Req, limit: int) -> list[int]:
    """Accept the tokens the grammar forces after r's last token (at most `limit`) and
    return them; the caller appends them as outputs that the next step extends over."""
    tokens = r.grammar.jump_forward_tokens()[:max(limit, 0)]
    for n, t in enumerate(tokens):
        if not r.grammar.accept(t):  # xgrammar proposed it, so this should not happen
            r.grammar.rollback(n)
            return []
    return tokens
