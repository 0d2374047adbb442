"""Sharded-vs-single-device checks, run in a subprocess with 8 fake CPU devices
(`python -m tests.parallel.sharded_checks OUT_DIR PART`, see test_sharding.py): jax must
see the devices before it initialises, and the main pytest process has one.

Prints one JSON line: {"errors": {"family tp=.. ep=..": max rel err}, "shards": {...},
"engine": {"layout": token ids}}.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jax
import numpy as np

from radixjax.loaders import load_model
from radixjax.model.dense_weights import OutIn
from radixjax.parallel.mesh import MeshConfig, make_mesh
from radixjax.parallel.rules import Layout
from radixjax.parallel.shard_params import placer_for
from radixjax.runtime.batch import RequestSlice, build_batch
from tests.model.harness import ScatteredSlots, rel_err, tiny_runner
from tests.tiny_models import save_tiny_model

# family -> the (tp, ep) layouts checked: between them every TP size, KV heads split and
# repeated (mistral has 1, qwen2 2 of 8), experts replicated, split and one per device;
# each layout is a compile of its own, so not every family runs every layout.
DENSE = {"llama": ((2, 1),), "llama3": ((4, 1),), "mistral": ((2, 1), (8, 1)),
         "qwen2": ((4, 1),), "qwen3": ((2, 1),), "gemma3": ((2, 1),)}
MOE = {"qwen3_moe": ((4, 2), (8, 8)), "mixtral": ((4, 4),)}
# MLA (heads split, latent pool replicated) and shared experts; a third entry: the EP
# dispatch ("a2a": all-to-all, else psum)
MLA = {"deepseek_v3": ((2, 1), (4, 4, "a2a")),
       "deepseek_v2": ((4, 2, "a2a"),), "qwen2_moe": ((2, 2, "a2a"),)}


def layout(tp: int, ep: int = 1, dispatch: str = "psum") -> Layout:
    return Layout(make_mesh(MeshConfig(tp=tp, ep=ep)),
                  moe_dispatch="all_to_all" if dispatch == "a2a" else "psum")


def run_logits(cfg, params, lay: Layout | None, backend: str = "native") -> np.ndarray:
    """A ragged prefill of 3 prompts, then one mixed step: their 3 decodes beside a 4th
    prompt's prefill; all logits stacked. Both steps fill the same 32-token bucket, so
    each layout compiles one program."""
    runner = tiny_runner(cfg, params, num_slots=128, max_batch_tokens=32, max_context=32,
                         attention_backend=backend)
    if lay is not None:
        from radixjax.runtime.model_runner import ModelRunner
        runner = ModelRunner(cfg, params, runner.config, layout=lay)
    slots = ScatteredSlots(128, seed=1)
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(3, cfg.vocab_size, n)) for n in (5, 9, 3)]
    rows = [slots.take(len(s) + 1) for s in seqs]
    prefill = [RequestSlice(np.array(s, np.int32), r[: len(s)])
               for s, r in zip(seqs, rows, strict=True)]
    decode = [RequestSlice(np.array([t], np.int32), r)
              for r, t in zip(rows, rng.integers(3, cfg.vocab_size, len(seqs)), strict=True)]
    late = RequestSlice(rng.integers(3, cfg.vocab_size, 14).astype(np.int32), slots.take(14))
    batches = [build_batch(prefill, runner.buckets),
               build_batch([*decode, late], runner.buckets)]
    assert {b.shape.num_tokens for b in batches} == {32}
    return np.concatenate([runner.all_logits(b) for b in batches])


def check_logits(root: Path, layouts: dict[str, tuple]) -> dict[str, float]:
    errors = {}
    for fam, fam_layouts in layouts.items():
        folder = save_tiny_model(fam, root / fam)
        m = load_model(folder, load_tokenizer=False)
        ref = run_logits(m.cfg, m.params, None)
        for tp, ep, *dispatch in fam_layouts:
            lay = layout(tp, ep, *dispatch)
            sharded = load_model(folder, load_tokenizer=False, placer_for=placer_for(lay))
            key = f"{fam} tp={tp} ep={ep}" + "".join(f" {d}" for d in dispatch)
            errors[key] = rel_err(run_logits(m.cfg, sharded.params, lay), ref)
            print(key, errors[key], file=sys.stderr, flush=True)
    return errors


def pallas_and_errors(root: Path) -> dict:
    """The pallas backend (interpret mode) under TP 2, wrapped per KV-head shard by
    shard_map, against native single device; and the layouts that must be refused."""
    from radixjax.parallel.shard_params import ShardingError, sharded_config

    m = load_model(root / "llama3", load_tokenizer=False)
    out = {"pallas tp=2": rel_err(run_logits(m.cfg, m.params, layout(2), "pallas"),
                                  run_logits(m.cfg, m.params, None))}
    refused = {}
    llama = load_model(root / "llama", load_tokenizer=False).cfg  # 4 heads, dense
    for name, (cfg, tp, ep) in {"heads": (llama, 8, 1), "dense ep": (llama, 2, 2)}.items():
        try:
            sharded_config(cfg, layout(tp, ep))
            refused[name] = ""
        except ShardingError as e:
            refused[name] = str(e)
    out["refused"] = refused
    return out


def shard_shapes(root: Path) -> dict[str, list]:
    """Per-device shard shapes of a few leaves and the pool, for qwen2 at tp=4 (2 KV heads
    repeated to 4), mixtral at tp=4, ep=2 and deepseek_v3 (MLA) at tp=4, ep=4."""
    from radixjax.runtime.model_runner import ModelRunner, RunnerConfig

    out = {}
    for fam, tp, ep in (("qwen2", 4, 1), ("mixtral", 4, 2), ("deepseek_v3", 4, 4)):
        lay = layout(tp, ep)
        folder = root / fam if (root / fam).exists() else save_tiny_model(fam, root / fam)
        m = load_model(folder, load_tokenizer=False, placer_for=placer_for(lay))
        runner = ModelRunner(m.cfg, m.params, RunnerConfig(num_slots=64, max_context=32,
                                                           max_batch_tokens=32), lay)
        lp = runner.params["groups"][0]  # stacked: [layers, ...] per leaf
        leaves = {"embed": runner.params["embed"], "k_pool": runner.kv[0]}
        if fam == "deepseek_v3":
            lp = runner.params["groups"][1]  # layer 1: MoE
        leaves.update({n: lp[n] for n in ("wq", "wk", "wo", "w_gate", "w_down", "we_gate",
                                           "we_down", "router", "wq_b", "wkv_a", "wkv_b",
                                           "ws_gate") if n in lp})
        for name, x in leaves.items():
            x = x.wt if isinstance(x, OutIn) else x  # dense matrices: stacked [n, O, I]
            out[f"{fam} {name}"] = [list(x.shape), len({s.device for s in x.addressable_shards}),
                                    sorted({tuple(s.data.shape) for s in x.addressable_shards})]
    return out


def step_collectives(root: Path, fam: str, tp: int, ep: int, *dispatch: str) -> list[str]:
    """The collective ops XLA put in a sharded step program (its largest bucket). Multi-host
    runs them over gloo, where reduce-scatter can return wrong values (jax issue 40830):
    tests/parallel/test_multihost.py checks the kinds listed here across processes."""
    from radixjax.runtime.model_runner import ModelRunner, RunnerConfig

    folder = root / fam if (root / fam).exists() else save_tiny_model(fam, root / fam)
    lay = layout(tp, ep, *dispatch)
    m = load_model(folder, load_tokenizer=False, placer_for=placer_for(lay))
    runner = ModelRunner(m.cfg, m.params, RunnerConfig(num_slots=64, max_context=32,
                                                       max_batch_tokens=32), lay)
    hlo = runner.programs._lower(runner.buckets.shapes[-1]).compile().as_text()
    ops = "all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast"
    return sorted(set(re.findall(rf"\b({ops})(?:-start)?\(", hlo)))


def engine_outputs(root: Path, fam: str, layouts, in_memory: tuple[int, int]) -> dict:
    """Greedy and seeded-sampled token ids of 3 prompts (two share a prefix: a radix-cache
    hit) per layout; layouts load straight into shards from disk, `in_memory` reshards
    loaded params."""
    from radixjax import Engine, SamplingParams

    # warmup=False: only the programs these few steps use (what is compared here is the
    # output across layouts; the warm-up itself is tested single-device); float32 on
    # every layout (one device would default to w8a16_int8, several devices cannot)
    kw = dict(num_slots=256, max_running=4, max_context=64, max_prefill_tokens=32,
              chunk_size=16, warmup=False, quantization="none")
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    # seeded sampling too: the sampler's sort / top-k / top-p over vocab-split logits
    sampled = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=3,
                             ignore_eos=True)
    rng = np.random.default_rng(5)
    shared = list(rng.integers(3, 200, 12))
    prompts = [shared + list(rng.integers(3, 200, 5)), list(rng.integers(3, 200, 21)),
               shared + list(rng.integers(3, 200, 3))]
    folder = root / fam if (root / fam).exists() else save_tiny_model(fam, root / fam)
    out = {}
    for tp, ep, *dispatch in (*layouts, in_memory):
        # tags: "a2a" EP by all-to-all, "dpa" DP attention
        kw["moe_dispatch"] = "all_to_all" if "a2a" in dispatch else "psum"
        kw["enable_dp_attention"] = "dpa" in dispatch
        if (tp, ep, *dispatch) == in_memory:
            m = load_model(folder, load_tokenizer=False)
            engine = Engine(params=m.params, model_config=m.cfg, tp=tp, ep=ep, **kw)
        else:
            engine = Engine(folder, tp=tp, ep=ep, **kw)
        with engine as e:
            key = f"tp={tp} ep={ep}" + "".join(f" {d}" for d in dispatch)
            out[key] = [[int(t) for t in o.token_ids]
                        for p in (sp, sampled) for o in e.generate(prompts, p)]
            e.check_integrity()
            if e.runner.config.window_slots:  # the window layers' own pool
                out[key + " window"] = e.runner.config.window_slots
            if "dpa" in dispatch:  # tokens cached per DP rank; the pool split by rows
                out[key + " ranks"] = [s.kvm.tree.total_size() for s in e.scheduler.ranks]
                pool = e.runner.kv[0]
                out[key + " pool"] = [list(pool.shape), sorted(
                    {tuple(x.data.shape) for x in pool.addressable_shards})]
    return out


def dp_attention_paths(root: Path) -> dict:
    """DP attention (2 ranks, qwen2: its 2 KV heads unsplit) under pressure against one
    device: 8 concurrent greedy requests over 2 ranks of 4 rows each with a retraction
    every 2 decode steps; then a step that fails (fault hook) fails its requests, every
    rank recovers and serves the same outputs again. Also: tokens cached per rank, and
    the pool's shape and per-device shards."""
    from radixjax import Engine, SamplingParams
    from radixjax.engine.errors import EngineError

    kw = dict(num_slots=256, max_running=4, max_context=64, max_prefill_tokens=32,
              chunk_size=16, warmup=False, quantization="none")  # as with DP attention
    sp = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(7)
    shared = list(rng.integers(3, 200, 10))
    prompts = [list(rng.integers(3, 200, n)) for n in (3, 25, 9, 14)]
    prompts += [shared + list(rng.integers(3, 200, n)) for n in (2, 6, 11, 4)]
    folder = root / "qwen2" if (root / "qwen2").exists() else save_tiny_model("qwen2",
                                                                              root / "qwen2")
    with Engine(folder, **kw) as e:
        ref = [o.token_ids for o in e.generate(prompts, sp)]
    out: dict = {}
    with Engine(folder, tp=2, enable_dp_attention=True, retract_every=2, **kw) as e:
        out["retract"] = [o.token_ids for o in e.generate(prompts, sp)] == ref
        out["retractions"] = e.stats()["num_retractions"]
        e.check_integrity()
        out["ranks"] = [s.kvm.tree.total_size() for s in e.scheduler.ranks]
        pool = e.runner.kv[0]
        out["pool"] = [list(pool.shape), sorted({x.data.shape for x in pool.addressable_shards})]
        e.inject_fault()
        try:
            e.generate(prompts[:2], sp)
            out["fault"] = ""
        except EngineError as err:
            out["fault"] = str(err)
        out["after_fault"] = [o.token_ids for o in e.generate(prompts[:3], sp)] == ref[:3]
        out["healthy"] = e.healthy
        e.check_integrity()
    return out


def main() -> None:
    root, part = Path(sys.argv[1]), sys.argv[2]
    assert len(jax.devices()) == 8, jax.devices()
    result: dict = {}
    if part == "dense":
        result["errors"] = check_logits(root, DENSE)
        result["engine"] = engine_outputs(root, "qwen2", ((1, 1), (4, 1)), (8, 1))
        # sliding windows, their layers' own KV pool split by heads as the other's
        result["gemma3 engine"] = engine_outputs(root, "gemma3", ((1, 1),), (2, 1))
        result["pallas"] = pallas_and_errors(root)
        result["collectives"] = step_collectives(root, "llama", 2, 1)
        result["dp attention"] = dp_attention_paths(root)
    elif part == "moe":
        result["errors"] = check_logits(root, {**MOE, **MLA})
        result["shards"] = shard_shapes(root)
        result["collectives"] = step_collectives(root, "mixtral", 4, 2)
        result["a2a collectives"] = step_collectives(root, "deepseek_v3", 4, 4, "a2a")
        # MLA + shared experts + EP all-to-all through the engine (radix hit, chunks)
        result["engine"] = engine_outputs(root, "deepseek_v3", ((1, 1),), (8, 8, "a2a", "dpa"))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
