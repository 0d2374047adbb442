"""Whether an engine loads its model's matrices in their GGUF blocks: the one decision
that Engine, DataParallelEngine and the CLI share (engine.py imports data_parallel.py,
so it lives here)."""

from __future__ import annotations

from pathlib import Path

import jax

from radixjax.engine.config import EngineConfig, serving_form
from radixjax.loaders import blocks_servable


def in_blocks(c: EngineConfig, model: str | Path | None) -> bool:
    """Whether c's form for `model` (a path or name, as load_model takes it) is "gguf":
    its matrices loaded and multiplied in their GGUF blocks."""
    gguf = blocks_servable(model)
    return serving_form(c, jax.default_backend(), gguf=gguf).quantization == "gguf"
