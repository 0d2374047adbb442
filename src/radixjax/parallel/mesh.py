"""The engine's one Mesh: axes ("expert", "tensor") of shape (ep, tp // ep).

    devices (tp = 4, ep = 2):          expert=0: [d0 d1]    <- "tensor" runs along a row
                                       expert=1: [d2 d3]

Attention, the dense MLP and the vocabulary are split over all tp devices (both axes
together); MoE experts are split over "expert" and each expert's columns over "tensor",
as SGLang's `--tp N --ep M` (EP inside the TP group; M divides N). A CPU mesh for tests:
XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh

EXPERT_AXIS = "expert"
TENSOR_AXIS = "tensor"
MESH_AXES = (EXPERT_AXIS, TENSOR_AXIS)


class MeshConfigError(ValueError):
    """--tp / --ep do not fit the devices or each other."""


@dataclass(frozen=True)
class MeshConfig:
    tp: int = 1  # devices in the tensor-parallel group (0: every visible device)
    ep: int = 1  # expert-parallel groups inside it; must divide tp

    def __post_init__(self) -> None:
        if self.tp < 0 or self.ep < 1:
            raise MeshConfigError("need tp >= 0 (0: all devices) and ep >= 1")
        if self.tp and self.tp % self.ep:
            raise MeshConfigError(f"ep={self.ep} must divide tp={self.tp}")

    @property
    def is_single_device(self) -> bool:
        return self.tp == 1


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh over the first tp devices (all of them when tp = 0)."""
    devices = list(devices if devices is not None else jax.devices())
    tp = config.tp or len(devices)
    if tp % config.ep:
        raise MeshConfigError(f"ep={config.ep} must divide tp={tp}")
    if tp > len(devices):
        raise MeshConfigError(
            f"tp={tp} needs {tp} devices, {len(devices)} visible (on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={tp})"
        )
    grid = np.array(devices[:tp], dtype=object).reshape(config.ep, tp // config.ep)
    return Mesh(grid, MESH_AXES)
