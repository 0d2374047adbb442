"""Helpers for driving a ModelRunner by hand in tests (the engine does this for real)."""

from __future__ import annotations

import numpy as np

from radixjax.model.config import ModelConfig
from radixjax.model.params import Params
from radixjax.runtime.model_runner import ModelRunner, RunnerConfig
from tests.tiny_models import FAST_COMPILE


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))


class ScatteredSlots:
    """Hands out KV slots in a random order, so requests' slots are non-contiguous."""

    def __init__(self, num_slots: int, seed: int = 0) -> None:
        self._free = list(np.random.default_rng(seed).permutation(np.arange(1, num_slots)))

    def take(self, n: int) -> np.ndarray:
        out, self._free = self._free[:n], self._free[n:]
        assert len(out) == n, "test pool too small"
        return np.array(out, np.int32)


def tiny_runner(cfg: ModelConfig, params: Params, **kw: int | str) -> ModelRunner:
    config = dict(num_slots=512, max_batch_tokens=64, max_running=4, max_context=64,
                  xla_options=FAST_COMPILE)
    config.update(kw)
    return ModelRunner(cfg, params, RunnerConfig(**config))  # type: ignore[arg-type]
