"""What Engine.generate and the DP front share about their inputs and outputs: a prompt
(text or token ids), generate()'s arguments made into lists, a stream's final output."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from radixjax.engine.errors import RequestError
from radixjax.engine.output import GenerateOutput, StreamChunk

Prompt = str | Sequence[int]


def batch_inputs(prompts: Prompt | Sequence[Prompt], sampling_params: Any,
                 n: int) -> tuple[bool, list[Prompt], list[Any]]:
    """generate()'s arguments -> (a single prompt?, the prompts, one sampling_params per
    prompt). A single prompt is text or a list of token ids."""
    single = isinstance(prompts, str) or (
        len(prompts) > 0 and isinstance(prompts[0], int | np.integer))
    plist: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item]
    if not plist:
        raise RequestError("no prompts given")
    if n < 1:
        raise RequestError("n must be >= 1")
    if isinstance(sampling_params, list | tuple):
        if len(sampling_params) != len(plist):
            raise RequestError("need one sampling_params per prompt")
        return single, plist, list(sampling_params)
    return single, plist, [sampling_params] * len(plist)


async def final_output(chunks: AsyncIterator[StreamChunk]) -> GenerateOutput:
    """The GenerateOutput a request's stream ends with."""
    last = None
    async for chunk in chunks:
        last = chunk
    assert last is not None and last.output is not None
    return last.output
