"""radixjax: a JAX-native LLM serving engine with a radix-tree KV cache.

The public names load lazily, so host-only parts (`radixjax.cache`) never import JAX."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Engine": "radixjax.engine.engine",
    "GenerateOutput": "radixjax.engine.engine",
    "StreamChunk": "radixjax.engine.engine",
    "generate": "radixjax.engine.engine",
    "EngineConfig": "radixjax.engine.config",
    "EngineError": "radixjax.engine.errors",
    "RequestError": "radixjax.engine.errors",
    "SamplingParams": "radixjax.sampling.params",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'radixjax' has no attribute {name!r}")
