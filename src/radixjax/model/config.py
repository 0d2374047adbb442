"""Model configuration: one frozen dataclass for the Llama family, built from an HF
`config.json` dict or from GGUF metadata.

Families covered: Llama / SmolLM2 / Llama-3 (llama3 RoPE scaling), Mistral (sliding
window), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMSNorm); GQA; tied or untied head.
Gemma 2 / Gemma 3 (`gemma_style`): a norm after attention and after the MLP too, RMSNorm
weights stored as (1 + w) (as llama.cpp's GGUF holds them), embeddings scaled by
sqrt(hidden), GELU-tanh gated MLP, the softmax scale from query_pre_attn_scalar, local
(sliding-window) layers with their own RoPE base (Gemma 3) and logit soft caps (Gemma 2).
Phi-3: the Llama layer with q|k|v and gate|up fused in the checkpoint (split at load).
MoE (model/moe.py): Qwen3-MoE (softmax router, top-k, optional renormalisation
`norm_topk_prob`, no shared expert), Mixtral (same router, always renormalised),
Qwen2-MoE (+ a sigmoid-gated shared expert), DeepSeek-V2/V3 (shared experts, grouped
top-k, V3's sigmoid scores with a selection bias, a routed scaling factor, dense first
layers). DeepSeek's attention is MLA (model/mla.py, `MLADims`): the KV pool then holds
one latent row per token, so `num_kv_heads` = 1 and `head_dim` = kv_lora_rank + rope dim
describe the pool, and `v_pool_width` = 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                         "qwen2_moe", "deepseek_v2", "deepseek_v3", "gemma2", "gemma3_text",
                         "phi3")
GEMMA_MODEL_TYPES = ("gemma2", "gemma3_text")
# GGUF `general.architecture` -> model_type
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma2": "gemma2", "gemma3": "gemma3_text", "phi3": "phi3"}
HIDDEN_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model family or feature radixjax does not implement."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LinearScaling:
    """Positions divided by `factor` ("rope_type": "linear"; Gemma 3's global layers)."""

    factor: float


@dataclass(frozen=True)
class YarnScaling:
    """YaRN ("rope_type": "yarn"): frequencies blended between interpolated and
    extrapolated by a ramp over the dims; cos/sin scaled by attention_factor; MLA models
    also scale the softmax by mscale(factor, mscale_all_dim)^2 (DeepSeek's reference)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class MLADims:
    """Multi-head latent attention (DeepSeek-V2/V3). Per token the pool keeps the
    normalised latent c [kv_lora_rank] and the shared RoPE key [qk_rope_head_dim]."""

    q_lora_rank: int | None  # None: one wq [D, H * qk_head_dim]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # The checkpoint's RoPE dims come in interleaved pairs (x0, x1), (x2, x3)..; the HF
    # loader reorders those weight columns to rotate-half order (same dot products).
    rope_interleaved: bool = True

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | YarnScaling | LinearScaling | None = None
    # RoPE base of the sliding-window layers (Gemma 3: 10k beside the global 1M), unscaled;
    # None: the same as the global layers'
    local_rope_theta: float | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2; Llama's attention_bias
    o_bias: bool = False  # Llama's attention_bias also biases o_proj
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    # Per layer: None for full attention, or the window (keys with pos > q_pos - window).
    sliding_windows: tuple[int | None, ...] = field(default=())
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # MoE (0 experts: dense). Sparse layers use experts of width moe_intermediate_size;
    # the others (Qwen3-MoE mlp_only_layers) a dense MLP of intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k gate weights to sum to 1
    sparse_layers: tuple[bool, ...] = field(default=())  # per layer: MoE block or dense MLP
    moe_scoring: str = "softmax"  # "softmax" | "sigmoid" (DeepSeek-V3)
    moe_topk_method: str = "greedy"  # | "group_limited_greedy" (V2) | "noaux_tc" (V3)
    moe_n_group: int = 1  # expert groups for the grouped methods
    moe_topk_group: int = 1  # groups a token may pick from
    routed_scaling_factor: float = 1.0
    moe_router_bias: bool = False  # V3's e_score_correction_bias (selection only)
    shared_expert_size: int = 0  # width of the always-on shared expert MLP (0: none)
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(h @ w) scales the shared expert
    mla: MLADims | None = None
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" | "gelu_tanh"
    gemma_style: bool = False  # post-attention / post-MLP norms, sqrt(hidden) embedding
    query_scale: float | None = None  # softmax scale (None: head_dim ** -0.5)
    attn_soft_cap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_soft_cap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            raise UnsupportedModelError("sliding_windows must have one entry per layer")
        if not self.sparse_layers:
            object.__setattr__(self, "sparse_layers", (self.num_experts > 0,) * self.num_layers)
        if len(self.sparse_layers) != self.num_layers:
            raise UnsupportedModelError("sparse_layers must have one entry per layer")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise UnsupportedModelError("need 0 < num_experts_per_tok <= num_experts")
        if self.moe_topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise UnsupportedModelError(f"topk_method {self.moe_topk_method!r} is not supported")
        if self.num_experts and self.num_experts % self.moe_n_group:
            raise UnsupportedModelError("n_group must divide the number of experts")
        if self.hidden_act not in HIDDEN_ACTS.values():
            raise UnsupportedModelError(f"hidden_act {self.hidden_act!r} is not supported")
        if self.mla is not None and (self.num_kv_heads, self.head_dim) != (
                1, self.mla.kv_lora_rank + self.mla.qk_rope_head_dim):
            raise UnsupportedModelError("an MLA config's pool is 1 head of kv_lora + rope dims")

    def is_sparse(self, layer: int) -> bool:
        return self.sparse_layers[layer]

    @property
    def max_window(self) -> int | None:
        """The widest sliding window of any layer (None: no layer has one)."""
        return max((w for w in self.sliding_windows if w is not None), default=None)

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def v_pool_width(self) -> int:
        """Per KV head, the V pool's width: head_dim, or 0 for MLA (one latent pool)."""
        return 0 if self.mla is not None else self.head_dim

    @property
    def softmax_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim**-0.5

    @property
    def embed_scale(self) -> float:
        """What the embedding rows are multiplied by (Gemma: sqrt(hidden))."""
        return self.hidden_size**0.5 if self.gemma_style else 1.0

    @property
    def rope_dim(self) -> int:
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from a parsed HF `config.json` (transformers 4.x or 5.x layout)."""
        model_type = hf.get("model_type", "")
        if model_type == "gemma3" and "text_config" in hf:  # the multimodal config's text
            hf = {**hf["text_config"], "model_type": "gemma3_text"}
            model_type = "gemma3_text"
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(f"model_type {model_type!r} is not supported")
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
        if act not in HIDDEN_ACTS:
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported")
        num_heads = hf["num_attention_heads"]
        hidden = hf["hidden_size"]
        num_layers = hf["num_hidden_layers"]
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        local_theta = None
        if "full_attention" in rope:  # transformers 5: per layer type (Gemma 3)
            local = rope.get("sliding_attention") or {}
            local_theta = local.get("rope_theta")
            if local.get("rope_type", "default") != "default":
                raise UnsupportedModelError("RoPE scaling on sliding-window layers")
            rope = dict(rope["full_attention"])
        elif model_type == "gemma3_text":
            local_theta = hf.get("rope_local_base_freq", 10000.0)
        rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1:
            raise UnsupportedModelError("partial rotary embeddings are not supported")
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type == "yarn":
            scaling = YarnScaling(
                factor=float(rope["factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
                beta_fast=float(rope.get("beta_fast") or 32.0),
                beta_slow=float(rope.get("beta_slow") or 1.0),
                mscale=float(rope.get("mscale") or 0.0),
                mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
                attention_factor=rope.get("attention_factor"),
                truncate=bool(rope.get("truncate", True)),
            )
        elif rope_type == "linear":
            scaling = LinearScaling(factor=float(rope["factor"]))
        elif rope_type != "default":
            raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported")
        attention_bias = bool(hf.get("attention_bias", False))
        gemma = model_type in GEMMA_MODEL_TYPES
        scalar = hf.get("query_pre_attn_scalar") if gemma else None
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        moe = _hf_moe(hf, model_type, num_layers)
        mla = _hf_mla(hf) if model_type in MLA_MODEL_TYPES else None
        num_kv_heads = hf.get("num_key_value_heads") or num_heads
        head_dim = hf.get("head_dim") or hidden // num_heads
        if mla is not None:  # the pool's view: one latent "head"
            num_kv_heads, head_dim = 1, mla.kv_lora_rank + mla.qk_rope_head_dim
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hidden,
            intermediate_size=hf["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=(model_type == "qwen2" or attention_bias
                      or (model_type == "qwen2_moe" and hf.get("qkv_bias", True))),
            o_bias=model_type in ("llama", "mistral") and attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
            sliding_windows=_hf_sliding_windows(hf, model_type, num_layers),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            mla=mla,
            local_rope_theta=float(local_theta) if local_theta is not None else None,
            hidden_act=HIDDEN_ACTS[act],
            gemma_style=gemma,
            query_scale=float(scalar) ** -0.5 if scalar else None,
            attn_soft_cap=_cap(hf.get("attn_logit_softcapping")) if gemma else None,
            final_soft_cap=_cap(hf.get("final_logit_softcapping")) if gemma else None,
            **moe,
        )

    @classmethod
    def from_gguf(cls, md: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
        """Build from GGUF metadata (`general.architecture`: GGUF_ARCHITECTURES)."""
        arch = md["general.architecture"]
        model_type = GGUF_ARCHITECTURES.get(arch)
        if model_type is None:
            raise UnsupportedModelError(
                f"GGUF architecture {arch!r} is not supported; supported: "
                f"{', '.join(GGUF_ARCHITECTURES)}")

        def get(key: str, default: Any = None) -> Any:
            return md.get(f"{arch}.{key}", default)

        num_heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        num_layers = int(get("block_count"))
        head_dim = int(get("attention.key_length", hidden // num_heads))
        vocab = int(get("vocab_size", len(md.get("tokenizer.ggml.tokens", ())) or 0))
        scaling = None
        scaling_type = get("rope.scaling.type")
        if scaling_type == "linear":
            scaling = LinearScaling(float(get("rope.scaling.factor")))
        elif scaling_type not in (None, "none"):
            raise UnsupportedModelError(f"GGUF rope scaling {scaling_type!r} is not supported")
        eos = md.get("tokenizer.ggml.eos_token_id")
        gemma = model_type in GEMMA_MODEL_TYPES
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(get("attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            # llama.cpp's Gemma 3: 10k on the sliding-window layers (not in the metadata)
            local_rope_theta=10000.0 if model_type == "gemma3_text" else None,
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            qkv_bias="blk.0.attn_q.bias" in tensor_names,
            o_bias="blk.0.attn_output.bias" in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            sliding_windows=_gguf_sliding_windows(md, arch, model_type, num_layers),
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=(int(eos),) if eos is not None else (),
            hidden_act="gelu_tanh" if gemma else "silu",
            gemma_style=gemma,
            # llama.cpp's Gemma: the scale is 1 / sqrt(key_length) (query_pre_attn_scalar
            # equals head_dim in every released Gemma 2 / 3 but 27B's, not in metadata)
            query_scale=None,
            attn_soft_cap=_cap(get("attn_logit_softcapping")) if gemma else None,
            final_soft_cap=_cap(get("final_logit_softcapping")) if gemma else None,
        )


def _cap(value: Any) -> float | None:
    return float(value) if value else None


def _gguf_sliding_windows(md: dict[str, Any], arch: str, model_type: str,
                          num_layers: int) -> tuple[int | None, ...]:
    """Per layer: the window or None. Gemma 3: every 6th layer global, Gemma 2: every
    2nd (llama.cpp's fixed patterns; a `sliding_window_pattern` key wins if present)."""
    window = md.get(f"{arch}.attention.sliding_window")
    if not window:
        return (None,) * num_layers
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # per layer: whether it slides
        return tuple(int(window) if swa else None for swa in pattern)
    period = int(pattern or {"gemma3_text": 6, "gemma2": 2}.get(model_type, 0))
    if not period:
        return (int(window),) * num_layers
    return tuple(None if (i + 1) % period == 0 else int(window) for i in range(num_layers))


def _hf_sliding_windows(
    hf: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    window = hf.get("sliding_window")
    if not window:
        return (None,) * num_layers
    layer_types = hf.get("layer_types")
    if layer_types:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if model_type in ("mistral", "mixtral", "phi3"):
        return (window,) * num_layers
    if model_type in GEMMA_MODEL_TYPES:  # older configs: Gemma 2 alternates, Gemma 3 5:1
        period = 2 if model_type == "gemma2" else int(hf.get("sliding_window_pattern", 6))
        return tuple(None if (i + 1) % period == 0 else window for i in range(num_layers))
    if hf.get("use_sliding_window"):  # Qwen2/3 without layer_types: layers >= max_window_layers
        first = hf.get("max_window_layers", num_layers)
        return tuple(window if i >= first else None for i in range(num_layers))
    return (None,) * num_layers


def _hf_mla(hf: dict[str, Any]) -> MLADims:
    if hf.get("attention_bias"):
        raise UnsupportedModelError("MLA with attention_bias is not supported")
    return MLADims(
        q_lora_rank=hf.get("q_lora_rank"),
        kv_lora_rank=int(hf["kv_lora_rank"]),
        qk_nope_head_dim=int(hf["qk_nope_head_dim"]),
        qk_rope_head_dim=int(hf["qk_rope_head_dim"]),
        v_head_dim=int(hf["v_head_dim"]),
        rope_interleaved=hf["model_type"] == "deepseek_v2" or bool(hf.get("rope_interleave", True)),
    )


def _hf_moe(hf: dict[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
    """MoE fields for ModelConfig (empty for dense families)."""
    if model_type in MLA_MODEL_TYPES:
        experts = int(hf.get("n_routed_experts") or 0)
        if not experts:
            return {}
        v3 = model_type == "deepseek_v3"
        first_dense = int(hf.get("first_k_dense_replace") or 0)
        freq = int(hf.get("moe_layer_freq") or 1)
        return dict(
            num_experts=experts,
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=int(hf["moe_intermediate_size"]),
            norm_topk_prob=bool(hf.get("norm_topk_prob", v3)),
            sparse_layers=tuple(i >= first_dense and i % freq == 0 for i in range(num_layers)),
            moe_scoring="sigmoid" if v3 else "softmax",
            moe_topk_method="noaux_tc" if v3 else hf.get("topk_method") or "greedy",
            moe_n_group=int(hf.get("n_group") or 1),
            moe_topk_group=int(hf.get("topk_group") or 1),
            routed_scaling_factor=float(hf.get("routed_scaling_factor") or 1.0),
            moe_router_bias=v3,
            shared_expert_size=int(hf["moe_intermediate_size"]) * int(
                hf.get("n_shared_experts") or 0),
        )
    if model_type == "qwen2_moe":
        step = int(hf.get("decoder_sparse_step", 1))
        dense = set(hf.get("mlp_only_layers") or ())
        return dict(
            num_experts=int(hf["num_experts"]),
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=int(hf["moe_intermediate_size"]),
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            sparse_layers=tuple(i not in dense and (i + 1) % step == 0
                                for i in range(num_layers)),
            shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0),
            shared_expert_gate=bool(hf.get("shared_expert_intermediate_size")),
        )
    if model_type == "mixtral":
        return dict(
            num_experts=int(hf["num_local_experts"]),
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=int(hf["intermediate_size"]),
            norm_topk_prob=True,
        )
    if model_type == "qwen3_moe":
        step = int(hf.get("decoder_sparse_step", 1))
        dense = set(hf.get("mlp_only_layers") or ())
        return dict(
            num_experts=int(hf.get("num_experts") or hf["num_local_experts"]),
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=int(hf["moe_intermediate_size"]),
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            sparse_layers=tuple(i not in dense and (i + 1) % step == 0
                                for i in range(num_layers)),
        )
    return {}
