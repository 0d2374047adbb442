"""ModelRunner: owns the params, the device KV pool and req_to_token table, and runs one
jitted, donated step per batch. Steps are dispatched asynchronously: `step` returns
device arrays at once. With a `Layout` the params and pool are sharded over its mesh
and every step input is replicated on it (one controller: the host side is the same for
any layout)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from radixjax.model import cpu_decode
from radixjax.model.attention import TABLE_ALIGN, AttentionMetadata, BatchShape, pool_dtype
from radixjax.model.backends import get_backend, resolve_backend_name
from radixjax.model.config import ModelConfig
from radixjax.model.forms import QUANTIZATIONS
from radixjax.model.layer_stack import stack_layers
from radixjax.model.llama import (
    KVPool,
    forward,
    forward_hidden,
    init_kv_pool,
    last_token_rows,
    lm_head,
)
from radixjax.model.params import Params
from radixjax.model.quant import quantize_params
from radixjax.parallel.rules import Layout
from radixjax.parallel.shard_params import kv_sharding, shard_params, sharded_config
from radixjax.runtime.batch import (
    DUMMY_SLOT,
    Buckets,
    HostBatch,
    PromptScores,
    RequestSlice,
    TokenSource,
    build_batch,
)
from radixjax.runtime.host_memory import release_free_memory
from radixjax.runtime.packed_inputs import Packing, pack, unpack
from radixjax.runtime.penalties import (
    apply_logit_bias,
    apply_penalties,
    count_sampled,
    gather_counts,
)
from radixjax.runtime.prompt_logprobs import (
    PromptLogprobs,
    no_prompt_logprobs,
    prompt_logprobs,
)
from radixjax.runtime.step_programs import StepPrograms
from radixjax.sampling.bitmask import apply_token_bitmask, bitmask_width
from radixjax.sampling.params import SamplingArrays
from radixjax.sampling.sampler import SampleOutput, StepFlags, sample

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class RunnerConfig:
    num_slots: int = 16384  # KV pool rows, including the dummy slot 0
    max_batch_tokens: int = 2048  # largest T bucket (chunked prefill keeps steps under it)
    max_running: int = 64  # largest B; request rows 0 .. max_running-1, then a spare row
    max_context: int = 4096  # the longest request
    attention_backend: str = "auto"  # "native" | "pallas" | "auto" (pallas on a GPU)
    page_size: int = 1  # the allocator's page size, or 1 (valid for any allocation)
    kv_dtype: str = "float32"  # or "bfloat16" (the native backend keeps its bits)
    mla_absorb: bool = True  # MLA decode in the latent space; False: expanded (reference)
    # "w8a8_int8": int8 layer matrices and activations (model/quant.py); "w8a16_int8":
    # the activations as two int8 parts; "none": as loaded
    quantization: str = "none"
    # W8A8's products through oneDNN's int8 matmul (model/onednn.py); None: where it is
    # built and the backend is the CPU, False: XLA's int8 forms
    onednn: bool | None = None
    # deterministic inference: each token's attention in an order set by its request's
    # positions alone, so its numbers do not depend on the batch (native backend;
    # model/native_attention.py deterministic_attention)
    deterministic: bool = False
    # decode attention through the CPU handler (model/cpu_decode.py); None: where it is
    # built, on the native backend of one CPU device (no mesh), for heads it computes
    cpu_decode: bool | None = None
    # DP attention ranks (engine/dp_attention.py): each rank has num_slots pool slots and
    # max_running + 1 table rows of its own, and a step is one chunk of a bucket per rank
    dp_ranks: int = 1
    # XLA compiler options of every program, as (name, value) pairs: JAX's per-jit
    # `compiler_options` (e.g. ("xla_backend_optimization_level", 0) compiles ~45 %
    # faster and runs far slower: the test suite's tiny models). (): XLA's defaults.
    xla_options: tuple[tuple[str, Any], ...] = ()
    # the sliding-window layers' own pool (cache/window_kv.py), in slots including the
    # dummy page; 0: every layer keeps every position's KV in the one pool
    window_slots: int = 0

    def __post_init__(self) -> None:
        if self.kv_dtype not in DTYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
        if self.num_slots < 2:
            raise ValueError("num_slots must be >= 2 (slot 0 is the padding dummy)")
        if self.page_size < 1 or self.num_slots % self.page_size:
            raise ValueError("num_slots must be a positive multiple of page_size")
        if self.window_slots and (self.window_slots % self.page_size or self.dp_ranks != 1):
            raise ValueError("window_slots: a multiple of page_size, without DP attention")
        resolve_backend_name(self.attention_backend)

    @property
    def pool_slots(self) -> int:
        """Slots of the device pool per layer: num_slots for each DP rank."""
        return self.num_slots * self.dp_ranks

    @property
    def buckets(self) -> Buckets:
        return Buckets.default(self.max_batch_tokens, self.max_running, self.dp_ranks)

    @property
    def num_rows(self) -> int:
        """Rows of the device tables (req_to_token, token buffer, counts): one per running
        request and the spare row that padding points at (per DP rank)."""
        return (self.max_running + 1) * self.dp_ranks

    @property
    def table_width(self) -> int:
        """req_to_token columns: the context (page-rounded), a multiple of TABLE_ALIGN."""
        need = self.max_context + self.page_size
        return -(-need // TABLE_ALIGN) * TABLE_ALIGN


@dataclass(frozen=True)
class StepOptions:
    """What some request of a step needs. Runtime values inside the one program of the
    step's shape (each behind a lax.cond), never a separate program."""

    do_sample: bool = False  # some row samples (False: every row greedy, skip the sort)
    return_logprobs: bool = False  # logprobs and the top MAX_TOP_LOGPROBS of every row
    use_penalties: bool = False  # some request has frequency/presence penalties
    use_grammar: bool = False  # some row samples under a grammar: apply the token bitmask
    prompt_logprobs: bool = False  # some token scores the prompt token after it
    use_logit_bias: bool = False  # some request has a logit_bias

    def flags(self) -> StepFlags:
        return StepFlags(*(np.bool_(v) for v in (self.do_sample, self.return_logprobs,
                                                 self.use_penalties, self.use_grammar,
                                                 self.prompt_logprobs, self.use_logit_bias)))


class StepOutput(NamedTuple):
    sample: SampleOutput  # [B] rows: the sampled tokens (and their logprobs)
    prompt: PromptLogprobs  # [T] rows: prompt logprobs (zeros unless the flag is set)

    @property
    def tokens(self) -> jax.Array:
        return self.sample.tokens


# What a step's call carries between hosts (parallel/wire.py builds only these)
STEP_WIRE_TYPES = (HostBatch, AttentionMetadata, BatchShape, TokenSource, PromptScores,
                   SamplingArrays, StepOptions)


def _step(
    params: Params, kv: KVPool, table: Tables, last_tokens: jax.Array, counts: jax.Array,
    input_ids: jax.Array, src: TokenSource, scores: PromptScores, md: AttentionMetadata,
    sp: SamplingArrays, token_mask: jax.Array, flags: StepFlags, *,
    cfg: ModelConfig, backend: str, page_size: int, layout: Layout | None, mla_absorb: bool,
    deterministic: bool, cpu_decode: bool, window_slots: int,
) -> tuple[StepOutput, KVPool, Tables, jax.Array, jax.Array]:
    """token_mask: [B, ceil(V / 32)] int32 grammar bitmask (all ones: unconstrained)."""
    table, md = _write_table(table, src, md)
    input_ids = jnp.where(src.use_last, last_tokens[src.token_row], input_ids)
    hidden, kv = forward_hidden(
        params, kv, input_ids, md, cfg=cfg,
        backend=get_backend(backend, page_size, deterministic, cpu_decode, cfg.attn_soft_cap),
        layout=layout,
        mla_absorb=mla_absorb,
        window_slots=window_slots,
    )  # [T, D]
    # the sampling rows: each request's last token, or a verify step's chosen tokens
    at = jnp.where(src.sample_at >= 0, src.sample_at, last_token_rows(md))  # [B]
    logits = lm_head(params, hidden[at], cfg, layout)  # [B, V]
    # the position each sampled token takes (its key): plain rows md.kv_len
    sample_pos = jnp.where(src.sample_at >= 0, md.positions[at] + 1, md.kv_len)
    prompt = lax.cond(
        flags.prompt_logprobs,
        lambda h: prompt_logprobs(params, h, scores.next_ids, scores.mask, cfg=cfg,
                                  layout=layout),
        lambda h: no_prompt_logprobs(h.shape[0]), hidden)

    def penalize(logits: jax.Array, counts: jax.Array) -> tuple[jax.Array, jax.Array]:
        rows = gather_counts(counts, input_ids, src, md)
        return apply_penalties(logits, rows, sp), counts.at[src.req_row].set(rows)

    logits, counts = lax.cond(flags.use_penalties, penalize, lambda lg, c: (lg, c),
                              logits, counts)
    logits = lax.cond(flags.use_logit_bias, apply_logit_bias, lambda lg, _: lg, logits, sp)
    masked = lax.cond(flags.use_grammar, apply_token_bitmask, lambda lg, _: lg,
                      logits, token_mask)
    # Logprobs describe the model's distribution before the grammar mask (finite).
    out = sample(masked, logits, sp, sample_pos, flags.do_sample, flags.return_logprobs)
    counts = count_sampled(counts, out.tokens, src)
    return (StepOutput(out, prompt), kv, table, last_tokens.at[src.req_row].set(out.tokens),
            counts)


def _packed_step(
    params: Params, kv: KVPool, table: Tables, last_tokens: jax.Array, counts: jax.Array,
    ints: jax.Array, floats: jax.Array, token_mask: jax.Array, *, packing: Packing,
    **statics: Any,
) -> tuple[StepOutput, KVPool, Tables, jax.Array, jax.Array]:
    """_step with its host inputs (ids, sources, scores, metadata, sampling, flags) in the
    two buffers of runtime/packed_inputs.py."""
    input_ids, src, scores, md, sp, flags = unpack((ints, floats), packing)
    return _step(params, kv, table, last_tokens, counts, input_ids, src, scores, md, sp,
                 token_mask, flags, **statics)


class Tables(NamedTuple):
    """The step's device tables (donated, replaced by each step)."""

    req_to_token: jax.Array  # [R, C] int32: each request row's slot per position
    # [S] int32, full slot -> window-pool slot (RunnerConfig.window_slots; else [1]): each
    # step writes its new tokens' entries (cache/window_kv.py keeps the host's)
    window_of: jax.Array


def _write_table(table: Tables, src: TokenSource,
                 md: AttentionMetadata) -> tuple[Tables, AttentionMetadata]:
    """The new tokens' slots into their rows of req_to_token (padding: the spare row),
    and their window slots into window_of (padding: the dummy's own entry)."""
    req_to_token = table.req_to_token.at[src.token_row, md.positions].set(md.out_slots)
    window_of = table.window_of
    if md.window_out_slots is not None:
        window_of = window_of.at[md.out_slots].set(md.window_out_slots)
    return Tables(req_to_token, window_of), md._replace(req_to_token=req_to_token,
                                                        window_of=window_of)


def _sync_row(table: Tables, row: jax.Array, slots: jax.Array) -> Tables:
    """req_to_token [R, C], row [] int32, slots [C] int32 -> that row replaced."""
    return table._replace(req_to_token=lax.dynamic_update_slice(
        table.req_to_token, slots[None, :], (row, 0)))


def _all_logits(
    params: Params, kv: KVPool, table: Tables, input_ids: jax.Array, src: TokenSource,
    md: AttentionMetadata, *, cfg: ModelConfig, backend: str, page_size: int,
    layout: Layout | None, mla_absorb: bool, deterministic: bool, cpu_decode: bool,
    window_slots: int,
) -> tuple[jax.Array, KVPool, Tables]:
    table, md = _write_table(table, src, md)
    logits, kv = forward(
        params, kv, input_ids, md, cfg=cfg,
        backend=get_backend(backend, page_size, deterministic, cpu_decode, cfg.attn_soft_cap),
        all_logits=True,
        layout=layout, mla_absorb=mla_absorb, window_slots=window_slots,
    )
    return logits, kv, table


@cache
def _jitted(cfg: ModelConfig, backend: str, page_size: int, layout: Layout | None,
            pool_sharding: jax.sharding.Sharding | None, mla_absorb: bool = True,
            xla_options: tuple[tuple[str, Any], ...] = (), deterministic: bool = False,
            cpu_decode: bool = False, window_slots: int = 0) -> tuple:
    """(step, all_logits, sync_row) jitted for these statics. Memoized: runners with equal
    statics share the jitted functions, so JAX's in-memory caches (trace, lowering,
    executable) serve a second runner in this process without tracing or loading again
    (an engine restarted in a notebook, the test suite's many engines)."""
    statics = dict(cfg=cfg, backend=backend, page_size=page_size, layout=layout,
                   mla_absorb=mla_absorb, deterministic=deterministic, cpu_decode=cpu_decode,
                   window_slots=window_slots)
    # Sharded: pin where the state comes back (as it went in), or XLA may return, say,
    # the counts split like the vocab-sharded logits and the next step's program would
    # refuse them.
    step_out, logits_out = {}, {}
    if layout is not None:
        rep = layout.replicated
        tables = Tables(rep, rep)
        step_out = dict(out_shardings=(rep, pool_sharding, tables, rep, rep))
        logits_out = dict(out_shardings=(rep, pool_sharding, tables))
    options = dict(compiler_options=dict(xla_options) or None)
    step = jax.jit(partial(_packed_step, **statics), **step_out, **options,
                   static_argnames="packing",
                   donate_argnames=("kv", "table", "last_tokens", "counts"))
    logits = jax.jit(partial(_all_logits, **statics), **logits_out, **options,
                     donate_argnames=("kv", "table"))
    return step, logits, jax.jit(_sync_row, donate_argnames="table", **options)


def clear_compiled_programs() -> None:
    """Forget the memoized step functions and JAX's in-memory compiles: each program's
    code and memory mappings go once no runner holds it (a process that builds many
    runners, as the test suite does, would otherwise reach the kernel's limit on memory
    mappings: XLA's JIT maps every program's sections). A runner still alive keeps
    its programs."""
    _jitted.cache_clear()
    jax.clear_caches()


def _resolve_cpu_decode(asked: bool | None, cfg: ModelConfig, backend: str,
                        layout: Layout | None) -> bool:
    """Whether decode attention runs in the CPU handler (RunnerConfig.cpu_decode): where
    it is built, on the native backend of one CPU device, for the model's heads (not MLA's
    latent pool); asked True where it cannot: ValueError."""
    possible = (backend == "native" and layout is None and cfg.mla is None
                and cfg.attn_soft_cap is None  # (the handler has no logit cap)
                and cpu_decode.supports(cfg.head_dim, cfg.head_dim))
    if asked is False or (asked is None and not possible):
        return False
    if not possible:
        raise ValueError("cpu_decode runs on the native backend of one device, for head "
                         f"dims {cpu_decode.HEAD_DIMS} (not MLA, no logit soft cap)")
    available = cpu_decode.available()
    if asked and not available:
        raise ValueError("cpu_decode: the handler is not built (python -m "
                         "radixjax.model.cpu_decode --build) or the backend is not the CPU")
    return available


class ModelRunner:
    """Mutates only its device state (`kv`, `req_to_token`, the token buffer, the penalty
    counts), each replaced by the donated step's output.

    One compiled program per token bucket (`buckets.shapes`): sampling, logprobs,
    penalties and the grammar mask are runtime flags, and attention reads each request's
    keys up to its own length, so nothing else is in a program's shape.

    layout: shard over its mesh (params are resharded unless already in place); None: one
    device. `self.cfg` stays the model's config; the sharded forward runs `run_cfg`
    (KV heads repeated up to the TP size when there are fewer, parallel/shard_params.py)."""

    def __init__(self, cfg: ModelConfig, params: Params, config: RunnerConfig,
                 layout: Layout | None = None, device: jax.Device | None = None) -> None:
        """device: with no layout, the one device to run on (a data-parallel replica's);
        None: JAX's default device."""
        self.cfg = cfg
        self.layout = layout
        self.run_cfg = cfg if layout is None else sharded_config(cfg, layout)
        if config.quantization != "none" and layout is not None:
            raise ValueError("weight quantization runs on one device only (no mesh)")
        # the products' row counts: every step's tokens (layers) and requests (the head)
        rows = {n for s in config.buckets.shapes for n in (s.num_tokens, s.num_reqs)}
        params = quantize_params(params, config.quantization, config.onednn,
                                 rows=tuple(sorted(rows)))
        if layout is not None:
            params = shard_params(cfg, params, layout)
            inputs = layout.replicated  # where step inputs go
            pool_sharding = kv_sharding(layout, self.run_cfg, config.pool_slots)
        elif device is not None:
            inputs = pool_sharding = jax.sharding.SingleDeviceSharding(device)
            params = jax.device_put(params, inputs)
        else:
            inputs = pool_sharding = None
        self.params = stack_layers(cfg, params)  # per layer group, for the forward's scan
        self.config = config
        self.buckets = config.buckets
        self._inputs, self._pool_sharding = inputs, pool_sharding
        self.attention_backend = resolve_backend_name(config.attention_backend)
        # (a bf16 pool on the native backend: its uint16 bits, model/attention.py)
        self.pool_dtype = pool_dtype(DTYPES[config.kv_dtype], self.attention_backend)
        self.cpu_decode = _resolve_cpu_decode(config.cpu_decode, cfg, self.attention_backend,
                                              layout)
        self.reset_state()
        self._step, self._logits, self._sync = _jitted(
            self.run_cfg, self.attention_backend, config.page_size, layout, pool_sharding,
            config.mla_absorb, config.xla_options, config.deterministic, self.cpu_decode,
            config.window_slots)
        self._no_mask: dict[int, jax.Array] = {}  # all-ones grammar mask per B, on device
        self.programs = StepPrograms(self._step, self._example_args)

    def reset_state(self) -> None:
        """Fresh device state: an all-zero KV pool, req_to_token table, token buffer and
        penalty counts (start-up, and recovery after a failed step, which may have
        consumed its donated buffers)."""
        config = self.config
        self.kv: KVPool = init_kv_pool(self.run_cfg, config.pool_slots,
                                       self.pool_dtype, self._pool_sharding,
                                       config.window_slots)
        rows = config.num_rows
        # req_to_token on the device ([rows, table_width] int32): each step writes its new
        # tokens' slots; a row is uploaded whole only when a batch says so (row_syncs).
        self.tables = Tables(
            jnp.zeros((rows, config.table_width), jnp.int32, device=self._inputs),
            jnp.zeros(config.pool_slots if config.window_slots else 1, jnp.int32,
                      device=self._inputs))
        # The future map: last sampled token per request row ([rows] int32).
        self.last_tokens = jnp.zeros(rows, jnp.int32, device=self._inputs)
        # Output-token counts per request row, for penalties ([rows, V] int32).
        self.token_counts = jnp.zeros((rows, self.cfg.vocab_size), jnp.int32,
                                      device=self._inputs)

    # -- the step programs ----------------------------------------------------------------

    def _example_args(self, shape: BatchShape) -> tuple[tuple, Packing]:
        batch = self._window_padding(_padding_batch(shape, self.config.max_running))
        return self._args(batch, SamplingArrays.build([], [], shape.num_reqs),
                          StepOptions(), None)

    def _args(self, batch: HostBatch, sp: SamplingArrays, opts: StepOptions,
              token_mask: np.ndarray | None) -> tuple[tuple, Packing]:
        """(the step program's arguments, the static packing of its host inputs)."""
        scores = batch.scores or PromptScores.none(batch.shape.num_tokens)
        packing, buffers = pack((batch.input_ids, batch.src, scores, batch.md, sp,
                                 opts.flags()))
        if self.layout is not None:  # on one device the program takes numpy arrays as they
            buffers = self._put(buffers)  # are (~0.3 ms a step less than device_put)
        return (self.params, self.kv, self.tables, self.last_tokens, self.token_counts,
                *buffers, self._mask_for(batch, token_mask)), packing

    def _put(self, tree: Any) -> Any:
        """Host arrays -> step inputs (replicated on the mesh). Over several processes
        (multi-host) each one places its own shards: jax.device_put would first check
        that every process passed equal values, a collective per array."""
        if self._inputs is None or self._inputs.is_fully_addressable:
            return jax.device_put(tree, self._inputs)
        return jax.tree.map(lambda x: jax.make_array_from_callback(
            np.shape(x), self._inputs, lambda idx: np.asarray(x)[idx]), tree)

    @property
    def num_programs(self) -> int:
        """Step programs compiled or loaded so far."""
        return len(self.programs)

    @property
    def num_late_compiles(self) -> int:
        """Step programs compiled after warm-up: each one is a bucket bug."""
        return self.programs.num_late_compiles

    @property
    def is_warm(self) -> bool:
        return self.programs.is_warm

    def dispatches_at_once(self, shape: BatchShape) -> bool:
        """Whether step() on this shape returns at once (its program is compiled): the
        scheduler then calls it on its loop instead of a worker thread."""
        return self.programs.has(shape)

    def _sync_rows(self, batch: HostBatch) -> None:
        width = self.config.table_width
        for row, slots in batch.row_syncs:
            if slots.size > width:
                raise ValueError(f"a request of {slots.size} positions exceeds the table")
            padded = np.zeros(width, np.int32)
            padded[: slots.size] = slots
            self.tables = self._sync(self.tables, *self._put((np.int32(row), padded)))

    def _mask_for(self, batch: HostBatch, token_mask: np.ndarray | None) -> jax.Array:
        b = batch.shape.num_reqs
        width = bitmask_width(self.cfg.vocab_size)
        if token_mask is None:
            if b not in self._no_mask:
                self._no_mask[b] = self._put(np.full((b, width), -1, np.int32))
            return self._no_mask[b]
        if token_mask.shape != (b, width):
            raise ValueError(f"token_mask shape {token_mask.shape} does not fit the batch")
        return self._put(token_mask)

    def step(self, batch: HostBatch, sp: SamplingArrays, opts: StepOptions,
             token_mask: np.ndarray | None = None) -> StepOutput:
        """Dispatch one step; returns device arrays without waiting for them.
        token_mask: [B, ceil(V / 32)] int32 grammar bitmask, required iff opts.use_grammar.
        The output's logprob fields are meaningful only when opts.return_logprobs, its
        prompt logprobs only when opts.prompt_logprobs (batch.scores says where)."""
        if opts.use_grammar != (token_mask is not None):
            raise ValueError("a token_mask goes with opts.use_grammar, and only with it")
        if opts.prompt_logprobs != (batch.scores is not None and bool(batch.scores.mask.any())):
            raise ValueError("opts.prompt_logprobs goes with batch.scores, and only with it")
        if int(batch.md.kv_len.max()) > self.config.max_context:
            raise ValueError(f"a request exceeds max_context {self.config.max_context}")
        if bool(self.config.window_slots) != (batch.md.window_out_slots is not None):
            raise ValueError("a runner with a window pool takes window_out_slots, and only it")
        self._sync_rows(batch)
        args, packing = self._args(batch, sp, opts, token_mask)
        program = self.programs.get(batch.shape, packing)
        out, self.kv, self.tables, self.last_tokens, self.token_counts = program(*args)
        return out

    def _window_padding(self, batch: HostBatch) -> HostBatch:
        """A batch that writes nothing real (warm-up, timing) on a runner with a window
        pool: its tokens' window slots, the dummy."""
        if not self.config.window_slots or batch.md.window_out_slots is not None:
            return batch
        dummy = np.full(batch.shape.num_tokens, DUMMY_SLOT, np.int32)
        return batch._replace(md=batch.md._replace(window_out_slots=dummy))

    def time_buckets(self, max_tokens: int, context: int = 512,
                     repeats: int = 7) -> dict[int, float]:
        """Median seconds of a step of each warm token bucket up to max_tokens, one
        request over `context` keys (speculative decoding's cost table,
        engine/speculative.py StepCosts). The buckets take turns, one step each per
        round: this VM's speed drifts between seconds, so timing one bucket after the
        other once made a 4-token step look as cheap as a 1-token one (1.01x; it costs
        1.2-1.8x)."""
        batches = {t: self._window_padding(_timing_batch(
            t, min(context, self.config.max_context - t), self.buckets))
            for t in self.buckets.tokens if t <= max_tokens}
        seconds: dict[int, list[float]] = {t: [] for t in batches}
        for _ in range(repeats):
            for t, batch in batches.items():
                sp = SamplingArrays.build([], [], batch.shape.num_reqs)
                start = time.perf_counter()
                self.step(batch, sp, StepOptions()).tokens.block_until_ready()
                seconds[t].append(time.perf_counter() - start)
                batches[t] = batch._replace(row_syncs=())
        return {t: float(np.median(s)) for t, s in seconds.items()}

    def all_logits(self, batch: HostBatch) -> np.ndarray:
        """[real tokens, V] logits of every new token (tests and prompt logprobs)."""
        self._sync_rows(batch)
        ids, src, md = self._put((batch.input_ids, batch.src, batch.md))
        logits, self.kv, self.tables = self._logits(
            self.params, self.kv, self.tables, ids, src, md)
        num_real = int(batch.md.q_len.sum())
        return np.asarray(logits[:num_real])

    def warmup(self, shapes: Iterable[BatchShape] | None = None, progress: bool = True) -> None:
        """Compile (or load from JAX's persistent cache) the step program of every shape
        (default: every bucket, the whole set a scheduler can emit)."""
        shapes = self.buckets.shapes if shapes is None else list(shapes)
        self.programs.warm(shapes, progress)
        spare = self.config.max_running  # the tiny row-sync program, on the spare row
        self._sync_rows(_padding_batch(self.buckets.shapes[0], spare)._replace(
            row_syncs=((spare, np.zeros(1, np.int32)),)))
        release_free_memory()  # the compiles' temporaries (~0.8 GB for SmolLM2)
        log.info("%d step programs ready", self.num_programs)


def _timing_batch(num_tokens: int, context: int, buckets: Buckets) -> HostBatch:
    """One request of num_tokens new tokens after `context` others, every slot the
    dummy (row 0 of req_to_token: requests upload their rows when admitted)."""
    return build_batch([RequestSlice(np.zeros(num_tokens, np.int32),
                                     np.zeros(context + num_tokens, np.int32), row=0)],
                       buckets)


def _padding_batch(shape: BatchShape, spare_row: int) -> HostBatch:
    t, b = shape.num_tokens, shape.num_reqs
    z = partial(np.zeros, dtype=np.int32)
    rows = np.full(b, spare_row, np.int32)
    md = AttentionMetadata(
        positions=z(t), out_slots=np.full(t, DUMMY_SLOT, np.int32), token_req=z(t),
        q_start=z(b), q_len=z(b), kv_len=z(b), req_row=rows, req_to_token=None,
        shared_len=z(b),
    )
    src = TokenSource(np.zeros(t, bool), np.full(t, spare_row, np.int32), rows,
                      np.zeros(t, bool), np.zeros(b, bool), np.zeros(b, bool),
                      np.full(b, -1, np.int32))
    return HostBatch(z(t), md, shape, 0, src)
