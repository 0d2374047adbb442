"""Mesh and flag validation in the (one-device) pytest process."""

from __future__ import annotations

import pytest

from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.launch_server import parse_args
from radixjax.parallel.mesh import MeshConfig, MeshConfigError, make_mesh
from radixjax.parallel.rules import Layout


def test_too_few_devices_says_how_to_get_more() -> None:
    with pytest.raises(MeshConfigError, match="xla_force_host_platform_device_count=2"):
        make_mesh(MeshConfig(tp=2))


def test_ep_must_divide_tp() -> None:
    with pytest.raises(MeshConfigError, match="ep=3 must divide tp=4"):
        MeshConfig(tp=4, ep=3)
    with pytest.raises(EngineConfigError, match="ep must divide tp"):
        EngineConfig(tp=4, ep=3)


def test_one_device_mesh_shards_nothing() -> None:
    layout = Layout(make_mesh(MeshConfig(tp=0)))  # 0: every visible device (one here)
    assert layout.tp == layout.ep == 1
    assert tuple(layout.partition(("vocab", "embed"), (256, 64))) == (None, None)


def test_cli_flags() -> None:
    args = parse_args(["--tp", "4", "--ep", "2"])
    assert (args.tp, args.ep) == (4, 2)
    assert (parse_args([]).tp, parse_args([]).ep) == (1, 1)
