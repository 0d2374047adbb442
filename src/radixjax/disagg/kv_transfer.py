"""KV moved between two engines' pools by JAX's transfer server (jax.experimental.transfer,
what sglang-jax uses): pool slots -> pieces of CHUNK tokens -> pool slots.

    prefill: export(slots)    gather the prompt's K/V rows of every layer into pieces
                              [L, CHUNK, Hkv, Dh] (copies: the pool's slots may be reused
                              at once); offer(pieces) makes them pullable, one uuid each
    decode:  pull(addr, ids)  fetch the pieces from the prefill server's transfer server
             import_(pieces, slots)  scatter them into this pool's slots (donated, in
                              place)

A piece is padded to CHUNK tokens with the dummy slot 0 (read as garbage, written to the
dummy), so there is one gather and one scatter program whatever the prompt's length.
Both run on the scheduler's loop, ordered with the steps that donate the pool.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import transfer

from radixjax.model.llama import KVPool
from radixjax.runtime.batch import DUMMY_SLOT

CHUNK = 256  # tokens per piece
SAMPLES = 1024  # elements of each weight in a pool's model fingerprint
Piece = tuple[jax.Array, jax.Array]  # (k, v), each [L, CHUNK, Hkv, Dh]


def _rows(slots: jax.Array, num_layers: int, num_slots: int) -> jax.Array:
    """slots [CHUNK] -> pool rows [L, CHUNK] (layer l at rows l * num_slots ..)."""
    return jnp.arange(num_layers)[:, None] * num_slots + slots[None, :]


@partial(jax.jit, static_argnames=("num_layers", "num_slots"))
def _gather(kv: KVPool, slots: jax.Array, *, num_layers: int, num_slots: int) -> Piece:
    rows = _rows(slots, num_layers, num_slots)
    return kv[0][rows], kv[1][rows]


@partial(jax.jit, static_argnames=("num_layers", "num_slots"), donate_argnames="kv")
def _scatter(kv: KVPool, piece: Piece, slots: jax.Array, *, num_layers: int,
             num_slots: int) -> KVPool:
    rows = _rows(slots, num_layers, num_slots)
    return kv[0].at[rows].set(piece[0]), kv[1].at[rows].set(piece[1])


@jax.jit
def _weight_samples(weights: list[jax.Array]) -> list[jax.Array]:
    """Up to SAMPLES elements of every weight, evenly spread over it."""
    out = []
    for x in weights:
        flat = jnp.ravel(x)
        out.append(flat[:: max(1, flat.size // SAMPLES)][:SAMPLES])
    return out


def num_pieces(num_tokens: int) -> int:
    """How many pieces hold num_tokens tokens' KV."""
    return -(-num_tokens // CHUNK)


def pieces_of(slots: np.ndarray) -> list[np.ndarray]:
    """slots -> [CHUNK] int32 arrays, the last one padded with the dummy slot."""
    out = []
    for start in range(0, len(slots), CHUNK):
        piece = np.full(CHUNK, DUMMY_SLOT, np.int32)
        part = slots[start:start + CHUNK]
        piece[: len(part)] = part
        out.append(piece)
    return out


class KVTransfer:
    """One per engine: its transfer server (on the runner's device) and the pool's
    geometry. `runner.kv` is read and replaced only from the scheduler's loop."""

    def __init__(self, runner, host: str = "127.0.0.1") -> None:
        """host: the address this engine's transfer server listens on and gives its
        peers (--disaggregation-transfer-host): one the other servers can reach."""
        if runner.layout is not None:
            raise ValueError("disaggregation runs on one device per server (no --tp)")
        self.runner = runner
        self.device = runner.kv[0].devices().pop()
        self.server = transfer.start_transfer_server(self.device.client, f"{host}:0",
                                                     [f"{host}:0"])
        self.statics = dict(num_layers=runner.run_cfg.num_layers,
                            num_slots=runner.config.num_slots)
        shape = (runner.run_cfg.num_layers, CHUNK, *runner.kv[0].shape[1:])
        sharding = jax.sharding.SingleDeviceSharding(self.device)
        self.piece_spec = jax.ShapeDtypeStruct(shape, runner.kv[0].dtype, sharding=sharding)
        self._fingerprint: str | None = None
        self._uuids = itertools.count(1)
        self._connections: dict[str, transfer.TransferConnection] = {}
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self.server.address()

    @property
    def piece_format(self) -> str:
        """dtype[shape] of a piece's K (and V): both servers of a pair must agree (same
        model, --kv-cache-dtype and CHUNK)."""
        return f"{self.piece_spec.dtype}{list(self.piece_spec.shape)}"

    @property
    def fingerprint(self) -> str:
        """The model this pool's KV belongs to: its config, the piece format and samples
        of every weight's bits (spread over each array). A decode server lands KV only
        from a prefill server with the same fingerprint."""
        if self._fingerprint is None:
            h = hashlib.sha256(self.piece_format.encode())
            h.update(repr(self.runner.cfg).encode())
            # (not oneDNN's packed int8 blobs: their padding bytes vary from run to run;
            # their per-row scales are in)
            weights = [x for path, x in jax.tree_util.tree_leaves_with_path(self.runner.params)
                       if "packed" not in jax.tree_util.keystr(path)]
            for leaf in jax.device_get(_weight_samples(weights)):
                h.update(f"{leaf.dtype}{leaf.shape}".encode())
                h.update(np.ascontiguousarray(leaf).tobytes())
            self._fingerprint = h.hexdigest()[:32]
        return self._fingerprint

    @property
    def piece_bytes(self) -> int:
        return 2 * int(np.prod(self.piece_spec.shape)) * self.piece_spec.dtype.itemsize

    def warmup(self) -> None:
        """Compile the gather and the scatter (reading and writing the dummy slot only),
        and take the model's fingerprint."""
        dummy = np.full(1, DUMMY_SLOT, np.int64)
        jax.block_until_ready(self.import_(self.export(dummy), dummy))
        assert self.fingerprint

    # -- prefill side ---------------------------------------------------------------------

    def export(self, slots: np.ndarray) -> list[Piece]:
        """Copies of these slots' K/V (dispatched now, in order with the steps)."""
        return [_gather(self.runner.kv, jnp.asarray(p), **self.statics)
                for p in pieces_of(np.asarray(slots))]

    def offer(self, pieces: list[Piece], timeout_s: float) -> list[int]:
        """Make the pieces pullable once each; returns their uuids. The transfer server
        drops a piece nobody pulled within timeout_s."""
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        uuids = []
        for piece in pieces:
            uuid = next(self._uuids)
            self.server.await_pull(uuid, piece, timeout=deadline)
            uuids.append(uuid)
        return uuids

    # -- decode side ----------------------------------------------------------------------

    def pull(self, address: str, uuids: list[int]) -> list[Piece]:
        """Fetch the pieces (blocking until they are here: call it off the loop)."""
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = self._connections[address] = self.server.connect(address)
        pieces = [conn.pull(uuid, (self.piece_spec, self.piece_spec)) for uuid in uuids]
        return jax.block_until_ready(pieces)

    def import_(self, pieces: list[Piece], slots: np.ndarray) -> KVPool:
        """Write the pieces into this pool's slots (len(slots) tokens of them)."""
        for piece, piece_slots in zip(pieces, pieces_of(np.asarray(slots)), strict=True):
            self.runner.kv = _scatter(self.runner.kv, piece, jnp.asarray(piece_slots),
                                      **self.statics)
        return self.runner.kv
