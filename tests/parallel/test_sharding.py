"""Sharded == single device on a real 8-device CPU mesh (run in a subprocess: the pytest
process's jax already initialised with one device). Checks: logits of TP 1/2/4/8 for the
dense families and TP x EP for the MoE families within 1e-5 relative; params and KV pool
really split as the rules say; engine greedy outputs equal across layouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401 - the tiny models are written with it (a test dependency)

from tests.tiny_models import EIGHT_CPU_DEVICES_XLA_FLAGS

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-5


def start_checks(part: str, out_dir: Path) -> subprocess.Popen:
    """The check subprocess for one part; its stdout and stderr go to files in out_dir."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=EIGHT_CPU_DEVICES_XLA_FLAGS)
    with open(out_dir / "stdout", "w") as out, open(out_dir / "stderr", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.parallel.sharded_checks", str(out_dir), part],
            cwd=ROOT, env=env, stdout=out, stderr=err, text=True)


def result_of(proc: subprocess.Popen, out_dir: Path) -> dict:
    try:
        proc.wait(timeout=900)
    finally:
        proc.kill()
    lines = [x for x in (out_dir / "stdout").read_text().splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (out_dir / "stderr").read_text()[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    """Both parts at once (two processes: compiling is single-threaded, the VM has 2
    cores)."""
    dirs = {part: tmp_path_factory.mktemp(part) for part in ("dense", "moe")}
    procs = {part: start_checks(part, d) for part, d in dirs.items()}
    return {part: result_of(procs[part], dirs[part]) for part in procs}


@pytest.fixture(scope="module")
def dense(checks) -> dict:
    return checks["dense"]


@pytest.fixture(scope="module")
def moe(checks) -> dict:
    return checks["moe"]


def test_dense_tp_logits_equal_single_device(dense) -> None:
    from tests.parallel.sharded_checks import DENSE

    errors = dense["errors"]
    assert len(errors) == sum(len(v) for v in DENSE.values()) == 7
    assert {int(k.split("tp=")[1].split()[0]) for k in errors} == {2, 4, 8}
    for name, err in errors.items():
        assert err < TOL, name


def test_pallas_backend_under_tp_and_refused_layouts(dense) -> None:
    assert dense["pallas"]["pallas tp=2"] < TOL
    refused = dense["pallas"]["refused"]
    assert "num_heads=4 is not divisible by tp=8" in refused["heads"]
    assert "needs an MoE model" in refused["dense ep"]


def test_moe_tp_ep_logits_equal_single_device(moe) -> None:
    """And MLA (DeepSeek) under TP, shared experts under TP x EP, EP by all-to-all."""
    errors = moe["errors"]
    assert set(errors) == {"qwen3_moe tp=4 ep=2", "qwen3_moe tp=8 ep=8", "mixtral tp=4 ep=4",
                           "deepseek_v3 tp=2 ep=1", "deepseek_v3 tp=4 ep=4 a2a",
                           "deepseek_v2 tp=4 ep=2 a2a",
                           "qwen2_moe tp=2 ep=2 a2a"}
    for name, err in errors.items():
        assert err < TOL, name


def test_params_and_kv_pool_are_sharded(moe) -> None:
    """[global shape, devices holding a shard, the distinct shard shapes]. Layer weights
    are stacked over the 2 layers (a leading axis never split), the dense matrices
    transposed ([n, out, in], model/dense_weights.py); the pool holds both layers' rows."""
    s = moe["shards"]
    # qwen2, tp = 4: 8 q heads x Dh 8, 2 KV heads repeated to 4, vocab 256, mlp 96.
    assert s["qwen2 wq"] == [[2, 64, 64], 4, [[2, 16, 64]]]
    assert s["qwen2 wk"] == [[2, 32, 64], 4, [[2, 8, 64]]]  # 4 (repeated) KV heads, one each
    assert s["qwen2 wo"] == [[2, 64, 64], 4, [[2, 64, 16]]]
    assert s["qwen2 w_gate"] == [[2, 96, 64], 4, [[2, 24, 64]]]
    assert s["qwen2 w_down"] == [[2, 64, 96], 4, [[2, 64, 24]]]
    assert s["qwen2 embed"] == [[256, 64], 4, [[64, 64]]]  # vocab-parallel
    assert s["qwen2 k_pool"] == [[128, 4, 8], 4, [[128, 1, 8]]]
    # mixtral, tp = 4, ep = 2: experts split in 2 groups, each expert's 32 columns in 2.
    assert s["mixtral we_gate"] == [[2, 8, 64, 32], 4, [[2, 4, 64, 16]]]
    assert s["mixtral we_down"] == [[2, 8, 32, 64], 4, [[2, 4, 16, 64]]]
    assert s["mixtral router"] == [[2, 64, 8], 4, [[2, 64, 8]]]  # replicated
    assert s["mixtral k_pool"] == [[128, 4, 8], 4, [[128, 1, 8]]]
    # deepseek_v3, tp = 4, ep = 4: 4 heads of (16 + 8) q dims and (16 + 16) kv dims split
    # one per device; the latent pool (32 + 8 per token) and wkv_a replicated; layer 1's
    # shared experts (2 x 32 columns) split like a dense MLP.
    assert s["deepseek_v3 wq_b"] == [[1, 96, 24], 4, [[1, 24, 24]]]
    assert s["deepseek_v3 wkv_b"] == [[1, 32, 128], 4, [[1, 32, 32]]]
    assert s["deepseek_v3 wo"] == [[1, 64, 64], 4, [[1, 64, 16]]]
    assert s["deepseek_v3 wkv_a"] == [[1, 40, 64], 4, [[1, 40, 64]]]
    assert s["deepseek_v3 k_pool"] == [[128, 1, 40], 4, [[128, 1, 40]]]
    assert s["deepseek_v3 we_gate"] == [[1, 8, 64, 32], 4, [[1, 2, 64, 32]]]
    assert s["deepseek_v3 ws_gate"] == [[1, 64, 64], 4, [[1, 16, 64]]]


def test_engine_outputs_equal_across_layouts(dense, moe) -> None:
    """Greedy, and seeded sampling (temperature, top-k, top-p), token for token: TP
    (Gemma 3's window layers with a KV pool of their own too), and EP by all-to-all
    under DP attention (DeepSeek-V3; resharded in memory, as qwen2's tp = 8), against
    one device. (EP by all-to-all without DP attention: the logits
    checks.)"""
    for result in (dense["engine"], dense["gemma3 engine"], moe["engine"]):
        outs = {k: v for k, v in result.items()
                if not k.endswith((" ranks", " pool", " window"))}
        ref = outs["tp=1 ep=1"]
        assert ref and all(len(o) > 0 for o in ref)
        for name, got in outs.items():
            assert got == ref, name
    assert "tp=8 ep=8 a2a dpa" in moe["engine"]
    assert dense["gemma3 engine"]["tp=2 ep=1 window"] > 0


def test_dp_attention_ranks_own_their_requests_and_pool_rows(dense, moe) -> None:
    """Under DP attention the requests spread over the ranks (each caching its own
    prefixes; with 3 prompts on 8 ranks some stay idle and run padding), and each device
    holds only its rank's rows of the pool (MLA: its latent rows; qwen2: both KV heads)."""
    deepseek = moe["engine"]
    cases = {"qwen2 tp=2": (dense["dp attention"]["ranks"], dense["dp attention"]["pool"])}
    name = "tp=8 ep=8 a2a dpa"
    cases[f"deepseek_v3 {name}"] = deepseek[f"{name} ranks"], deepseek[f"{name} pool"]
    for name, (ranks, (shape, shards)) in cases.items():
        assert sum(n > 0 for n in ranks) >= 2, (name, ranks)
        if len(ranks) == 8:
            assert 0 in ranks, (name, ranks)  # an idle rank, in step all along
        assert shards == [[shape[0] // len(ranks), *shape[1:]]], (name, shape, shards)


def test_dp_attention_retraction_and_recovery(dense) -> None:
    r = dense["dp attention"]
    assert r["retract"] and r["retractions"] > 0, r
    assert "injected fault" in r["fault"], r
    assert r["after_fault"] and r["healthy"], r
