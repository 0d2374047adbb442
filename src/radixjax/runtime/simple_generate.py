"""One request at a time, no cache sharing: prefill, then decode token by token.
The plain sequential reference that cached/batched engine paths are compared against,
and what the CLI uses until the engine exists."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from radixjax.runtime.batch import RequestSlice, build_batch
from radixjax.runtime.model_runner import ModelRunner, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams


class PromptTooLongError(ValueError):
    """prompt + max_new_tokens does not fit the runner's context or KV pool."""


def generate_tokens(
    runner: ModelRunner, prompt: list[int], sp: SamplingParams, seed: int = 0,
    eos_token_ids: tuple[int, ...] = (),
) -> Iterator[int]:
    """Yield sampled token ids until max_new_tokens or a stop/EOS token (which is yielded).
    Uses KV slots 1 .. len(prompt) + max_new_tokens of the runner's pool."""
    if not prompt:
        raise ValueError("empty prompt")
    total = len(prompt) + sp.max_new_tokens
    limit = min(runner.config.max_context, runner.config.num_slots - 1)
    if total > limit:
        raise PromptTooLongError(f"prompt ({len(prompt)}) + max_new_tokens exceeds {limit}")
    stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos_token_ids))
    opts = StepOptions(do_sample=not sp.is_greedy)
    slots = np.arange(1, total + 1, dtype=np.int32)
    new = np.asarray(prompt, np.int32)
    kv_len = len(prompt)
    for _ in range(sp.max_new_tokens):
        batch = build_batch([RequestSlice(new, slots[:kv_len])], runner.buckets)
        arrays = SamplingArrays.build([sp], [seed], batch.shape.num_reqs)
        token = int(runner.step(batch, arrays, opts).tokens[0])
        yield token
        if token in stops:
            return
        new = np.array([token], np.int32)
        kv_len += 1
