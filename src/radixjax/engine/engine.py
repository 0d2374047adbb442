"""The public offline API: `Engine(model=...)` with `generate(...)` (sync, batched) and
`generate_stream(...)` (async). The scheduler coroutine runs on a private event loop in
a background thread; every scheduler call is marshalled onto that loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from radixjax.cache.manager import KVCacheManager
from radixjax.engine.config import (
    EngineConfig,
    EngineConfigError,
    serving_form,
    window_pool_slots,
)
from radixjax.engine.dp_attention import DPAttentionScheduler
from radixjax.engine.draft_model import DraftModel
from radixjax.engine.errors import EngineError, RequestError
from radixjax.engine.handoff import KVHandoff, MakeHandoff
from radixjax.engine.inputs import Prompt, batch_inputs, final_output
from radixjax.engine.load_form import in_blocks
from radixjax.engine.memory import FALLBACK_CONTEXT, FALLBACK_POOL, available_bytes, sized
from radixjax.engine.output import GenerateOutput, StreamChunk
from radixjax.engine.request import Req
from radixjax.engine.scheduler import Scheduler
from radixjax.engine.snapshot import MAX_NODES, scheduler_snapshot
from radixjax.engine.speculative import StepCosts
from radixjax.grammar.backend import GrammarBackend, GrammarError
from radixjax.loaders import load_model
from radixjax.model.config import ModelConfig
from radixjax.model.gguf_blocks import holds_blocks
from radixjax.model.llama import kv_pool_bytes
from radixjax.model.params import Params
from radixjax.parallel.multihost import (
    BroadcastRunner,
    CallChannel,
    DistConfig,
    RankWatch,
    follow,
    init_distributed,
    shutdown_distributed,
    wait_followers_left,
    wait_for_ranks,
)
from radixjax.parallel.rules import layout_for
from radixjax.parallel.shard_params import placer_for
from radixjax.parallel.wire import Wire
from radixjax.runtime.compile_cache import enable_persistent_cache
from radixjax.runtime.model_runner import STEP_WIRE_TYPES, ModelRunner, RunnerConfig
from radixjax.sampling.params import SamplingParams

T = TypeVar("T")


def runner_config_for(c: EngineConfig, dp_ranks: int = 1, mla: bool = False,
                      window: int | None = None, gguf: bool = False) -> RunnerConfig:
    """The runner an engine config needs: token buckets up to the largest step the
    scheduler can emit (`max_step_tokens`), so the warm-up covers every step; its
    numeric form resolved on JAX's default backend for the model (serving_form; mla:
    an MLA model; gguf: its matrices are in their GGUF blocks); the sliding-window
    layers' own pool for a model whose widest window is `window` (window_pool_slots)."""
    if c.enable_deterministic_inference and mla:
        raise EngineConfigError("deterministic inference has no form for MLA attention yet "
                                "(model/mla.py); leave it unset for an MLA model")
    form = serving_form(c, jax.default_backend(), mla, gguf)
    if c.num_slots is None or c.max_context is None:  # no model to size them for
        c = replace(c, num_slots=c.num_slots or FALLBACK_POOL,
                    max_context=c.max_context or FALLBACK_CONTEXT)
    return RunnerConfig(
        num_slots=c.num_slots, max_batch_tokens=c.max_step_tokens, max_running=c.max_running,
        max_context=c.max_context, attention_backend=c.attention_backend,
        page_size=c.page_size, kv_dtype=form.kv_dtype, dp_ranks=dp_ranks,
        quantization=form.quantization, xla_options=c.xla_options,
        deterministic=form.deterministic, window_slots=window_pool_slots(c, window, mla),
    )


class Engine:
    """Serves one model with the radix cache and the overlap scheduler.

    model: an HF folder or GGUF path, or None for the default SmolLM2. Or pass a model
    already in memory: `params` (the pytree) + `model_config` (+ `tokenizer`), e.g. just
    trained in a notebook; nothing is exported or reloaded.
    """

    def __new__(cls, *args: Any, dp: int = 1, **kwargs: Any) -> Any:
        """Engine(dp=N), N > 1: a DataParallelEngine of N replicas (engine/data_parallel.py)
        with the same interface."""
        if dp != 1 and cls is Engine:
            from radixjax.engine.data_parallel import DataParallelEngine

            return DataParallelEngine(*args, dp=dp, replica=Engine, **kwargs)
        return super().__new__(cls)

    def __init__(self, model: str | Path | None = None, *, params: Params | None = None,
                 model_config: ModelConfig | None = None, tokenizer: Any = None,
                 warmup: bool = True, background: bool = True, dp: int = 1,
                 devices: Sequence[jax.Device] | None = None,
                 dist: DistConfig | None = None, kv_handoff: MakeHandoff | None = None,
                 draft_params: Params | None = None,
                 draft_model_config: ModelConfig | None = None,
                 **engine_options: Any) -> None:
        """warmup=True compiles (or loads from the persistent cache) every step program
        now, with a progress bar, so no request ever waits for a compile; False compiles
        each on first use. background=True runs the scheduler on a private loop in a
        thread (scripts, notebooks). background=False leaves it to the caller: `await
        start()` inside the loop that should run it (the HTTP server shares uvicorn's loop
        this way). devices: the devices this engine runs on (default: every visible
        one; a data-parallel replica gets its slice). dist: this process's place in a
        multi-host cluster (jax.distributed, initialized first): rank 0 serves, every
        other rank calls `follow()` (parallel/multihost.py). kv_handoff: builds this
        engine's side of prefill-decode disaggregation (engine/handoff.py; the server
        passes disagg.sides.make_side), needed with a disaggregation_mode.
        draft_params + draft_model_config: speculative_algorithm "standalone"'s draft
        model in memory (else speculative_draft_model_path is loaded)."""
        if dp != 1:
            raise ValueError("dp > 1 is a DataParallelEngine: construct Engine(dp=...)")
        self.dist = dist or DistConfig()
        if self.dist.is_multihost and not jax.distributed.is_initialized():
            init_distributed(self.dist)  # before anything touches a device
        self.config = EngineConfig(**engine_options)
        if self.config.seed is None:  # unseeded requests differ from one start to the next
            self.config = replace(self.config, seed=secrets.randbits(31))
        self._rid_prefix = f"req-{secrets.token_hex(4)}"  # distinct across engines (DP)
        # One mesh per engine (None: one device); scheduler and radix tree stay one.
        self.layout = layout_for(self.config.tp, self.config.ep, devices,
                                 self.config.moe_dispatch, self.config.enable_dp_attention)
        if self.config.enable_dp_attention and self.dist.is_multihost:
            raise ValueError("DP attention over several hosts is not supported")
        dp_ranks = self.layout.mesh.size if self.config.enable_dp_attention else 1
        device = None  # JAX's default device (programs shared with any plain engine)
        if devices is not None and self.layout is None and devices[0] != jax.devices()[0]:
            device = devices[0]
        if params is not None:
            if model_config is None:
                raise ValueError("an in-memory model needs model_config as well as params")
            self.model_config, self.tokenizer = model_config, tokenizer
        else:
            placer = placer_for(self.layout) if self.layout is not None else None
            loaded = load_model(model, dtype=self.config.dtype, placer_for=placer,
                                gguf_blocks=in_blocks(self.config, model))
            params, self.model_config, self.tokenizer = loaded.params, loaded.cfg, loaded.tokenizer
        mla, gguf = self.model_config.mla is not None, holds_blocks(params)
        kv_dtype = serving_form(self.config, jax.default_backend(), mla, gguf).kv_dtype
        per_token = dp_ranks * kv_pool_bytes(self.model_config, 1, jnp.dtype(kv_dtype))
        # every host of a cluster sizes the same pool: memory decides only on one host
        self.config = sized(self.config, self.model_config, per_token,
                            sys.maxsize if self.dist.is_multihost else available_bytes())
        enable_persistent_cache()
        self.runner = ModelRunner(self.model_config, params,
                                  runner_config_for(self.config, dp_ranks, mla,
                                                    self.model_config.max_window, gguf),
                                  self.layout, device)
        if warmup:
            self.runner.warmup()
        self.disagg: KVHandoff | None = (kv_handoff(self.config, self.runner, warmup)
                                         if kv_handoff is not None else None)
        if self.disagg is None and self.config.disaggregation_mode != "null":
            raise ValueError("a disaggregation_mode needs its KV handoff: Engine(kv_handoff="
                             "radixjax.disagg.sides.make_side, ...)")
        if self.dist.is_multihost:  # every rank compiles its own programs: wait for all
            wait_for_ranks("ready", self.dist.init_timeout_s)
            if self.dist.is_leader:
                self.runner = BroadcastRunner(self.runner, self._channel())
        eos = tuple(self.model_config.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos = tuple(sorted(set(eos) | {self.tokenizer.eos_token_id}))
        self.eos_token_ids = eos
        self.scheduler: Scheduler | DPAttentionScheduler = (
            DPAttentionScheduler(dp_ranks, self.runner, self.config, eos, self.tokenizer)
            if dp_ranks > 1 else Scheduler(self.runner, self.config, eos, self.tokenizer,
                                           self._window_pool()))
        if self.config.speculative_algorithm == "standalone":
            self.scheduler.drafter = self._draft_model(draft_params, draft_model_config,
                                                       device, warmup)
        if self.config.speculative_algorithm and warmup and not self.dist.is_multihost:
            # what a step of each bucket costs here: where drafts pay (engine/speculative.py)
            drafter = self.scheduler.drafter
            self.scheduler.step_costs = StepCosts.relative(
                self.runner.time_buckets(self.config.max_running),
                drafter.runner.time_buckets(self.config.max_running) if drafter else None)
        self._grammar: GrammarBackend | None = None  # built on the first constrained request
        self._grammar_lock = threading.Lock()
        self._ids = itertools.count()
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._watch: RankWatch | None = None
        if background:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run_loop, name="radixjax-scheduler",
                                            daemon=True)
            self._thread.start()
            self._watch_ranks()

    def _watch_ranks(self) -> None:
        """Multi-host rank 0: a rank that dies fails every request held, and the engine
        refuses new ones (unhealthy: the server answers 503), never waits on it."""
        if isinstance(self.runner, BroadcastRunner):
            loop, scheduler = self._loop, self.scheduler
            self._watch = RankWatch(self.dist.nnodes, 1.0, lambda reason:
                                    loop.call_soon_threadsafe(scheduler.fail_for_good, reason))

    async def start(self) -> None:
        """Run the scheduler on the current event loop (background=False)."""
        if self._thread is not None or self._task is not None:
            raise RuntimeError("the scheduler is already running")
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self.scheduler.run_forever())
        self._watch_ranks()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._stop_followers()

    def follow(self, fail_at: int | None = None) -> None:
        """Multi-host, rank > 0: make rank 0's device calls until rank 0 stops; raises
        MultiHostError when rank 0 dies, or when a call fails on this rank alone.
        fail_at: test hook, the n-th call fails here."""
        if not self.dist.is_multihost or self.dist.is_leader:
            raise RuntimeError("follow() is for the ranks > 0 of a multi-host engine")
        follow(self.runner, self._channel(), self.dist.heartbeat_timeout_s, fail_at)
        shutdown_distributed()

    def _channel(self) -> CallChannel:
        return CallChannel(Wire(STEP_WIRE_TYPES, self.dist.secret))

    def _stop_followers(self) -> None:
        """Multi-host, rank 0: tell the other ranks to stop, then leave the cluster with
        them (final: a multi-host engine does not restart)."""
        if self._watch is not None:
            self._watch.stop()
        if getattr(self.scheduler, "lost", None) is not None:
            return  # a rank is gone: nobody to stop, no barrier to meet
        if isinstance(self.runner, BroadcastRunner) and jax.distributed.is_initialized():
            self.runner.stop_followers()
            wait_followers_left(self.dist.nnodes, self.dist.heartbeat_timeout_s)
            shutdown_distributed()

    # -- lifecycle --------------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(self.scheduler.run_forever())
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _call(self, fn: Callable[[], T]) -> T:
        """Run fn on the scheduler's loop and return its result."""
        if self._on_loop():
            return fn()

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def shutdown(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return

        async def stop() -> None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(timeout=10)
        self._stop_followers()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- requests ---------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this engine has no tokenizer: pass token ids")
            return list(self.tokenizer(prompt).input_ids)
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= self.model_config.vocab_size for t in ids):
            raise RequestError("token ids must be in [0, vocab_size)")
        return ids

    def _sampling(self, sp: SamplingParams | dict | None) -> SamplingParams:
        if sp is None:
            return SamplingParams()
        return sp if isinstance(sp, SamplingParams) else SamplingParams(**sp)

    async def _disaggregate(self, req: Req, bootstrap: Any) -> None:
        """Prefill engine: the request will export its prompt's KV to its room. Decode
        engine: fetch the KV and the first token from the prefill server now."""
        if self.disagg is None:
            raise RequestError("bootstrap fields need a --disaggregation-mode prefill or "
                               "decode server")
        if self.disagg.mode == "prefill":
            self.disagg.prepare(req, bootstrap)
            return

        async def land(r: Req, write: Callable[[Any], None]) -> None:
            async def run() -> None:  # on the scheduler's loop, between two steps
                await self.scheduler.between_steps(lambda: self.scheduler.land_prompt(r, write))

            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._loop))

        await self.disagg.receive(req, bootstrap, land)

    def _make_req(self, ids: list[int], sp: SamplingParams, index: int,
                  rid: str | None = None) -> Req:
        n = next(self._ids)
        seed = sp.seed + index if sp.seed is not None else (self.config.seed * 1_000_003 + n)
        return Req(rid=rid or f"{self._rid_prefix}-{n}", prompt_ids=ids, sampling=sp,
                   seed=seed % (2**31))

    def _attach_grammars(self, reqs: list[Req]) -> None:
        """Compile each constrained request's grammar (cached by key) and give it a fresh
        matcher. Blocks: call off the scheduler's loop. A grammar that does not compile
        is a RequestError with the compiler's message."""
        keys = {r.sampling.grammar for r in reqs} - {None}
        if not keys:
            return
        if self.tokenizer is None:
            raise RequestError("structured output needs the engine's tokenizer")
        with self._grammar_lock:
            if self._grammar is None:
                self._grammar = GrammarBackend(self.tokenizer, self.model_config.vocab_size,
                                               self.eos_token_ids)
        compiled = {}
        for key in keys:
            try:
                compiled[key] = self._grammar.compile(key)
            except GrammarError as e:
                raise RequestError(str(e)) from None
        for r in reqs:
            if r.sampling.grammar is not None:
                r.grammar = self._grammar.matcher(compiled[r.sampling.grammar])

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | dict | Sequence | None = None,
                 n: int = 1) -> GenerateOutput | list[GenerateOutput]:
        """Generate for one prompt (text or token ids) or a list of them, all submitted at
        once and batched by the scheduler; `sampling_params` is one for all or a list,
        one per prompt. `n` samples per prompt share its KV. Returns one output for a
        single prompt with n == 1, else a prompt-major list."""
        single, plist, per_prompt = batch_inputs(prompts, sampling_params, n)
        if self._on_loop():
            raise RuntimeError("generate() would block the scheduler's loop: use "
                               "generate_stream() / agenerate() there")
        sps = [self._sampling(s) for s in per_prompt]
        reqs = [self._make_req(self._tokenize(p), sp, i)
                for p, sp in zip(plist, sps, strict=True) for i in range(n)]
        self._attach_grammars(reqs)  # on the caller's thread: never on the loop
        futures = [concurrent.futures.Future() for _ in reqs]
        for req, fut in zip(reqs, futures, strict=True):
            req.on_chunk = self._on_chunk_for(fut)

        def submit() -> None:
            for req in reqs:  # all or nothing: validate first
                self.scheduler.validate(req)
            for req in reqs:
                self.scheduler.add_request(req)

        self._call(submit)
        outs = [f.result() for f in futures]
        return outs[0] if single and n == 1 else outs

    @staticmethod
    def _on_chunk_for(fut: concurrent.futures.Future) -> Callable:
        def on_chunk(chunk: StreamChunk) -> None:
            if chunk.finish_reason is None or fut.done():
                return
            if chunk.error is not None:
                fut.set_exception(EngineError(chunk.error))
            else:
                fut.set_result(chunk.output)
        return on_chunk

    async def agenerate(self, prompt: Prompt,
                        sampling_params: SamplingParams | dict | None = None,
                        index: int = 0) -> GenerateOutput:
        """One request, awaited on any loop."""
        return await final_output(self.generate_stream(prompt, sampling_params, index))

    async def generate_stream(self, prompt: Prompt,
                              sampling_params: SamplingParams | dict | None = None,
                              index: int = 0, rid: str | None = None,
                              bootstrap: Any = None,
                              ) -> AsyncIterator[StreamChunk]:
        """Stream one request's output as immutable chunks (engine/output.py): text
        deltas that never split a UTF-8 character or show part of a stop string, the new
        ids and their logprobs; the last chunk carries the GenerateOutput. Raises
        EngineError if the engine fails the request. Leaving the iteration early aborts
        the request and frees its KV. `index` offsets the seed (the i-th of n samples); `rid`
        names the request for `abort` (default: a fresh one). `bootstrap`: a disaggregated
        request's prefill server and room (disagg/): a prefill engine exports the prompt's
        KV there, a decode engine fetches it first."""
        caller = asyncio.get_running_loop()
        # One chunk per step of this request: bounded by its max_new_tokens, which the
        # scheduler clamps to the context.
        queue: asyncio.Queue[StreamChunk] = asyncio.Queue()
        req = self._make_req(self._tokenize(prompt), self._sampling(sampling_params), index,
                             rid)
        # The scheduler calls on_chunk on its loop: the caller's own (the HTTP server), or
        # the engine's thread (scripts), woken through call_soon_threadsafe.
        req.on_chunk = (queue.put_nowait if caller is self._loop else
                        lambda chunk: caller.call_soon_threadsafe(queue.put_nowait, chunk))
        if req.sampling.grammar is not None:
            await asyncio.to_thread(self._attach_grammars, [req])
        if bootstrap is not None:
            await self._disaggregate(req, bootstrap)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            _as_coro(lambda: (self.scheduler.validate(req), self.scheduler.add_request(req))),
            self._loop))
        finished = False
        try:
            while not finished:
                chunk = await queue.get()
                finished = chunk.finish_reason is not None
                if chunk.error is not None:
                    raise EngineError(chunk.error)
                yield chunk
        finally:
            if not finished:  # the caller left early: abort (an early abort is remembered)
                self._loop.call_soon_threadsafe(self.scheduler.abort, req)

    # -- introspection ----------------------------------------------------------------------

    def _draft_model(self, params: Params | None, cfg: ModelConfig | None,
                     device: jax.Device | None, warmup: bool) -> DraftModel:
        """The draft model's runner, on the target's runner config (slots, rows, buckets;
        engine/draft_model.py)."""
        if self.dist.is_multihost or self.layout is not None:
            raise EngineConfigError("a draft model runs on one device, one host (tp = 1)")
        if params is None:
            path = self.config.speculative_draft_model_path
            if path is None:
                raise EngineConfigError("speculative_algorithm standalone needs a draft "
                                        "model: speculative_draft_model_path")
            loaded = load_model(path, dtype=self.config.dtype, load_tokenizer=False)
            params, cfg = loaded.params, loaded.cfg
        if cfg is None:
            raise EngineConfigError("draft_params need draft_model_config")
        if cfg.vocab_size != self.model_config.vocab_size:
            raise EngineConfigError(f"the draft model's vocabulary ({cfg.vocab_size}) is "
                                    f"not the target's ({self.model_config.vocab_size})")
        runner = ModelRunner(cfg, params, runner_config_for(self.config, 1, cfg.mla is not None),
                             None, device)
        if warmup:
            runner.warmup()
        return DraftModel(runner)

    def snapshot(self, max_nodes: int = MAX_NODES) -> dict[str, Any]:
        """The engine's state as JSON-ready data, taken between two steps (what the
        server's /dashboard draws; engine/snapshot.py): the radix tree's max_nodes
        largest nodes, the running and waiting requests, the KV pool, the step programs
        and the stats; under DP attention a part per rank (`ranks`)."""
        def snap() -> dict[str, Any]:
            s = self.scheduler
            ranks = getattr(s, "ranks", None)
            parts = [scheduler_snapshot(r, self.tokenizer, max_nodes) for r in ranks or [s]]
            out: dict[str, Any] = parts[0] if ranks is None else dict(ranks=parts)
            c = self.config
            out.update(time=time.time(), stats=self.stats(),
                       programs=dict(compiled=self.runner.num_programs,
                                     late_compiles=self.runner.num_late_compiles,
                                     warm=self.runner.is_warm),
                       limits=dict(num_slots=c.num_slots, page_size=c.page_size,
                                   max_running=c.max_running, max_context=c.max_context))
            return out
        return self._call(snap)

    def _window_pool(self) -> tuple[int, int] | None:
        """(widest window, window pool slots) where the runner has a window pool."""
        slots = self.runner.config.window_slots
        return (self.model_config.max_window, slots) if slots else None

    def stats(self) -> dict[str, float]:
        def snap() -> dict[str, float]:
            s = self.scheduler
            used, usable, held = s.kv_usage()
            return s.stats.snapshot(num_running=len(s.running), num_waiting=len(s.waiting),
                                    kv_usage=used / usable, kv_held=held, kv_usable=usable,
                                    num_late_compiles=self.runner.num_late_compiles,
                                    num_failures=s.num_failures,
                                    num_step_programs=self.runner.num_programs,
                                    **_window_stats(getattr(s, "kvm", None)),
                                    **(self.disagg.stats() if self.disagg else {}))
        return self._call(snap)

    @property
    def healthy(self) -> bool:
        """False while the engine recovers from a failed step, or for good when it could
        not (then it refuses requests with EngineError)."""
        return self.scheduler.healthy

    def inject_fault(self) -> None:
        """Test hook: the next scheduler step raises (the server's /debug/inject_fault)."""
        self._call(self.scheduler.inject_fault)

    def check_integrity(self) -> None:
        """KV accounting holds (call when idle: then nothing may be held by requests)."""
        def check() -> None:
            self.scheduler.check_integrity()
            if not self.scheduler.has_work:
                assert self.scheduler.kv_usage()[2] == 0, "idle engine still holds KV slots"
        self._call(check)

    def cached_prefix_len(self, prompt: Prompt) -> int:
        """How many of the prompt's leading tokens this engine's radix cache holds (the
        DP router's cache-affinity signal); touches nothing."""
        ids = self._tokenize(prompt)
        return self._call(lambda: self.scheduler.cached_prefix_len(ids))

    def abort(self, rid: str) -> int:
        """Abort the waiting or running requests named `rid` (each then finishes with
        finish_reason "abort" and frees its KV); returns how many there were."""
        def abort() -> int:
            s = self.scheduler
            found = [r for r in [*s.waiting, *s.running] if r.rid == rid]
            for r in found:
                s.abort(r)
            return len(found)
        return self._call(abort)

    def flush_cache(self) -> bool:
        """Drop every cached prefix (only when idle); returns whether it flushed."""
        def flush() -> bool:
            if self.scheduler.has_work:
                return False
            self.scheduler.flush_cache()
            return True
        return self._call(flush)


def _window_stats(kvm: KVCacheManager | None) -> dict[str, float]:
    """The sliding-window layers' own pool (cache/window_kv.py), where there is one (not
    with DP attention: its scheduler has a manager per rank, never a window pool)."""
    window = kvm.window if kvm is not None else None
    if window is None:
        return {}
    usable = window.allocator.num_usable_slots
    return dict(window_kv_usage=window.num_used_slots() / usable,
                window_kv_reclaimed=window.num_reclaimed)


async def _as_coro(fn: Callable[[], Any]) -> Any:
    return fn()


def generate(prompts: Prompt | Sequence[Prompt], model: str | Path | None = None,
             n: int = 1, **sampling: Any) -> GenerateOutput | list[GenerateOutput]:
    """One-shot convenience for scripts: build an Engine, generate, shut it down. It
    compiles only the step programs this call uses (warmup=False); keep an `Engine` for
    repeated calls (it compiles every program once, up front, and keeps its cache)."""
    with Engine(model, warmup=False) as engine:
        return engine.generate(prompts, SamplingParams(**sampling), n=n)


__all__ = ["Engine", "GenerateOutput", "StreamChunk", "generate"]
