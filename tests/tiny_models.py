"""Tiny random configs of each family, written as HF folders by transformers (torch is
the test-only reference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# XLA_FLAGS for a subprocess that runs tiny models on 8 fake CPU devices. XLA's backend
# optimisation is off there: tiny models are compile-bound (~1/3 less compile time) and
# the flag changes speed only, never the numbers.
EIGHT_CPU_DEVICES_XLA_FLAGS = ("--xla_force_host_platform_device_count=8 "
                               "--xla_backend_optimization_level=0")
# The same, in process: the `xla_options` of a runner or engine of a tiny model (its
# programs only; the SmolLM2 engines of the same pytest process keep XLA's defaults).
FAST_COMPILE = (("xla_backend_optimization_level", 0),)

_COMMON: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, num_hidden_layers=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
)

# family -> (transformers config class name, extra kwargs)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                  tie_word_embeddings=True, attention_bias=True,
                                  mlp_bias=True)),
    "llama3": ("LlamaConfig", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(num_attention_heads=8, num_key_value_heads=1,
                                      sliding_window=7, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=8, num_key_value_heads=2,
                                  tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                  tie_word_embeddings=False)),
    # MoE: 8 experts, top-2. Qwen3-MoE with renormalised gates and layer 1 dense
    # (mlp_only_layers); Mixtral with 2 KV heads (replicated under TP 4 / 8).
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        num_attention_heads=8, num_key_value_heads=4, head_dim=16, tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[1])),
    "mixtral": ("MixtralConfig", dict(num_attention_heads=8, num_key_value_heads=2,
                                      num_local_experts=8, num_experts_per_tok=2,
                                      intermediate_size=32, tie_word_embeddings=True)),
    # Qwen2-MoE: q/k/v bias, un-normalised gates, a sigmoid-gated shared expert, layer 1
    # dense.
    "qwen2_moe": ("Qwen2MoeConfig", dict(
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[1])),
    # MLA (latent 32 + RoPE 8 per token), layer 0 dense, layer 1 MoE with a shared expert.
    # V2: no q LoRA, group-limited greedy softmax routing, scaling 1.5.
    "deepseek_v2": ("DeepseekV2Config", dict(
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, topk_method="group_limited_greedy",
        n_group=4, topk_group=2, routed_scaling_factor=1.5, norm_topk_prob=False)),
    # V3: q LoRA, sigmoid scores with a selection bias, groups by top-2 sums, YaRN RoPE
    # (attention factor != 1, softmax mscale^2).
    "deepseek_v3": ("DeepseekV3Config", dict(
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
        q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=2, first_k_dense_replace=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0})),
    # Gemma 3: sliding-window layers around a global one (window 7, RoPE base 10k) and a
    # global one with base 1M and linear scaling, q/k norms, four norms per layer, a
    # softmax scale from query_pre_attn_scalar (not head_dim), GELU-tanh, tied head.
    "gemma3": ("Gemma3TextConfig", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=3,
        sliding_window=7, query_pre_attn_scalar=24, pad_token_id=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}})),
    # Gemma 2: alternating window / global layers, logit soft caps (Gemma 2's are 50 on
    # the attention scores, 30 on the output; 5 and 3 here, so the random weights' scores
    # reach well into the tanh).
    "gemma2": ("Gemma2Config", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2,
        sliding_window=7, query_pre_attn_scalar=24, pad_token_id=0,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    # Phi-3: q|k|v and gate|up fused in the checkpoint.
    "phi3": ("Phi3Config", dict(num_attention_heads=4, num_key_value_heads=2,
                                pad_token_id=0, tie_word_embeddings=False)),
}

# Not in the HF parity sweep: a llama whose head size (64) the CPU attention handler
# (model/cpu_decode.py) computes, so every token of a step runs as a decode's row there:
# the same bits as a decode (speculative decoding's verify steps, tests/engine).
HANDLER_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_h64": ("LlamaConfig", dict(num_attention_heads=2, num_key_value_heads=1,
                                      head_dim=64, tie_word_embeddings=True)),
}


def make_tiny_hf_model(family: str, seed: int = 0) -> Any:
    import torch
    import transformers

    cls_name, extra = {**FAMILIES, **HANDLER_FAMILIES}[family]
    config = getattr(transformers, cls_name)(**{"intermediate_size": 96, **_COMMON, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # default init is tiny; larger weights make the test sharper
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's selection bias
                b.copy_(0.1 * torch.randn_like(b))
    return model.eval()


def save_tiny_model(family: str, folder: Path) -> Path:
    model = make_tiny_hf_model(family)
    model.save_pretrained(folder)
    return folder


def save_char_tokenizer(folder: Path) -> Path:
    """A one-character-per-token tokenizer of exactly 256 tokens (printable ASCII, then
    Latin Extended letters), saved as HF tokenizer files: text in and out of the tiny
    models (vocab 256) with no download, and every token id decodes to its own character,
    so equal text means equal tokens."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + [chr(0x100 + i) for i in range(256 - 95)]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


PLAIN_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                       "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def save_char_chat_model(src: Path, folder: Path) -> Path:
    """A copy of the tiny model folder `src` with the one-character tokenizer and a plain
    chat template: a servable model (text in and out, chat) for server tests."""
    import json

    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((src / name).read_bytes())
    save_char_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**config, "chat_template": PLAIN_CHAT_TEMPLATE}))
    return folder


# DeepSeek-R1's way: the generation prompt opens the reasoning
THINKING_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}assistant:<think>\n"
                          "{% endif %}")
THINK_IDS = {"<think>": 254, "</think>": 255}


def save_thinking_chat_model(src: Path, folder: Path) -> Path:
    """save_char_chat_model with the last two characters' ids given to the added tokens
    <think> and </think> (decoded as text, as DeepSeek-R1's are) and a template that
    opens the reasoning."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    save_char_chat_model(src, folder)
    chars = [chr(c) for c in range(32, 127)] + [chr(0x100 + i) for i in range(254 - 95)]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_IDS])
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**config, "chat_template": THINKING_CHAT_TEMPLATE}))
    return folder
