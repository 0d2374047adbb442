"""Multi-host serving on jax.distributed: one global mesh over every process's devices.

    rank 0:   HTTP + scheduler; its ModelRunner is a `BroadcastRunner`: before each call
              that touches the devices (a step, a state reset) it publishes the call
              (method name, host arguments) as message n in the coordination service's
              key-value store, then makes the call itself
    rank > 0: `follow(runner)`: reads message 0, 1, 2, ... and makes the same calls on
              an identical ModelRunner, so every process dispatches the same programs in
              the same order (what a program over a multi-process mesh requires)

The store is jax.distributed's own (gRPC, hosted by rank 0's process, bound to
--dist-init-addr's host); a message is the call's arguments in parallel/wire.py's form
(a JSON outline and numpy arrays, never a pickle; a few KB for a step), signed with the
cluster's secret (RADIXJAX_DIST_SECRET) when it has one. A coordination address that is
not loopback needs the secret: anyone who reaches the store could otherwise feed the
followers their steps. Failures end
the others instead of hanging them: a follower whose rank 0 is gone gets an error from
its next read; rank 0 learns of a dead follower from the collective of its next step
or, when idle, from the coordination service's heartbeats (`heartbeat_timeout_s`).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

from radixjax.parallel.wire import Wire, WireError

log = logging.getLogger(__name__)

KEY = "radixjax/call/{}"
KEEP = 64  # messages kept in the store: every rank has long read call n - KEEP
STOP = "stop"


class MultiHostError(RuntimeError):
    """A rank died or stopped answering: this process cannot serve alone."""


@dataclass(frozen=True)
class DistConfig:
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # "host:port" of rank 0's coordination service
    heartbeat_timeout_s: int = 10  # a rank silent this long is declared dead
    init_timeout_s: int = 300  # how long ranks wait for each other at start
    # signs every message (HMAC-SHA256); required unless dist_init_addr is loopback
    secret: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"need 0 <= node_rank < nnodes, got {self.node_rank}, "
                             f"{self.nnodes}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (rank 0's)")
        if self.nnodes > 1 and self.secret is None and not _is_loopback(self.host):
            raise ValueError(
                f"--dist-init-addr {self.dist_init_addr} is reachable from other machines: "
                "set the same RADIXJAX_DIST_SECRET on every node (its steps are signed "
                "with it), or use a loopback address")

    @property
    def host(self) -> str:
        return (self.dist_init_addr or "").rsplit(":", 1)[0].strip("[]")

    @property
    def is_multihost(self) -> bool:
        return self.nnodes > 1

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def init_distributed(config: DistConfig) -> None:
    """Join the jax.distributed cluster (before anything touches a device): afterwards
    jax.devices() lists every process's devices. Rank 0's coordination service listens
    on the address given, not on every interface."""
    # A dead rank does not terminate the others: rank 0 fails its requests and answers
    # 503 (RankWatch), the followers exit when rank 0 is gone (their next read).
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        config.dist_init_addr, num_processes=config.nnodes, process_id=config.node_rank,
        initialization_timeout=config.init_timeout_s,
        heartbeat_timeout_seconds=config.heartbeat_timeout_s,
        coordinator_bind_address=config.dist_init_addr)
    log.info("rank %d of %d: %d devices, %d local", config.node_rank, config.nnodes,
             jax.device_count(), jax.local_device_count())


def shutdown_distributed() -> None:
    """Leave the cluster together: every rank waits for the others here (a rank 0 that
    exited first would take the coordination service away from the rest)."""
    try:
        jax.distributed.shutdown()
    except Exception as e:  # noqa: BLE001
        raise MultiHostError(f"leaving the cluster failed: {e}") from e


def wait_followers_left(nnodes: int, timeout_s: float) -> None:
    """Rank 0, after telling the others to stop: wait (at most timeout_s) until they
    have left the cluster, so that the coordination service it hosts outlives their
    goodbyes (a recoverable cluster's shutdown does not wait for them)."""
    client = _client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if set(client.get_live_nodes(list(range(nnodes)))) <= {0}:
                return
        except Exception:  # noqa: BLE001 - the service is going: nothing to wait for
            return
        time.sleep(0.1)


def _client() -> Any:
    from jax._src import distributed  # the coordination service's client (no public API)

    client = distributed.global_state.client
    if client is None:
        raise MultiHostError("jax.distributed is not initialized")
    return client


def wait_for_ranks(name: str, timeout_s: float) -> None:
    """Every rank reaches this point (e.g. its step programs are compiled) or all raise."""
    try:
        _client().wait_at_barrier(f"radixjax/{name}", int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001
        raise MultiHostError(f"ranks did not all reach {name!r}: {e}") from e


class RankWatch:
    """Rank 0: a thread that asks the coordination service every `every_s` which ranks
    are alive; the first time one is not (or the service fails), on_lost(reason), once."""

    def __init__(self, nnodes: int, every_s: float, on_lost: Callable[[str], None]) -> None:
        self._ranks = list(range(nnodes))
        self._every_s = every_s
        self._on_lost = on_lost
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="rank-watch").start()

    def _run(self) -> None:
        client = _client()
        while not self._stop.wait(self._every_s):
            try:
                live = client.get_live_nodes(self._ranks)
            except Exception as e:  # noqa: BLE001 - the client raises plain errors
                reason = f"the cluster's coordination service failed: {e}"
            else:
                missing = [r for r in self._ranks if r not in live]
                if not missing:
                    continue
                reason = f"rank {', '.join(map(str, missing))} of the cluster is gone"
            log.error("%s: this engine cannot serve any more", reason)
            self._on_lost(reason)
            return

    def stop(self) -> None:
        self._stop.set()


class CallChannel:
    """Numbered messages from rank 0 to every other rank through the key-value store.
    wire: the form of the messages (the step's argument types, the cluster's secret)."""

    def __init__(self, wire: Wire, poll_s: float = 1.0) -> None:
        self._client = _client()
        self._wire = wire
        self._next = 0
        self._poll_ms = int(poll_s * 1000)
        self._lock = threading.Lock()  # the scheduler's loop and a worker thread publish

    def publish(self, name: str, args: tuple) -> None:
        message = self._wire.encode((name, tuple(args)))
        with self._lock:
            self._publish(message)

    def _publish(self, message: bytes) -> None:
        n = self._next
        self._client.key_value_set_bytes(KEY.format(n), message)
        # Call n - KEEP was read by every rank: rank 0 has since waited on the output of
        # later steps (at most two are in flight), whose collectives needed every rank.
        if n >= KEEP:
            self._client.key_value_delete(KEY.format(n - KEEP))
        self._next = n + 1

    def receive(self, timeout_s: float | None = None) -> tuple[str, tuple]:
        """The next message; waits as long as rank 0 is alive and quiet (or at most
        timeout_s: then TimeoutError)."""
        key = KEY.format(self._next)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                data = self._client.blocking_key_value_get_bytes(key, self._poll_ms)
                break
            except Exception as e:  # noqa: BLE001 - the client raises plain errors
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise MultiHostError(f"lost rank 0's coordination service: {e}") from e
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no message {self._next} in {timeout_s} s") from e
        self._next += 1
        try:
            name, args = self._wire.decode(data)
        except (WireError, ValueError, TypeError) as e:  # (not a (name, args) pair)
            raise MultiHostError(f"message {self._next - 1} refused: {e}") from e
        if not isinstance(name, str) or not isinstance(args, tuple):
            raise MultiHostError(f"message {self._next - 1} refused: not a call")
        return name, args


class BroadcastRunner:
    """Rank 0's ModelRunner: device calls are published before they are made; the rest
    of the runner (buckets, counters, warm-up) is the wrapped runner's."""

    BROADCAST = ("step", "reset_state", "all_logits")

    def __init__(self, runner: Any, channel: CallChannel) -> None:
        self._runner, self._channel = runner, channel

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._runner, name)
        if name not in self.BROADCAST:
            return attr

        def call(*args: Any) -> Any:
            self._channel.publish(name, args)
            return attr(*args)

        return call

    def dispatches_at_once(self, shape: Any) -> bool:
        """No: a step first publishes through the coordination service (a network call),
        kept off the scheduler's loop."""
        return False

    def stop_followers(self) -> None:
        self._channel.publish(STOP, ())


def follow(runner: Any, channel: CallChannel, verdict_s: float,
           fail_at: int | None = None) -> None:
    """Rank > 0: make rank 0's device calls until it says stop. Outputs are dropped (rank
    0 reads them); each step is waited on so that a failed collective surfaces here.

    A call that raises here raised on rank 0 too when rank 0's next call is the state
    reset of its recovery (the same code on the same inputs: rank 0's scheduler failed
    that step's requests). Any other next call, or none within verdict_s, means this
    rank failed alone: it cannot follow any more and raises MultiHostError (its process
    exits; rank 0 then loses it, as a killed rank). fail_at: test hook, call n raises
    here only."""
    calls = 0
    t0 = time.monotonic()
    while True:
        name, args = channel.receive()
        if name == STOP:
            log.info("rank 0 stopped after %d calls (%.0f s)", calls, time.monotonic() - t0)
            return
        if name not in BroadcastRunner.BROADCAST:
            raise MultiHostError(f"unknown call {name!r} from rank 0")
        try:
            if calls == fail_at:
                raise RuntimeError(f"injected follower fault at call {calls} (test hook)")
            jax.block_until_ready(getattr(runner, name)(*args))
        except Exception as e:  # noqa: BLE001 - rank 0's verdict decides
            log.exception("call %d (%s) failed", calls, name)
            _await_reset(runner, channel, verdict_s, f"call {calls} ({name}): {e}")
            calls += 1
        calls += 1


def _await_reset(runner: Any, channel: CallChannel, verdict_s: float, failure: str) -> None:
    """After a failed call: rank 0's next call must be its recovery's reset."""
    try:
        name, _ = channel.receive(timeout_s=verdict_s)
    except TimeoutError:
        name = None
    if name != "reset_state":
        raise MultiHostError(f"this rank failed alone ({failure}); rank 0 went on "
                             f"({name or 'no call in ' + str(verdict_s) + ' s'})")
    jax.block_until_ready(runner.reset_state())
