"""Dense layer matrices stored (out, in) for the layer scan (model/dense_weights.py): the
product equals x @ w at every step size and dtype, stacking transposes exactly the
LINEAR_WEIGHTS (an int8 weight stays as quantized), and the small steps' compiled
programs read the stacked weights in place: no copy of a layer's weight slice."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.loaders import load_model
from radixjax.model import cpu
from radixjax.model.dense_weights import (
    LINEAR_WEIGHTS,
    ROWS_MAX,
    OutIn,
    out_in_linear,
    rows_max,
)
from radixjax.model.layer_stack import layer_groups, split_resident, stack_layers
from radixjax.model.quant import Int8Weight, PackedInt8Weight, fused, quantize_params
from tests.model.harness import tiny_runner


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("t", [1, 3, ROWS_MAX, ROWS_MAX + 1])
def test_out_in_product_equals_x_at_w(t: int, dtype) -> None:
    rng = np.random.default_rng(t)
    x = rng.standard_normal((t, 24)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    ref = x.astype(dtype).astype(np.float32) @ w.astype(dtype).astype(np.float32)
    for rows in (None, 1, ROWS_MAX):  # this CPU's rule; a GEMM past one row; past eight
        got = out_in_linear(jnp.asarray(x), OutIn(jnp.asarray(w.T, dtype)), rows)
        assert got.shape == (t, 40) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-4)


def test_stacking_transposes_the_dense_matrices_only(tiny_model_dir) -> None:
    """(MLA, MoE and their shared experts run the same stacking; their engine paths:
    tests/engine/test_equivalence.py.)"""
    m = load_model(tiny_model_dir("llama3"), load_tokenizer=False)
    stacked = stack_layers(m.cfg, m.params)["groups"]
    for g, group in zip(layer_groups(m.cfg), stacked, strict=True):
        for name, leaf in group.items():
            assert isinstance(leaf, OutIn if name in LINEAR_WEIGHTS else jax.Array), name
            got = np.asarray(leaf.wt if isinstance(leaf, OutIn) else leaf)
            want = np.stack([np.asarray(lp[name]) for lp in m.params["layers"][g.start:g.stop]])
            np.testing.assert_array_equal(got, want.swapaxes(-1, -2) if name in LINEAR_WEIGHTS
                                          else want)
    # int8: q, k, v and gate, up fused (dense_weights.FUSED_WEIGHTS)
    dense = LINEAR_WEIGHTS & set(fused(m.params["layers"][0]))
    assert {"wqkv", "w_gate_up", "wo", "w_down"} == dense
    int8 = stack_layers(m.cfg, quantize_params(m.params, "w8a8_int8", False))["groups"]
    assert all(isinstance(int8[0][k], Int8Weight) for k in dense)
    # packed for oneDNN (model/onednn.py): [n, parts, P] stacks the scan leaves whole
    packed = stack_layers(m.cfg, quantize_params(m.params, "w8a8_int8", True))["groups"][0]
    n = stacked[0]["wq"].wt.shape[0]
    assert all(isinstance(packed[k], PackedInt8Weight) and packed[k].packed.shape[0] == n
               and packed[k].packed.ndim == 3 for k in dense)
    scanned, resident = split_resident(packed)
    assert set(resident) == dense and all(scanned[k].packed is None for k in dense)


def weight_slice_copies(hlo: str, weight_shapes: set[tuple[int, ...]]) -> int:
    """Ops named for a dynamic slice whose output is shaped like one layer's weight."""
    outs = re.findall(r"%\S*dynamic-slice\S* = f32\[(\d+),(\d+)\]", hlo)
    return sum((int(a), int(b)) in weight_shapes for a, b in outs)


@pytest.mark.parametrize("amx", [False, True])
def test_small_steps_read_stacked_weights_in_place(amx: bool, tiny_model_dir,
                                                   monkeypatch) -> None:
    """T <= rows_max() (ROWS_MAX; one row on a CPU with AMX, model/cpu.py): no
    weight-slice copy in the program; the next bucket (a GEMM) still copies, which shows
    the check sees them."""
    monkeypatch.setattr(cpu, "has_amx", lambda: amx)
    rows = rows_max()
    assert rows == (1 if amx else ROWS_MAX)
    m = load_model(tiny_model_dir("llama3"), load_tokenizer=False)
    runner = tiny_runner(m.cfg, m.params, max_running=16)
    shapes = {w.wt.shape[-2:] for lp in runner.params["groups"] for w in lp.values()
              if isinstance(w, OutIn)}
    shapes |= {s[::-1] for s in shapes}
    programs = {s.num_tokens: s for s in runner.buckets.shapes}
    copies = {t: weight_slice_copies(runner.programs._lower(programs[t]).compile().as_text(),
                                     shapes)
              for t in (1, rows, 2 * rows)}
    assert copies[1] == copies[rows] == 0 and copies[2 * rows] > 0, copies
