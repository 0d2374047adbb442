"""One rank of the cross-process collectives check (tests/parallel/test_multihost.py):

    python -m tests.parallel.multihost_checks COORDINATOR_PORT RANK

Two processes, one CPU device each, on jax.distributed (gloo). Each collective (psum,
all_gather, psum_scatter, all_to_all) runs several times in shard_map over the 2-device
mesh and is compared with numpy; prints `RESULT {"name": wrong results}`.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ITERATIONS = 10
# name -> (elements per rank, dtype): the model's activations (T = 512 x D = 576) and
# jax issue 40830's failing size (psum_scatter, 4 MiB float64 result chunks).
CASES = {"activations": (512 * 576, np.float32), "4MiB_f64": (2 * 524288, np.float64)}


def check(mesh: Mesh, rank: int, n: int, dtype: type) -> dict[str, int]:
    per_rank = [np.random.default_rng(r).standard_normal(n).astype(dtype) for r in (0, 1)]
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), per_rank[rank])
    total = per_rank[0] + per_rank[1]
    ops = {  # name -> (op on one shard, out spec, what this rank should hold)
        "psum": (lambda a: jax.lax.psum(a, "x"), P(), total),
        "all_gather": (lambda a: jax.lax.all_gather(a, "x", tiled=True), P(),
                       np.concatenate(per_rank)),
        "psum_scatter": (lambda a: jax.lax.psum_scatter(a, "x", tiled=True), P("x"),
                         np.split(total, 2)[rank]),
        "all_to_all": (lambda a: jax.lax.all_to_all(a, "x", 0, 0, tiled=True), P("x"),
                       np.concatenate([np.split(p, 2)[rank] for p in per_rank])),
    }
    wrong = {}
    for name, (op, out_spec, want) in ops.items():
        f = jax.jit(jax.shard_map(op, mesh=mesh, in_specs=P("x"), out_specs=out_spec,
                                  check_vma=False))
        wrong[name] = sum(
            not np.allclose(np.asarray(f(x).addressable_data(0)), want, rtol=1e-6)
            for _ in range(ITERATIONS))
    return wrong


def main() -> None:
    port, rank = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                               initialization_timeout=60)
    jax.config.update("jax_enable_x64", True)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    wrong = {f"{case}/{name}": bad for case, (n, dtype) in CASES.items()
             for name, bad in check(mesh, rank, n, dtype).items()}
    print("RESULT " + json.dumps(wrong), flush=True)


if __name__ == "__main__":
    main()
