"""ModelRunner: owns the params and the device KV pool, and runs one jitted, donated step
per batch. Steps are dispatched asynchronously: `step` returns device arrays at once.
With a `Layout` the params and pool are sharded over its mesh and every step input is
replicated on it (one controller: the host side is the same for any layout)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from radixjax.model.attention import (
    AttentionMetadata,
    BatchShape,
    get_backend,
    resolve_backend_name,
)
from radixjax.model.config import ModelConfig
from radixjax.model.llama import KVPool, forward, init_kv_pool
from radixjax.model.params import Params
from radixjax.parallel.rules import Layout
from radixjax.parallel.shard_params import kv_sharding, shard_params, sharded_config
from radixjax.runtime.batch import DUMMY_SLOT, Buckets, HostBatch, TokenSource
from radixjax.runtime.penalties import apply_penalties, gather_counts, store_counts
from radixjax.sampling.bitmask import apply_token_bitmask, bitmask_width
from radixjax.sampling.params import MAX_TOP_LOGPROBS, SamplingArrays
from radixjax.sampling.sampler import SampleOutput, sample

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class RunnerConfig:
    num_slots: int = 16384  # KV pool rows, including the dummy slot 0
    num_token_rows: int = 65  # device token buffer rows (>= max running requests + 1)
    max_batch_tokens: int = 2048  # largest T bucket (chunked prefill keeps steps under it)
    max_running: int = 64  # largest B bucket
    max_context: int = 4096  # largest K bucket; also the longest request
    attention_backend: str = "auto"  # "native" | "pallas" | "auto" (pallas on a GPU)
    page_size: int = 1  # the allocator's page size, or 1 (valid for any allocation)
    kv_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.kv_dtype not in DTYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(DTYPES)}")
        if self.num_slots < 2:
            raise ValueError("num_slots must be >= 2 (slot 0 is the padding dummy)")
        if self.page_size < 1 or self.num_slots % self.page_size:
            raise ValueError("num_slots must be a positive multiple of page_size")
        resolve_backend_name(self.attention_backend)

    @property
    def buckets(self) -> Buckets:
        return Buckets.default(self.max_batch_tokens, self.max_running, self.max_context)


@dataclass(frozen=True)
class StepOptions:
    """Static per-step choices; each distinct value is its own compiled program."""

    do_sample: bool = False  # False: every row greedy, skip the sort
    return_logprobs: bool = False
    num_top_logprobs: int = 0
    use_penalties: bool = False  # some request has frequency/presence penalties
    use_grammar: bool = False  # some row samples under a grammar: apply the token bitmask


class StepKey(NamedTuple):
    shape: BatchShape
    opts: StepOptions


def _step(
    params: Params, kv: KVPool, last_tokens: jax.Array, counts: jax.Array,
    input_ids: jax.Array, src: TokenSource, md: AttentionMetadata, sp: SamplingArrays,
    token_mask: jax.Array | None, *,
    cfg: ModelConfig, shape: BatchShape, backend: str, page_size: int, opts: StepOptions,
    layout: Layout | None,
) -> tuple[SampleOutput, KVPool, jax.Array, jax.Array]:
    """token_mask: [B, ceil(V / 32)] int32 grammar bitmask when opts.use_grammar."""
    input_ids = jnp.where(src.use_last, last_tokens[src.token_row], input_ids)
    logits, kv = forward(
        params, kv, input_ids, md, cfg=cfg, shape=shape,
        backend=get_backend(backend, page_size), layout=layout,
    )
    if opts.use_penalties:
        rows = gather_counts(counts, input_ids, src, md)
        logits = apply_penalties(logits, rows, sp)
    if opts.use_grammar:
        logits = apply_token_bitmask(logits, token_mask)
    out = sample(
        logits, sp, md.kv_len, do_sample=opts.do_sample,
        num_top_logprobs=opts.num_top_logprobs, return_logprobs=opts.return_logprobs,
    )
    if opts.use_penalties:
        counts = store_counts(counts, rows, out.tokens, src)
    return out, kv, last_tokens.at[src.req_row].set(out.tokens), counts


def _all_logits(
    params: Params, kv: KVPool, input_ids: jax.Array, md: AttentionMetadata, *,
    cfg: ModelConfig, shape: BatchShape, backend: str, page_size: int, layout: Layout | None,
) -> tuple[jax.Array, KVPool]:
    return forward(
        params, kv, input_ids, md, cfg=cfg, shape=shape,
        backend=get_backend(backend, page_size), all_logits=True, layout=layout,
    )


class ModelRunner:
    """Mutates only `self.kv` (replaced by each donated step's output).

    layout: shard over its mesh (params are resharded unless already in place); None: one
    device. `self.cfg` stays the model's config; the sharded forward runs `run_cfg`
    (KV heads repeated up to the TP size when there are fewer, parallel/shard_params.py)."""

    def __init__(self, cfg: ModelConfig, params: Params, config: RunnerConfig,
                 layout: Layout | None = None) -> None:
        self.cfg = cfg
        self.layout = layout
        self.run_cfg = cfg if layout is None else sharded_config(cfg, layout)
        self.params = params if layout is None else shard_params(cfg, params, layout)
        self.config = config
        self.buckets = config.buckets
        self._inputs = None if layout is None else layout.replicated  # where step inputs go
        pool_sharding = (None if layout is None
                         else kv_sharding(layout, self.run_cfg, config.num_slots))
        self.kv: KVPool = init_kv_pool(self.run_cfg, config.num_slots,
                                       DTYPES[config.kv_dtype], pool_sharding)
        # The future map: last sampled token per request row ([num_token_rows] int32).
        self.last_tokens = jnp.zeros(config.num_token_rows, jnp.int32, device=self._inputs)
        # Output-token counts per request row, for penalties ([rows, V] int32).
        self.token_counts = jnp.zeros((config.num_token_rows, cfg.vocab_size), jnp.int32,
                                      device=self._inputs)
        self.attention_backend = resolve_backend_name(config.attention_backend)
        statics = dict(cfg=self.run_cfg, backend=self.attention_backend,
                       page_size=config.page_size, layout=layout)
        self._step = jax.jit(
            partial(_step, **statics), static_argnames=("shape", "opts"),
            donate_argnames=("kv", "last_tokens", "counts"),
        )
        self._logits = jax.jit(
            partial(_all_logits, **statics), static_argnames="shape", donate_argnames="kv"
        )
        self._seen: set[StepKey] = set()
        self.is_warm = False
        self.num_late_compiles = 0  # compiles after warm-up: each one is a bucket bug

    def _note_compile(self, key: StepKey) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        if self.is_warm:
            self.num_late_compiles += 1
            log.warning("compiling a step after warm-up: %s", key)

    def step(self, batch: HostBatch, sp: SamplingArrays, opts: StepOptions,
             token_mask: np.ndarray | None = None) -> SampleOutput:
        """Dispatch one step; returns device arrays without waiting for them.
        token_mask: [B, ceil(V / 32)] int32 grammar bitmask, required iff opts.use_grammar."""
        if opts.num_top_logprobs > MAX_TOP_LOGPROBS:
            raise ValueError(f"num_top_logprobs must be <= {MAX_TOP_LOGPROBS}")
        if opts.use_grammar != (token_mask is not None):
            raise ValueError("a token_mask goes with opts.use_grammar, and only with it")
        if opts.use_grammar and token_mask.shape != (batch.shape.num_reqs,
                                                     bitmask_width(self.cfg.vocab_size)):
            raise ValueError(f"token_mask shape {token_mask.shape} does not fit the batch")
        self._note_compile(StepKey(batch.shape, opts))
        out, self.kv, self.last_tokens, self.token_counts = self._step(
            self.params, self.kv, self.last_tokens, self.token_counts,
            *jax.device_put((batch.input_ids, _source(batch), batch.md, sp, token_mask),
                            self._inputs),
            shape=batch.shape, opts=opts,
        )
        return out

    def all_logits(self, batch: HostBatch) -> np.ndarray:
        """[real tokens, V] logits of every new token (tests and prompt logprobs)."""
        ids, md = jax.device_put((batch.input_ids, batch.md), self._inputs)
        logits, self.kv = self._logits(self.params, self.kv, ids, md, shape=batch.shape)
        num_real = int(batch.md.q_len.sum())
        return np.asarray(logits[:num_real])

    def warmup(self, keys: Iterable[StepKey], progress: bool = True) -> None:
        """Compile (or load from the persistent cache) every given step shape, running
        each once on an all-padding batch that only touches the dummy slot."""
        keys = list(keys)
        for key in tqdm(keys, desc="compiling step buckets", disable=not progress):
            self._note_compile(key)
            batch = _padding_batch(key.shape, self.config.num_token_rows - 1)
            sp = SamplingArrays.build([], [], key.shape.num_reqs)
            mask = (np.full((key.shape.num_reqs, bitmask_width(self.cfg.vocab_size)), -1,
                            np.int32) if key.opts.use_grammar else None)
            jax.block_until_ready(self.step(batch, sp, key.opts, mask).tokens)
        self.is_warm = True

    def default_warmup_keys(self, max_decode_kv: int | None = None) -> list[StepKey]:
        """Greedy decode shapes (T = B) for every B and K bucket up to `max_decode_kv`,
        and single-request prefill shapes for every T bucket."""
        b = self.buckets
        kmax = max_decode_kv or b.kv[-1]
        keys = [
            StepKey(BatchShape(n, n, 1, k), StepOptions())
            for n in b.reqs for k in b.kv if k <= kmax and n in b.tokens
        ]
        for t in b.tokens:
            k = min(kv for kv in b.kv if kv >= t) if t <= b.kv[-1] else None
            if k is not None:
                keys.append(StepKey(BatchShape(t, 1, t, k), StepOptions()))
        return sorted(set(keys), key=lambda k: (k.shape.num_tokens, k.shape.max_kv))


def _source(batch: HostBatch) -> TokenSource:
    if batch.src is not None:
        return batch.src
    t, b = batch.shape.num_tokens, batch.shape.num_reqs
    return TokenSource(np.zeros(t, bool), np.zeros(t, np.int32), np.zeros(b, np.int32),
                       np.zeros(t, bool), np.zeros(b, bool), np.zeros(b, bool))


def _padding_batch(shape: BatchShape, spare_row: int) -> HostBatch:
    t, b = shape.num_tokens, shape.num_reqs
    z = partial(np.zeros, dtype=np.int32)
    md = AttentionMetadata(
        positions=z(t), out_slots=np.full(t, DUMMY_SLOT, np.int32), token_req=z(t),
        q_start=z(b), q_len=z(b), kv_len=z(b), kv_slots=z((b, shape.max_kv)),
    )
    src = TokenSource(np.zeros(t, bool), z(t), np.full(b, spare_row, np.int32),
                      np.zeros(t, bool), np.zeros(b, bool), np.zeros(b, bool))
    return HostBatch(z(t), md, shape, 0, src)
