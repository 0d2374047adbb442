"""Load a GGUF file (read by loaders/gguf_reader.py): metadata -> ModelConfig, tensors
dequantized to float32 by the `gguf` package.

llama.cpp's converter permutes the rows of Q and K for the `llama` architecture (it
uses interleaved RoPE pairs); we undo that so one RoPE (HF's rotate-half) serves both
formats. GGUF matrices dequantize as (out, in); we store (in, out).

blocks=True (the "gguf" form, model/gguf_blocks.py): each matrix of a type with a product
here stays in its blocks (a BlockWeight over the mapped file's rows, its Q/K rows put
back in HF's order whole: a row's blocks never mix rows); the rest dequantize as above.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gguf
import jax
import numpy as np

from radixjax.loaders.gguf_reader import GGUFFile, GGUFTensor
from radixjax.loaders.hf import split_fused
from radixjax.model import gguf_blocks, gguf_gpu
from radixjax.model.config import ModelConfig, UnsupportedModelError
from radixjax.model.params import Params, Placer, params_from_numpy

log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "attn_norm.weight": ("attn_norm", False),
    "attn_q.weight": ("wq", True),
    "attn_k.weight": ("wk", True),
    "attn_v.weight": ("wv", True),
    "attn_output.weight": ("wo", True),
    "attn_q.bias": ("bq", False),
    "attn_k.bias": ("bk", False),
    "attn_v.bias": ("bv", False),
    "attn_output.bias": ("bo", False),
    "attn_q_norm.weight": ("q_norm", False),
    "attn_k_norm.weight": ("k_norm", False),
    "ffn_norm.weight": ("mlp_norm", False),
    "ffn_gate.weight": ("w_gate", True),
    "ffn_up.weight": ("w_up", True),
    "ffn_down.weight": ("w_down", True),
    # Gemma 2 / 3 (their norms already hold 1 + w, as ours do)
    "post_attention_norm.weight": ("post_attn_norm", False),
    "post_ffw_norm.weight": ("post_mlp_norm", False),
}
# Phi-3: fused [q | k | v] and [gate | up] rows (split into their parts)
_FUSED_NAMES = {"attn_qkv.weight": ("wq", "wk", "wv"), "ffn_up.weight": ("w_gate", "w_up")}
_TOP_NAMES = {
    "token_embd.weight": ("embed", False),
    "output_norm.weight": ("final_norm", False),
    "output.weight": ("lm_head", False),  # kept [V, D]
}


def is_gguf_file(path: Path) -> bool:
    return path.is_file() and path.suffix == ".gguf"


def load_gguf_config(gf: GGUFFile) -> ModelConfig:
    return ModelConfig.from_gguf(gf.metadata, {t.name for t in gf.tensors})


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's Q/K row permutation. w: [out = heads*Dh, in] -> same shape."""
    out_dim = w.shape[0]
    w = w.reshape(num_heads, out_dim // num_heads // 2, 2, *w.shape[1:])
    return w.swapaxes(1, 2).reshape(out_dim, *w.shape[3:])


def dequantize(t: GGUFTensor) -> np.ndarray:
    """Any type the `gguf` package dequantizes (F32, F16, BF16, Q4_0..Q8_0, Q2_K..Q6_K,
    IQ*) -> float32 [rows, cols]; a clear error naming the type otherwise."""
    try:
        out = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError as e:
        raise UnsupportedModelError(
            f"tensor {t.name}: GGUF type {t.tensor_type.name} cannot be dequantized "
            f"(the gguf package has no dequantizer for it)") from e
    # never a view of the mapped file (an F32 tensor's values): a device array made from
    # it may alias the mapping and keep the whole file resident (1.1 GB for the 1.5B)
    return out.copy() if np.may_share_memory(out, t.data) else out


def _hf_rows(w: np.ndarray, ours: str, arch: str, cfg: ModelConfig) -> np.ndarray:
    """A tensor's rows (values or raw blocks) in HF's order: Q/K rows un-permuted
    (llama arch), anything else as it is."""
    if arch == "llama" and ours in ("wq", "bq"):
        return unpermute_rope_rows(w, cfg.num_heads)
    if arch == "llama" and ours in ("wk", "bk"):
        return unpermute_rope_rows(w, cfg.num_kv_heads)
    return w


def _block_k(t: GGUFTensor, planes: bool) -> int | None:
    """A matrix's K (values per row) where its type has a product in its blocks here
    (planes: the GPU kernel's, model/gguf_gpu.py); else None."""
    if t.data.ndim != 2 or t.tensor_type in (gguf.GGMLQuantizationType.F32,
                                             gguf.GGMLQuantizationType.F16,
                                             gguf.GGMLQuantizationType.BF16):
        return None
    k = t.data.shape[1] // gguf.GGML_QUANT_SIZES[t.tensor_type][1] * \
        gguf.GGML_QUANT_SIZES[t.tensor_type][0]
    has = gguf_gpu.has_planes if planes else gguf_blocks.has_product
    return k if has(int(t.tensor_type), k) else None


def load_gguf_params(gf: GGUFFile, cfg: ModelConfig, arch: str, dtype: Any,
                     placer: Placer | None = None, blocks: bool | str = False) -> Params:
    """blocks: matrices with a product in their GGUF blocks stay in them (the others
    dequantized, named once in the log): BlockWeight leaves on the CPU, PlanesWeight
    on a GPU or where blocks == "planes" (the GPU's form, interpreted elsewhere)."""
    planes = blocks == "planes" or (blocks is True and jax.default_backend() == "gpu")
    from_blocks = gguf_gpu.from_blocks if planes else gguf_blocks.from_blocks
    top: dict[str, Any] = {}
    layers: list[dict[str, Any]] = [{} for _ in range(cfg.num_layers)]
    dequantized: set[str] = set()
    for t in gf.tensors:
        if t.name.startswith("blk."):
            _, idx, rest = t.name.split(".", 2)
            if arch == "phi3" and rest in _FUSED_NAMES:
                w = dequantize(t)
                layers[int(idx)].update(split_fused(w, _FUSED_NAMES[rest], cfg))
                continue
            if rest not in _LAYER_NAMES:
                continue
            ours, transpose = _LAYER_NAMES[rest]
            dest = layers[int(idx)]
        elif t.name in _TOP_NAMES:
            ours, transpose = _TOP_NAMES[t.name]
            dest = top
        else:
            continue
        k = _block_k(t, planes) if blocks and (transpose or ours in ("embed", "lm_head")) else None
        if blocks and k is None and t.data.ndim == 2:
            dequantized.add(t.tensor_type.name)
        if k is not None:
            raw = _hf_rows(np.asarray(t.data), ours, arch, cfg)  # whole rows of blocks
            dest[ours] = from_blocks(raw, int(t.tensor_type), k)
            continue
        w = _hf_rows(dequantize(t), ours, arch, cfg)
        dest[ours] = w.T if transpose else w
    if dequantized:
        log.warning("GGUF matrices of type %s have no product in their blocks here: "
                    "dequantized (the int8 path)", ", ".join(sorted(dequantized)))
    return params_from_numpy(cfg, top, layers, dtype, placer)
