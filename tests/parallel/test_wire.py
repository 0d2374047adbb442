"""What crosses between hosts (parallel/wire.py, parallel/multihost.py): a step's
arguments round-trip exactly; a message that would run code, names a class outside the
step's types, or is not signed with the cluster's secret is refused before anything in
it is built; the coordination service listens on the address given; publishing is
thread-safe."""

from __future__ import annotations

import io
import os
import pickle
import struct
import threading

import jax
import numpy as np
import pytest

from radixjax.parallel import multihost
from radixjax.parallel.multihost import CallChannel, DistConfig, MultiHostError
from radixjax.parallel.wire import MAC_BYTES, MAGIC, Wire, WireError
from radixjax.runtime.batch import Buckets, RequestSlice, build_batch
from radixjax.runtime.model_runner import STEP_WIRE_TYPES, StepOptions
from radixjax.sampling.params import SamplingArrays, SamplingParams


def step_args() -> tuple:
    slices = [RequestSlice(np.array([5, 6, 7], np.int32), np.arange(1, 4), row=0),
              RequestSlice(np.array([9], np.int32), np.arange(10, 30), row=2,
                           first_from_device=True, sync_row=False)]
    host = build_batch(slices, Buckets.default(64, 8))
    sp = SamplingArrays.build([SamplingParams(temperature=0.7, seed=3), SamplingParams()],
                              [3, 4], host.shape.num_reqs)
    opts = StepOptions(do_sample=True, return_logprobs=True)
    return host, sp, opts, None


def assert_same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, tuple):  # NamedTuples too
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_a_steps_arguments_round_trip() -> None:
    wire = Wire(STEP_WIRE_TYPES, b"k")
    message = ("step", step_args())
    assert_same(wire.decode(wire.encode(message)), message)
    assert wire.decode(wire.encode(("reset_state", ()))) == ("reset_state", ())


def message(outline: object, arrays_npz: bytes) -> bytes:
    text = repr(outline).replace("'", '"').encode()
    body = struct.pack("<I", len(text)) + text + arrays_npz
    return MAGIC + bytes(MAC_BYTES) + body


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_message_that_would_run_code_is_refused(tmp_path) -> None:
    wire = Wire(STEP_WIRE_TYPES)
    evil = RunsCode()
    evil.path = tmp_path / "ran"
    buf = io.BytesIO()
    np.savez(buf, np.array([evil], dtype=object))  # a pickled object array
    with pytest.raises(WireError, match="malformed"):
        wire.decode(message({"array": 0}, buf.getvalue()))
    with pytest.raises(WireError, match="not a radixjax message"):  # the old format
        wire.decode(pickle.dumps(evil))
    assert not evil.path.exists()
    with pytest.raises(WireError, match="not one of the wire's types"):
        empty = io.BytesIO()
        np.savez(empty)
        wire.decode(message({"type": "Popen", "fields": {"args": "ls"}}, empty.getvalue()))
    with pytest.raises(WireError, match="does not cross"):
        wire.encode(("step", (evil,)))


def test_only_the_clusters_secret_signs() -> None:
    good = Wire(STEP_WIRE_TYPES, b"secret").encode(("step", step_args()))
    for other in (Wire(STEP_WIRE_TYPES, b"other"), Wire(STEP_WIRE_TYPES)):
        with pytest.raises(WireError, match="signature"):
            other.decode(good)
    tampered = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(WireError, match="signature"):
        Wire(STEP_WIRE_TYPES, b"secret").decode(tampered)


def test_a_coordination_address_others_reach_needs_the_secret(monkeypatch) -> None:
    with pytest.raises(ValueError, match="RADIXJAX_DIST_SECRET"):
        DistConfig(2, 1, "10.1.2.3:1234")
    with pytest.raises(ValueError, match="RADIXJAX_DIST_SECRET"):
        DistConfig(2, 0, "rank0.example:1234")
    for loopback in ("127.0.0.1:1234", "localhost:1234", "[::1]:1234"):
        DistConfig(2, 0, loopback)
    DistConfig(2, 0, "10.1.2.3:1234", secret=b"s")
    seen = {}
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: seen.update(kw))
    multihost.init_distributed(DistConfig(2, 0, "10.1.2.3:1234", secret=b"s"))
    assert seen["coordinator_bind_address"] == "10.1.2.3:1234"  # not every interface


class FakeStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def key_value_set_bytes(self, key: str, value: bytes) -> None:
        assert key not in self.data, f"{key} written twice"
        self.data[key] = value

    def key_value_delete(self, key: str) -> None:
        self.data.pop(key)

    def blocking_key_value_get_bytes(self, key: str, timeout_ms: int) -> bytes:
        return self.data[key]


def test_publishing_from_two_threads_numbers_every_call_once(monkeypatch) -> None:
    store = FakeStore()
    monkeypatch.setattr(multihost, "_client", lambda: store)
    wire = Wire(STEP_WIRE_TYPES, b"s")
    sender, reader = CallChannel(wire), CallChannel(wire)

    def publish() -> None:
        for _ in range(50):
            sender.publish("reset_state", ())

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = 100 - multihost.KEEP  # the older ones deleted
    assert sorted(store.data) == sorted(multihost.KEY.format(n) for n in range(first, 100))
    reader._next = first
    assert reader.receive() == ("reset_state", ())
    store.data[multihost.KEY.format(100)] = pickle.dumps(("step", ()))
    reader._next = 100
    with pytest.raises(MultiHostError, match="refused"):
        reader.receive()
