"""How long a request may be and how many tokens the KV pool holds when the user does not
say (SGLang's --context-length, --max-total-tokens and --mem-fraction-static).

    context  = max_context, or the model's own context length (max_position_embeddings:
               32k for Qwen2.5-Coder, 8k for SmolLM2)
    pool     = num_slots, or room for one request of the whole context and at least
               MIN_POOL tokens, cut to what mem_fraction_static of the memory available
               after the weights loaded can hold (the pool is host memory on the CPU)
    context  <= pool - one page when the pool was cut (said once)

Pure host arithmetic over the model's config; the caller reads the available memory."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from radixjax.engine.config import EngineConfig
from radixjax.model.config import ModelConfig

log = logging.getLogger(__name__)

MIN_POOL = 16384  # tokens: 8 requests of 2k, or one of 16k, whatever the context
# without a model (runner_config_for on a bare EngineConfig): the former defaults
FALLBACK_CONTEXT, FALLBACK_POOL = 4096, MIN_POOL


def available_bytes() -> int:
    """Memory the OS can give this process now without swapping (Linux: MemAvailable,
    the free pages and the page cache it can drop; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def sized(c: EngineConfig, cfg: ModelConfig, kv_bytes_per_token: int,
          available: int) -> EngineConfig:
    """c with num_slots and max_context resolved for this model (see the module's
    docstring); kv_bytes_per_token: the pool's bytes for one token in every layer."""
    context = c.max_context or cfg.max_position_embeddings
    slots = c.num_slots
    if slots is None:
        slots = max(MIN_POOL, context + c.page_size)
        fit = int(c.mem_fraction_static * available) // max(kv_bytes_per_token, 1)
        if fit < slots:
            log.warning("a KV pool of %d tokens (%.2f GB) is more than mem_fraction_static "
                        "%.2f of the %.1f GB available: %d tokens", slots,
                        slots * kv_bytes_per_token / 1e9, c.mem_fraction_static,
                        available / 1e9, fit)
            slots = max(fit, 2 * c.page_size)
    if c.max_context is None and context > slots - c.page_size:
        log.warning("the model's context (%d tokens) is cut to the KV pool's %d", context,
                    slots - c.page_size)
        context = slots - c.page_size
    return replace(c, num_slots=slots, max_context=context)
