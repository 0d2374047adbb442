"""xgrammar without torch.

xgrammar's `__init__` imports its `testing` and `matcher` modules, and both import torch at
module level (the wheel even requires a CUDA torch). What we use never touches torch: the
grammar compiler, the tokenizer info, and the C++ matcher, which fills any DLPack-capable
int32 array (numpy here). So we import the package's modules one by one, without running
its `__init__`, and talk to the C++ matcher through the same handle `xgrammar.matcher`
wraps. This leans on xgrammar's module layout: the version is pinned (XGRAMMAR_VERSION,
scripts/setup.sh) and tests/grammar/test_no_torch.py runs it with torch unimportable.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from functools import cache
from typing import Any, NamedTuple

import numpy as np

XGRAMMAR_VERSION = "0.2.9"


class XGrammar(NamedTuple):
    GrammarCompiler: Any  # xgrammar.compiler.GrammarCompiler
    CompiledGrammar: Any
    TokenizerInfo: Any  # xgrammar.tokenizer_info.TokenizerInfo
    core: Any  # the C++ bindings (xgrammar.base._core)
    version: str


@cache
def load() -> XGrammar:
    """Import xgrammar's torch-free modules (once per process)."""
    if "xgrammar" not in sys.modules:
        spec = importlib.util.find_spec("xgrammar")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(
                f"structured output needs xgrammar=={XGRAMMAR_VERSION}: "
                f"pip install --no-deps xgrammar=={XGRAMMAR_VERSION} apache-tvm-ffi pydantic"
            )
        package = types.ModuleType("xgrammar")  # the package, minus its __init__
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        sys.modules["xgrammar"] = package
    mod = importlib.import_module
    mod("xgrammar.load_binding")  # loads the C++ library; must come before base
    compiler = mod("xgrammar.compiler")
    version = mod("xgrammar._version").__version__
    if version != XGRAMMAR_VERSION:
        raise ImportError(f"xgrammar {version} found; radixjax is pinned to "
                          f"{XGRAMMAR_VERSION} (it imports xgrammar's modules directly)")
    return XGrammar(compiler.GrammarCompiler, compiler.CompiledGrammar,
                    mod("xgrammar.tokenizer_info").TokenizerInfo, mod("xgrammar.base")._core,
                    version)


class Matcher:
    """One request's grammar state: which tokens may come next, fed the tokens that did."""

    def __init__(self, compiled: Any, stop_token_ids: list[int]) -> None:
        self._h = load().core.GrammarMatcher(
            compiled._handle, list(stop_token_ids),  # override the tokenizer's stop tokens
            False,  # terminate only on a stop token
            -1,  # unlimited rollback
            None,  # no grammar-defined temperature
        )

    def fill_bitmask(self, mask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into mask[row] (mask: [B, W] int32, C-order)."""
        self._h.fill_next_token_bitmask(mask, row, False)

    def accept(self, token: int) -> bool:
        return bool(self._h.accept_token(int(token), False))

    def rollback(self, num_tokens: int) -> None:
        self._h.rollback(num_tokens)

    def jump_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces next (not accepted yet); xgrammar leaves out a last
        token that a longer vocabulary token could extend, so the model keeps that choice."""
        return [int(t) for t in self._h.find_jump_forward_tokens()]

    @property
    def is_terminated(self) -> bool:
        return bool(self._h.is_terminated())
