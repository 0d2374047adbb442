"""Data parallelism: N engine replicas behind one front, as SGLang's DP controller.

Each replica is a whole Engine on its own slice of the devices (its own mesh or device,
step programs, scheduler and radix tree); the model is loaded once and placed on each
slice. A request goes to one replica, chosen by DPRouter (engine/dp_router.py): by cache
affinity (the prompt's longest prefix in each replica's tree, or in the prompts it is
serving right now, which its tree does not hold yet), balanced with load (the requests
each replica holds). n samples of a prompt go to one replica (they share its KV).

    devices, dp = 2, tp = 2:   replica 0: [d0 d1]   replica 1: [d2 d3]
    dp = 2, tp = 1, one device: both replicas on it (their own pools and trees)

The interface is Engine's (generate, agenerate, generate_stream, abort, stats, ...), so
the HTTP server and radixjax.lang serve a DataParallelEngine unchanged;
`Engine(dp=N)` builds one, handing itself over as `replica` (what each replica is).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from radixjax.engine.config import EngineConfig, EngineConfigError
from radixjax.engine.dp_router import DPRouter
from radixjax.engine.errors import RequestError
from radixjax.engine.inputs import Prompt, batch_inputs, final_output
from radixjax.engine.load_form import in_blocks
from radixjax.engine.output import GenerateOutput, StreamChunk
from radixjax.engine.snapshot import MAX_NODES
from radixjax.loaders import load_model
from radixjax.model.config import ModelConfig
from radixjax.model.params import Params
from radixjax.sampling.params import SamplingParams

# stats() keys that add up over replicas; the rest are per-replica gauges
_SUMMED = ("num_requests", "num_finished", "num_aborted", "num_prompt_tokens",
           "num_cached_tokens", "num_generated_tokens", "num_prefill_steps",
           "num_decode_steps", "num_computed_tokens", "num_retractions",
           "num_jump_forward_tokens", "num_running", "num_waiting", "kv_held",
           "num_late_compiles", "num_failures", "generated_tokens_per_s")


def device_slices(dp: int, per_replica: int,
                  devices: Sequence[jax.Device] | None = None) -> list[list[jax.Device]]:
    """dp disjoint slices of per_replica devices; with one device per replica and fewer
    devices than replicas, replicas share devices in turn (a CPU, one device)."""
    devices = list(devices if devices is not None else jax.devices())
    if dp * per_replica <= len(devices):
        return [devices[i * per_replica:(i + 1) * per_replica] for i in range(dp)]
    if per_replica == 1:
        return [[devices[i % len(devices)]] for i in range(dp)]
    raise EngineConfigError(f"dp={dp} x tp={per_replica} needs {dp * per_replica} devices, "
                            f"{len(devices)} visible")


class DataParallelEngine:
    def __init__(self, model: str | Path | None = None, *, dp: int,
                 replica: Callable[..., Any],
                 params: Params | None = None, model_config: ModelConfig | None = None,
                 tokenizer: Any = None, warmup: bool = True, background: bool = True,
                 dp_policy: str = "cache_aware", devices: Sequence[jax.Device] | None = None,
                 **engine_options: Any) -> None:
        if dp < 1:
            raise EngineConfigError("dp must be >= 1")
        config = EngineConfig(**engine_options)
        if config.tp == 0:
            raise EngineConfigError("with dp > 1 give tp explicitly (devices per replica)")
        self.router = DPRouter(dp_policy)
        slices = device_slices(dp, config.tp, devices)
        if params is None:
            loaded = load_model(model, dtype=config.dtype, gguf_blocks=in_blocks(config, model))
            params, model_config, tokenizer = loaded.params, loaded.cfg, loaded.tokenizer
        elif model_config is None:
            raise ValueError("an in-memory model needs model_config as well as params")
        # each replica its own seed: the given one + its index, or its own from the OS
        seeds = [None if config.seed is None else config.seed + k for k in range(dp)]
        self.replicas = [replica(params=params, model_config=model_config, tokenizer=tokenizer,
                                warmup=warmup, background=background, devices=s,
                                **{**engine_options, "seed": seed})
                         for s, seed in zip(slices, seeds, strict=True)]
        self.config = self.replicas[0].config
        self.model_config, self.tokenizer = model_config, tokenizer
        self.eos_token_ids = self.replicas[0].eos_token_ids
        self._lock = threading.Lock()
        # in flight on each replica: ticket -> (prompt ids, requests)
        self._serving: list[dict[int, tuple[np.ndarray, int]]] = [{} for _ in self.replicas]
        self._routed = [0] * dp  # requests sent to each replica, ever
        self._ids = itertools.count()

    # -- routing ----------------------------------------------------------------------------

    def _route(self, ids: list[int], n: int = 1) -> tuple[int, int]:
        """(replica, ticket): the ticket marks the prompt's n requests in flight on the
        replica until _done."""
        prompt = np.asarray(ids, np.int64)

        def cached() -> list[int]:
            hits = [r.cached_prefix_len(ids) for r in self.replicas]
            with self._lock:
                for k, serving in enumerate(self._serving):
                    for other, _ in serving.values():
                        hits[k] = max(hits[k], _common_len(prompt, other))
            return hits

        with self._lock:
            loads = [sum(c for _, c in s.values()) for s in self._serving]
        k = self.router.pick(loads, len(ids), cached)
        ticket = next(self._ids)
        with self._lock:
            self._serving[k][ticket] = (prompt, n)
            self._routed[k] += n
        return k, ticket

    def _done(self, k: int, ticket: int) -> None:
        with self._lock:
            self._serving[k].pop(ticket, None)

    # -- requests (Engine's interface) ------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> list[int]:
        return self.replicas[0]._tokenize(prompt)

    async def generate_stream(self, prompt: Prompt,
                              sampling_params: SamplingParams | dict | None = None,
                              index: int = 0, rid: str | None = None,
                              bootstrap: Any = None,
                              ) -> AsyncIterator[StreamChunk]:
        if bootstrap is not None:
            raise RequestError("disaggregation runs on single-engine servers (no --dp)")
        ids = self._tokenize(prompt)
        k, ticket = self._route(ids)
        try:
            async for chunk in self.replicas[k].generate_stream(ids, sampling_params, index,
                                                                rid):
                yield chunk
        finally:
            self._done(k, ticket)

    async def agenerate(self, prompt: Prompt,
                        sampling_params: SamplingParams | dict | None = None,
                        index: int = 0) -> GenerateOutput:
        return await final_output(self.generate_stream(prompt, sampling_params, index))

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | dict | Sequence | None = None,
                 n: int = 1) -> GenerateOutput | list[GenerateOutput]:
        """Engine.generate over the replicas: each prompt (with its n samples) is routed,
        each replica generates its share as one batch, outputs in input order."""
        single, plist, sps = batch_inputs(prompts, sampling_params, n)
        ids = [self._tokenize(p) for p in plist]
        routes = [self._route(p, n) for p in ids]
        shares: dict[int, list[int]] = {}
        for i, (k, _) in enumerate(routes):
            shares.setdefault(k, []).append(i)

        def run(k: int) -> list[GenerateOutput]:
            mine = shares[k]
            out = self.replicas[k].generate([ids[i] for i in mine], [sps[i] for i in mine],
                                            n=n)
            return out if isinstance(out, list) else [out]

        try:
            with ThreadPoolExecutor(len(shares)) as pool:
                done = dict(zip(shares, pool.map(run, shares), strict=True))
        finally:
            for k, ticket in routes:
                self._done(k, ticket)
        outs: list[GenerateOutput | None] = [None] * (len(plist) * n)
        for k, mine in shares.items():
            for j, i in enumerate(mine):
                outs[i * n:(i + 1) * n] = done[k][j * n:(j + 1) * n]
        return outs[0] if single and n == 1 else outs

    def abort(self, rid: str) -> int:
        return sum(r.abort(rid) for r in self.replicas)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        for r in self.replicas:
            await r.start()

    async def stop(self) -> None:
        for r in self.replicas:
            await r.stop()

    def shutdown(self) -> None:
        for r in self.replicas:
            r.shutdown()

    def __enter__(self) -> DataParallelEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- introspection ----------------------------------------------------------------------

    def snapshot(self, max_nodes: int = MAX_NODES) -> dict[str, Any]:
        """Each replica's Engine.snapshot (`replicas`), with the summed stats."""
        return dict(time=time.time(), stats=self.stats(),
                    replicas=[r.snapshot(max_nodes) for r in self.replicas])

    def stats(self) -> dict[str, Any]:
        """Summed counters, KV usage averaged, the hit rate over all replicas, and
        "replicas": each one's own stats plus how many requests were routed to it."""
        per = [r.stats() for r in self.replicas]
        out: dict[str, Any] = {k: sum(s[k] for s in per) for k in _SUMMED}
        out["kv_usage"] = sum(s["kv_usage"] for s in per) / len(per)
        out["num_step_programs"] = max(s["num_step_programs"] for s in per)
        prompt = out["num_prompt_tokens"]
        out["cache_hit_rate"] = out["num_cached_tokens"] / prompt if prompt else 0.0
        with self._lock:
            routed = list(self._routed)
        out["replicas"] = [dict(s, dp_rank=i, num_routed=routed[i]) for i, s in enumerate(per)]
        return out

    @property
    def healthy(self) -> bool:
        return all(r.healthy for r in self.replicas)

    def check_integrity(self) -> None:
        for r in self.replicas:
            r.check_integrity()

    def flush_cache(self) -> bool:
        return all([r.flush_cache() for r in self.replicas])

    def inject_fault(self) -> None:
        self.replicas[0].inject_fault()

    def cached_prefix_len(self, prompt: Prompt) -> int:
        return max(r.cached_prefix_len(prompt) for r in self.replicas)


def _common_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n
