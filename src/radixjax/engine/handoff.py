"""Prefill-decode disaggregation as the engine sees it: a KV handoff side. disagg/
implements it and the server plugs it in (Engine(kv_handoff=disagg.sides.make_side));
the engine imports nothing of disagg/.

    prefill side:  prepare(req, bootstrap)        before the request runs: one new token,
                                                  a hook that exports the prompt's KV as
                                                  the request ends (Req.on_finish_kv)
    decode side:   receive(req, bootstrap, land)  fetch the prompt's KV from the prefill
                                                  server; land(req, write) puts it in this
                                                  engine's pool and radix tree; the request
                                                  then enters with its first token set

`bootstrap`: the request's bootstrap fields as the server parsed them, read only by the
side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from radixjax.engine.config import EngineConfig
from radixjax.engine.request import Req

# land(req, write): on the scheduler's loop, between two steps: slots for req's prompt,
# write(slots) fills them with its KV, the prompt cached in the radix tree. Raises
# RequestError (the engine cannot serve req) or cache.errors.OutOfKVSlots (no room).
LandKV = Callable[[Req, Callable[[np.ndarray], None]], Awaitable[None]]


class KVHandoff(Protocol):
    mode: str  # "prefill" | "decode"

    def prepare(self, req: Req, bootstrap: Any) -> None: ...

    async def receive(self, req: Req, bootstrap: Any, land: LandKV) -> None: ...

    def stats(self) -> dict[str, float]: ...


# (the engine's config, its ModelRunner, whether to compile now) -> the side, or None
# when the config's disaggregation_mode is "null"
MakeHandoff = Callable[[EngineConfig, Any, bool], KVHandoff | None]
