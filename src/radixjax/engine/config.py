"""EngineConfig: every scheduling and memory knob, frozen and validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from radixjax.cache.window_kv import min_window_slots
from radixjax.model.forms import ATTENTION_BACKENDS, MOE_DISPATCH, QUANTIZATIONS

POLICIES = ("lpm", "dfs-weight", "fcfs")
DISAGGREGATION_MODES = ("null", "prefill", "decode")  # SGLang's names
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")  # SGLang's --kv-cache-dtype
# SGLang's --speculative-algorithm: "ngram" (no model: the radix tree and the request's
# own n-grams), "standalone" (a small draft model sharing the tokenizer)
SPECULATIVE_ALGORITHMS = ("ngram", "standalone")


class EngineConfigError(ValueError):
    """An engine option is out of range."""


@dataclass(frozen=True)
class EngineConfig:
    # KV pool size in tokens (slot / page 0 is the dummy); None: sized at start for the
    # model and the memory available (engine/memory.py; SGLang's --max-total-tokens)
    num_slots: int | None = None
    page_size: int = 1
    max_running: int = 32  # running requests (B bucket limit)
    # longest request (prompt + output); None: the model's own context length
    max_context: int | None = None
    # the most of the memory available after loading that a sized KV pool may take
    # (SGLang's --mem-fraction-static; the pool is host memory on the CPU)
    mem_fraction_static: float = 0.5
    max_prefill_tokens: int = 1024  # new tokens per prefill step (T bucket limit)
    chunk_size: int = 512  # chunked prefill: at most this many tokens of one request a step
    policy: str = "lpm"
    fcfs_threshold: int = 128  # cache-aware policies fall back to FCFS past this queue length
    in_batch_prefix_min: int = 32  # waiting requests sharing a cold prefix this long wait
    enable_cache: bool = True  # the radix cache (off: every request prefills from scratch)
    enable_overlap: bool = True
    enable_mixed: bool = False  # decode requests ride along in prefill steps
    new_token_ratio: float = 0.4  # decode KV reserved per running request (x remaining)
    enable_jump_forward: bool = True  # grammar-forced tokens in one extend (see docs)
    retract_every: int = 0  # test hook: force one retraction every N decode steps
    dtype: str = "float32"
    # The serving form (serving_form() resolves "auto" / None on the JAX platform): by
    # default, on one CPU device, w8a16_int8 layer products, a bfloat16 KV pool and
    # deterministic inference: perplexity within 0.5 % of float32, a request's answer
    # the same whatever its batch, faster than float32 on every workload measured
    # (benchmarks/README.md, issue 39). quantization="none" is float32 (its KV too).
    # the KV pool's dtype; "auto": bfloat16 beside int8 layer products, else the
    # weights' dtype. bfloat16 halves the pool and the bytes attention reads
    kv_cache_dtype: str = "auto"
    # "auto": on one CPU device with float32 weights "gguf" for a GGUF file (its matrices
    # multiplied in their own blocks, model/gguf_blocks.py; issue 53), "w8a16_int8" for
    # others; else "none";
    # "w8a8_int8": int8 layer matrices and activations, one device only (model/quant.py:
    # decode B = 8 ~1.7x faster on the CPU, perplexity +3.7 %; benchmarks/README.md);
    # "w8a16_int8": the same weights, each token's activations as two int8 parts
    # (perplexity +0.45 %, a row's products the same bits in any batch)
    quantization: str = "auto"
    attention_backend: str = "auto"  # "native" | "pallas" | "auto": pallas on a GPU
    # SGLang's --enable-deterministic-inference: a request's numbers (and greedy tokens)
    # do not depend on its batch, chunking or cache hits: attention in one order per
    # request (native backend; model/native_attention.py deterministic_attention).
    # None: on wherever the native backend runs (not MLA models: their attention has
    # no such form yet)
    enable_deterministic_inference: bool | None = None
    # seeds for requests that give none derive from it (SGLang's --random-seed); None:
    # drawn from the OS at each engine start (Engine sets it: /get_server_info shows it)
    seed: int | None = None
    tp: int = 1  # tensor-parallel devices (0: every visible device); docs/sharding.md
    ep: int = 1  # expert-parallel groups inside the TP group (MoE models); divides tp
    moe_dispatch: str = "psum"  # EP: "psum" | "all_to_all" (docs/sharding.md, measured)
    # attention data-parallel over the tp devices (one DP rank each, with its own requests,
    # KV slots and radix tree: num_slots and max_running are per rank), MLP / MoE over all
    enable_dp_attention: bool = False
    disaggregation_mode: str = "null"  # prefill / decode server of a PD pair (disagg/)
    disaggregation_timeout: float = 30.0  # s: a room's prefill, fetch and pull, each
    # XLA compiler options of the step programs, (name, value) pairs
    # (RunnerConfig.xla_options); (): XLA's defaults
    xla_options: tuple[tuple[str, Any], ...] = ()
    # Speculative decoding (engine/speculative.py, docs/speculative.md), SGLang's names:
    # "ngram": drafts from the radix tree and the request's own tokens; "standalone":
    # from a draft model (speculative_draft_model_path, or Engine(draft_params=...));
    # None: off
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    # the most drafts a request verifies per step (a step's drafts also stay within
    # max_running - its requests: each is a sampling row of the batch)
    speculative_num_draft_tokens: int = 15
    # n-gram lengths matched against the request's tokens (SGLang's match window sizes)
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 4
    # Sliding-window models (Gemma 2 / 3): the window layers keep their KV in a pool of
    # their own, each position's freed once it falls behind every window that reads it
    # (SGLang's hybrid SWA memory; cache/window_kv.py). swa_full_tokens_ratio: that
    # pool's size over num_slots; None: the least that never stalls a step
    # (window_kv.min_window_slots). disable_hybrid_swa_memory: one pool, every position
    # kept in every layer
    swa_full_tokens_ratio: float | None = None
    disable_hybrid_swa_memory: bool = False

    @property
    def max_step_tokens(self) -> int:
        """The most tokens one scheduler step can carry: a prefill step's budget (plus
        one token per running request riding along when mixed), or a decode of every
        running request. The runner compiles one program per token bucket up to this."""
        mixed = self.max_running if self.enable_mixed else 0
        return max(self.max_prefill_tokens + mixed, self.max_running)

    def __post_init__(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise EngineConfigError(msg)

        check(self.policy in POLICIES, f"policy must be one of {POLICIES}")
        check(self.attention_backend in ATTENTION_BACKENDS,
              f"attention_backend must be one of {ATTENTION_BACKENDS}")
        check(self.page_size >= 1, "page_size must be >= 1")
        check(self.num_slots is None or self.num_slots >= 2 * self.page_size,
              "num_slots too small for one page")
        check(0.0 < self.mem_fraction_static <= 1.0, "mem_fraction_static must be in (0, 1]")
        check(self.max_running >= 1, "max_running must be >= 1")
        check(1 <= self.chunk_size <= self.max_prefill_tokens,
              "need 1 <= chunk_size <= max_prefill_tokens")
        check(self.max_context is None or self.max_context >= 2, "max_context must be >= 2")
        check(0.0 <= self.new_token_ratio <= 1.0, "new_token_ratio must be in [0, 1]")
        check(self.retract_every >= 0, "retract_every must be >= 0")
        check(self.tp >= 0 and self.ep >= 1, "need tp >= 0 (0: all devices) and ep >= 1")
        check(self.tp == 0 or self.tp % self.ep == 0, "ep must divide tp")
        check(self.moe_dispatch in MOE_DISPATCH, f"moe_dispatch must be one of {MOE_DISPATCH}")
        check(self.disaggregation_mode in DISAGGREGATION_MODES,
              f"disaggregation_mode must be one of {DISAGGREGATION_MODES}")
        check(self.disaggregation_mode != "decode" or self.enable_cache,
              "a decode server lands the transferred KV in its radix cache: keep it on")
        check(self.disaggregation_timeout > 0, "disaggregation_timeout must be > 0")
        check(self.enable_deterministic_inference is not True
              or self.attention_backend != "pallas",
              "deterministic inference runs on the native attention backend")
        check(self.kv_cache_dtype in KV_CACHE_DTYPES,
              f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}")
        check(self.quantization in ("auto", *QUANTIZATIONS),
              f"quantization must be auto or one of {QUANTIZATIONS}")
        check(self.quantization in ("auto", "none")
              or (self.tp == 1 and not self.enable_dp_attention),
              "weight quantization runs on one device only (tp = 1, no DP attention)")
        check(not self.enable_dp_attention or self.tp != 1,
              "DP attention needs tp > 1 (one DP rank per device)")
        check(not self.enable_dp_attention or self.disaggregation_mode == "null",
              "DP attention with prefill-decode disaggregation is not supported")
        check(self.speculative_algorithm in (None, *SPECULATIVE_ALGORITHMS),
              f"speculative_algorithm must be None or one of {SPECULATIVE_ALGORITHMS}")
        check(self.speculative_algorithm is None or not self.enable_dp_attention,
              "speculative decoding with DP attention is not supported")
        check(self.speculative_num_draft_tokens >= 1, "speculative_num_draft_tokens must be >= 1")
        check(self.swa_full_tokens_ratio is None or self.swa_full_tokens_ratio > 0,
              "swa_full_tokens_ratio must be > 0")
        check(1 <= self.speculative_ngram_min_match_window_size
              <= self.speculative_ngram_max_match_window_size,
              "need 1 <= speculative n-gram min window <= max window")


def window_pool_slots(c: EngineConfig, window: int | None, mla: bool = False) -> int:
    """The sliding-window layers' pool size for a model whose widest window is `window`
    (0: none; one pool): at least window_kv.min_window_slots, at most num_slots (then
    the window pool would save nothing). Not with DP attention or disaggregation (their
    pools and transfers are per layer of one pool)."""
    if (window is None or mla or c.disable_hybrid_swa_memory or c.enable_dp_attention
            or c.disaggregation_mode != "null"):
        return 0
    least = min_window_slots(window, c.page_size, c.max_running, c.max_step_tokens)
    if c.swa_full_tokens_ratio is not None:
        asked = int(c.swa_full_tokens_ratio * c.num_slots)
        least = max(least, asked - asked % c.page_size)
    return least if least < c.num_slots else 0


class ServingForm(NamedTuple):
    """An EngineConfig's numeric form, its "auto" choices resolved (serving_form)."""

    quantization: str  # one of QUANTIZATIONS
    kv_dtype: str  # "float32" | "bfloat16"
    deterministic: bool


def serving_form(c: EngineConfig, platform: str, mla: bool = False,
                 gguf: bool = False) -> ServingForm:
    """c's quantization, KV dtype and deterministic inference on this JAX platform
    ("cpu", "gpu", ..: jax.default_backend()), "auto" / None resolved: where one CPU
    device runs float32 weights, "gguf" for a GGUF file whose matrices multiply in their
    blocks here (gguf: loaders.blocks_servable) and w8a16_int8 for others; on one GPU
    "gguf" for such a file (its planes, model/gguf_gpu.py); elsewhere "none"; a bfloat16
    KV pool beside int8 / block products (elsewhere the weights' dtype), deterministic
    inference wherever the native attention backend runs. mla: an MLA model (DeepSeek),
    whose attention has no deterministic form: "none" and no deterministic inference
    unless asked, so that the default makes no promise it cannot keep."""
    quant = c.quantization
    if quant == "auto":
        one_device = c.tp == 1 and not c.enable_dp_attention
        quant = "none"
        if platform == "cpu" and one_device and c.dtype == "float32" and not mla:
            quant = "gguf" if gguf else "w8a16_int8"
        elif platform == "gpu" and one_device and gguf and not mla:
            quant = "gguf"  # the planes and their Pallas kernel (model/gguf_gpu.py)
    kv = c.kv_cache_dtype
    if kv == "auto":
        kv = "bfloat16" if quant != "none" else c.dtype
    det = c.enable_deterministic_inference
    if det is None:
        det = not mla and (c.attention_backend == "native" or (
            c.attention_backend == "auto" and platform != "gpu"))
    return ServingForm(quant, kv, det)
