"""KV transfer engines on this machine: one request's KV (an ~815-token SmolLM2 prompt:
four pieces of [30 layers, 256 tokens, 3 KV heads, 64] f32, K and V: 47 MB) moved
between two processes on loopback, five times each.

    .venv/bin/python benchmarks/kv_transfer.py

  jax      jax.experimental.transfer (what disagg/kv_transfer.py uses): the decode side
           pulls the pieces as device arrays
  mooncake Mooncake's TransferEngine over TCP (SGLang's default), if importable: the
           prefill side writes a registered host buffer into the decode side's. Needs
           `apt-get install libibverbs1` and
           `uv pip install --no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPE = (30, 256, 3, 64)
PIECES = 4
NBYTES = PIECES * 2 * int(np.prod(SHAPE)) * 4
ROUNDS = 5


def jax_server() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import transfer

    dev = jax.devices()[0]
    server = transfer.start_transfer_server(dev.client, "127.0.0.1:0", ["127.0.0.1:0"])
    pieces = [(jnp.full(SHAPE, i, jnp.float32), jnp.full(SHAPE, -i, jnp.float32))
              for i in range(PIECES)]
    for r in range(ROUNDS):
        for i, piece in enumerate(pieces):
            server.await_pull(100 * r + i, piece)
    print(json.dumps({"address": server.address()}), flush=True)
    sys.stdin.readline()


def jax_client(info: dict) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental import transfer

    dev = jax.devices()[0]
    server = transfer.start_transfer_server(dev.client, "127.0.0.1:0", ["127.0.0.1:0"])
    conn = server.connect(info["address"])
    spec = jax.ShapeDtypeStruct(SHAPE, jnp.float32,
                                sharding=jax.sharding.SingleDeviceSharding(dev))
    times, out = [], None
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        out = jax.block_until_ready([conn.pull(100 * r + i, (spec, spec))
                                     for i in range(PIECES)])
        times.append(time.perf_counter() - t0)
    ok = all(float(out[i][1][0, 0, 0, 0]) == -i for i in range(PIECES))
    return {"ok": ok, "times": times}


def mooncake_engine():
    os.environ.setdefault("MC_FORCE_TCP", "1")
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("Mooncake did not initialize")
    return engine


def mooncake_server() -> None:
    engine = mooncake_engine()
    buf = np.zeros(NBYTES, np.uint8)
    assert engine.register_memory(buf.ctypes.data, NBYTES) == 0
    print(json.dumps({"session": f"127.0.0.1:{engine.get_rpc_port()}",
                      "addr": buf.ctypes.data}), flush=True)
    sys.stdin.readline()  # the client has written: report what arrived
    print(json.dumps({"checksum": int(buf[::4096].astype(np.int64).sum())}), flush=True)
    sys.stdin.readline()


def mooncake_client(info: dict) -> dict:
    engine = mooncake_engine()
    buf = np.random.default_rng(0).integers(0, 255, NBYTES, dtype=np.uint8)
    assert engine.register_memory(buf.ctypes.data, NBYTES) == 0
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        if engine.transfer_sync_write(info["session"], buf.ctypes.data, info["addr"],
                                      NBYTES) != 0:
            raise RuntimeError("Mooncake write failed")
        times.append(time.perf_counter() - t0)
    return {"times": times, "checksum": int(buf[::4096].astype(np.int64).sum())}


def run(engine: str) -> dict:
    me = [sys.executable, __file__]
    server = subprocess.Popen([*me, engine, "server"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        info = server.stdout.readline()
        client = subprocess.run([*me, engine, "client", info], capture_output=True,
                                text=True, timeout=300)
        result = json.loads(client.stdout.strip().splitlines()[-1])
        if engine == "mooncake":
            server.stdin.write("check\n")
            server.stdin.flush()
            result["ok"] = json.loads(server.stdout.readline())["checksum"] == result[
                "checksum"]
        return result
    finally:
        server.stdin.write("quit\n")
        server.stdin.flush()
        server.wait(timeout=30)


def main() -> None:
    if len(sys.argv) > 2:
        engine, role = sys.argv[1], sys.argv[2]
        if role == "server":
            (jax_server if engine == "jax" else mooncake_server)()
        else:
            info = json.loads(sys.argv[3])
            out = (jax_client if engine == "jax" else mooncake_client)(info)
            print(json.dumps(out), flush=True)
        return
    engines = ["jax"]
    try:
        import mooncake.engine  # noqa: F401
        engines.append("mooncake")
    except ImportError as e:
        print(f"mooncake: not importable here ({e}); see the docstring")
    print(f"{NBYTES / 1e6:.1f} MB per transfer, {ROUNDS} rounds, loopback")
    print(f"{'engine':10}{'best ms':>9}{'median ms':>11}{'MB/s (median)':>15}{'correct':>9}")
    for engine in engines:
        r = run(engine)
        t = sorted(r["times"])
        print(f"{engine:10}{1e3 * t[0]:9.1f}{1e3 * t[len(t) // 2]:11.1f}"
              f"{NBYTES / 1e6 / t[len(t) // 2]:15.0f}{str(r['ok']):>9}")


if __name__ == "__main__":
    main()
