"""SGLang's bootstrap fields on a disaggregated request (the router fills them in the body
it sends to both servers): which prefill server holds the KV, and the room naming this
request there."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


class BootstrapError(ValueError):
    """The bootstrap fields are missing or malformed."""


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int
    room: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        return f"http://{host}:{self.port}"


_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def valid_host(host: str) -> bool:
    """An IP address or a DNS name: nothing that could change the URL built from it."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(host) is not None


def host_port(entry: str) -> tuple[str, int]:
    """"HOST:PORT" (IPv6: "[::1]:PORT") -> (host, port). Raises BootstrapError."""
    host, sep, port = entry.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not valid_host(host):
        raise BootstrapError(f"{entry!r} is not HOST:PORT")
    return host, int(port)


def _one(host: Any, port: Any, room: Any) -> Bootstrap | None:
    if host is None and room is None:
        return None
    if not isinstance(host, str) or not valid_host(host):
        raise BootstrapError("'bootstrap_host' must be the prefill server's host name or "
                             "IP address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise BootstrapError("'bootstrap_port' must be the prefill server's HTTP port (give "
                             "the router --prefill URL PORT)")
    if isinstance(room, bool) or not isinstance(room, int) or room < 0:
        raise BootstrapError("'bootstrap_room' must be a non-negative integer")
    return Bootstrap(host, port, room)


def parse_bootstrap(body: dict, num: int, batched: bool) -> list[Bootstrap | None]:
    """One entry per prompt (lists when batched, as the router sends them)."""
    values = [body.get(f) for f in FIELDS]
    if batched and any(isinstance(v, list) for v in values):
        if not all(isinstance(v, list) and len(v) == num for v in values):
            raise BootstrapError(f"bootstrap fields need one entry per prompt ({num})")
        return [_one(*vs) for vs in zip(*values, strict=True)]
    if any(isinstance(v, list) for v in values):
        raise BootstrapError("bootstrap fields are lists only for a batch of prompts")
    return [_one(*values)] * num
