"""Decode attention through the CPU handler (model/cpu_decode.py) against numpy's softmax
attention: f32 and bf16 pools, 1 and 3 query heads per KV head, head dims 64 and 128,
windows, several 256-key chunks, rows with no decode token; a row's bits alone and in a
batch; inside the layer scan (layer_base); and the runner's choice of it."""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixjax.model import cpu_decode
from radixjax.model.attention import AttentionMetadata, pool_dtype, to_pool
from radixjax.model.native_attention import native_attention
from tests.model.test_native_attention import decode_case, numpy_decode

BF16 = pool_dtype(jnp.bfloat16, "native")


def test_built_on_this_machine() -> None:
    """scripts/setup.sh builds the handler: on an x86-64 Linux CPU backend decode takes it
    (a missing build would silently cost a third of a long-context step)."""
    assert platform.machine() == "x86_64" and jax.default_backend() == "cpu"
    assert cpu_decode.available(), \
        f"{cpu_decode.LIBRARY} missing: python -m radixjax.model.cpu_decode --build"


def _run(q, k, v, table, kv_lens, dtype, window, req_row=None):
    dim = q.shape[-1]
    req_row = np.arange(len(kv_lens)) if req_row is None else req_row
    return np.asarray(cpu_decode.decode_attention(
        jnp.asarray(q * dim**-0.5), *(to_pool(jnp.asarray(x), dtype) for x in (k, v)),
        jnp.asarray(table), jnp.asarray(req_row, jnp.int32),
        jnp.asarray(kv_lens, jnp.int32), 0, window))


@pytest.mark.parametrize("dtype", [jnp.float32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_kv_heads,group,dim", [(3, 3, 64), (2, 1, 128)])
@pytest.mark.parametrize("window", [None, 7, 300])
def test_matches_numpy(dtype, num_kv_heads: int, group: int, dim: int,
                       window: int | None) -> None:
    kv_lens = [1, 17, 256, 300, 1000, 0]  # one key, a part chunk, chunk edges, none
    q, k, v, table, rows = decode_case(dim + group, kv_lens, num_kv_heads, group, dim,
                                       dtype == BF16, 4000)
    out = _run(q, k, v, table, kv_lens, dtype, window)
    for i, r in enumerate(rows):
        if len(r):
            np.testing.assert_allclose(out[i], numpy_decode(q[i], k, v, r, window),
                                       rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(out[-1], 0)  # kv_len 0: no decode token


def test_a_row_is_the_same_bits_in_any_batch() -> None:
    """Each (request, KV head) is computed alone: its bits do not depend on the batch,
    its place in it, or how the items fell to the threads."""
    kv_lens = [700, 5, 1000, 260, 3]
    q, k, v, table, _ = decode_case(1, kv_lens, 3, 3, 64, True, 4000)
    batch = _run(q, k, v, table, kv_lens, BF16, None)
    for i in range(len(kv_lens)):
        alone = _run(q[i:i + 1], k, v, table, kv_lens[i:i + 1], BF16, None, req_row=[i])
        np.testing.assert_array_equal(alone[0], batch[i])
    order = [3, 0, 4, 2, 1]
    shuffled = _run(q[order], k, v, table, [kv_lens[i] for i in order], BF16, None,
                    req_row=order)
    np.testing.assert_array_equal(shuffled, batch[order])


def test_native_attention_reads_each_layer_of_the_pool() -> None:
    """Inside a stacked pool ([L * S] rows, md.layer_base = l * S) through
    native_attention: the step's new keys written first, then read with the rest; the
    same as the XLA decode form (within f32 rounding) for every layer."""
    layers, slots, kv_lens = 3, 1200, [900, 40]
    q, k, v, table, rows = decode_case(2, kv_lens, 3, 3, 64, False, slots)
    k, v = (np.concatenate([x * (layer + 1) for layer in range(layers)]) for x in (k, v))
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))  # noqa: E731
    for layer in range(layers):
        md = AttentionMetadata(
            positions=i32([n - 1 for n in kv_lens]), out_slots=i32([r[-1] for r in rows]),
            token_req=i32([0, 1]), q_start=i32([0, 1]), q_len=i32([1, 1]),
            kv_len=i32(kv_lens), req_row=i32([0, 1]), req_to_token=jnp.asarray(table),
            layer_base=i32(layer * slots))
        last = [layer * slots + r[-1] for r in rows]
        args = (jnp.asarray(q), jnp.asarray(k[last]), jnp.asarray(v[last]), jnp.asarray(k),
                jnp.asarray(v), md, None, 64**-0.5)
        kernel, _, _ = native_attention(*args, kernel=True)
        xla, _, _ = native_attention(*args)
        np.testing.assert_allclose(np.asarray(kernel), np.asarray(xla), rtol=2e-5, atol=2e-5)
        for i, r in enumerate(rows):
            ref = numpy_decode(q[i], k, v, layer * slots + r, None)
            np.testing.assert_allclose(np.asarray(kernel[i]), ref, rtol=2e-5, atol=2e-5)


def test_the_runner_takes_it_where_it_can(smollm2) -> None:
    from radixjax.runtime.model_runner import ModelRunner, RunnerConfig, _resolve_cpu_decode

    def runner(**kw) -> ModelRunner:
        return ModelRunner(smollm2.cfg, smollm2.params, RunnerConfig(
            num_slots=64, max_batch_tokens=16, max_running=2, max_context=32, **kw))

    assert runner().cpu_decode  # built, one CPU device, head dim 64
    assert not runner(cpu_decode=False).cpu_decode
    assert not cpu_decode.supports(80, 80) and not cpu_decode.supports(64, 128)
    for backend, layout in [("pallas", None), ("native", object())]:  # asked where it can't
        assert not _resolve_cpu_decode(None, smollm2.cfg, backend, layout)
        with pytest.raises(ValueError, match="native backend of one device"):
            _resolve_cpu_decode(True, smollm2.cfg, backend, layout)
