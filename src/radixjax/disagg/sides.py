"""The engine's disaggregation side from its config: None, PrefillSide or DecodeSide
(engine/handoff.py MakeHandoff: the server passes make_side to its Engine)."""

from __future__ import annotations

from typing import Any

from radixjax.disagg.decode import DecodeSide
from radixjax.disagg.kv_transfer import KVTransfer
from radixjax.disagg.prefill import PrefillSide


def make_side(config: Any, runner: Any, warmup: bool) -> PrefillSide | DecodeSide | None:
    """config: EngineConfig. warmup: compile the KV gather and scatter now."""
    mode = config.disaggregation_mode
    if mode == "null":
        return None
    transfer = KVTransfer(runner)
    if warmup:
        transfer.warmup()
    side = PrefillSide if mode == "prefill" else DecodeSide
    return side(transfer, config.disaggregation_timeout)
