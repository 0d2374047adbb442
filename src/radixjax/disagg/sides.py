"""The engine's disaggregation side from its config: None, PrefillSide or DecodeSide
(engine/handoff.py MakeHandoff: the server passes make_side, with its PDOptions bound,
to its Engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixjax.disagg.bootstrap import BootstrapError, host_port, valid_host
from radixjax.disagg.decode import DecodeSide
from radixjax.disagg.kv_transfer import KVTransfer
from radixjax.disagg.prefill import PrefillSide


@dataclass(frozen=True)
class PDOptions:
    """The network side of a PD server (launch_server's flags)."""

    # decode: the prefill servers ("HOST:PORT", their HTTP address) whose bootstrap
    # fields it follows; a request naming any other is refused (400), nothing fetched
    prefill_hosts: tuple[str, ...] = ()
    transfer_host: str = "127.0.0.1"  # where this server's transfer server listens
    api_key: str | None = None  # sent to the prefill server (the pair shares one)

    def __post_init__(self) -> None:
        for entry in self.prefill_hosts:
            host_port(entry)  # BootstrapError: not HOST:PORT
        if not valid_host(self.transfer_host):
            raise BootstrapError(f"{self.transfer_host!r} is not a host name or address")


def make_side(config: Any, runner: Any, warmup: bool,
              options: PDOptions = PDOptions()) -> PrefillSide | DecodeSide | None:
    """config: EngineConfig. warmup: compile the KV gather and scatter now."""
    mode = config.disaggregation_mode
    if mode == "null":
        return None
    transfer = KVTransfer(runner, options.transfer_host)
    if warmup:
        transfer.warmup()
    if mode == "prefill":
        return PrefillSide(transfer, config.disaggregation_timeout)
    return DecodeSide(transfer, config.disaggregation_timeout,
                      {host_port(e) for e in options.prefill_hosts}, options.api_key)
