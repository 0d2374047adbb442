"""Choosing the attention backend by name (model/attention.py's AttentionBackend):
"native" (model/native_attention.py; the CPU, the reference) or "pallas"
(model/pallas_backend.py; GPUs), "auto" the latter on a GPU. Apart from attention.py so
that the backends import its types and it imports none of them."""

from __future__ import annotations

from functools import partial

import jax

from radixjax.model.attention import AttentionBackend
from radixjax.model.forms import ATTENTION_BACKENDS
from radixjax.model.native_attention import native_attention


def resolve_backend_name(name: str) -> str:
    """"auto" -> "pallas" when JAX's default backend is a GPU, else "native"."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {ATTENTION_BACKENDS}")
    if name == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "native"
    return name


def get_backend(name: str, page_size: int = 1, deterministic: bool = False,
                cpu_decode: bool = False, soft_cap: float | None = None) -> AttentionBackend:
    """The backend function; page_size must be the allocator's page size, or 1 (always
    valid; only the pallas backend uses it). deterministic: a token's result independent
    of its batch (native backend only); cpu_decode: the native backend's decode tokens
    through the CPU handler (model/cpu_decode.py); soft_cap: the attention logit cap
    (Gemma 2) on every score."""
    name = resolve_backend_name(name)
    if name == "native":
        if not (deterministic or cpu_decode or soft_cap):
            return native_attention
        return partial(native_attention, deterministic=deterministic, kernel=cpu_decode,
                       soft_cap=soft_cap)
    if deterministic:
        raise ValueError("deterministic inference runs on the native attention backend")
    from radixjax.model.pallas_backend import pallas_attention  # Pallas only when asked

    return partial(pallas_attention, page_size=page_size, soft_cap=soft_cap)
