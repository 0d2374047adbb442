"""GrammarBackend: compiles a request's grammar (JSON schema, regex, EBNF, structural tag) for one
tokenizer and hands out per-request matchers.

Compiled grammars are cached by their key (kind, source, strict) in xgrammar's own
compiler cache, bounded (least recently used out past `cache_limit_bytes`). `compile`
blocks (milliseconds for most schemas, longer for big ones): call it off the scheduler's
loop (the engine uses a worker thread).
"""

from __future__ import annotations

import threading
from typing import Any

from radixjax.grammar import xgr


class GrammarError(ValueError):
    """The grammar does not compile; the message is the compiler's."""


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...],
                 max_threads: int = 2, cache_limit_bytes: int = 256 << 20) -> None:
        x = xgr.load()
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        info = x.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_token_ids
        )
        self._compiler = x.GrammarCompiler(info, max_threads=max_threads,
                                           cache_limit_bytes=cache_limit_bytes)
        self._lock = threading.Lock()  # one compile at a time keeps the cache consistent

    def compile(self, key: tuple[str, str, bool]) -> Any:
        """key = SamplingParams.grammar: (kind, source, strict) -> CompiledGrammar."""
        kind, source, strict = key
        try:
            with self._lock:
                if kind == "json_schema":
                    # Compact JSON (no free whitespace): a small model left free to add
                    # spaces can loop on them until max_tokens.
                    return self._compiler.compile_json_schema(
                        source, any_whitespace=False, strict_mode=strict
                    )
                if kind == "regex":
                    return self._compiler.compile_regex(source)
                if kind == "ebnf":
                    return self._compiler.compile_grammar(source)
                if kind == "structural_tag":
                    return self._compiler.compile_structural_tag(source)
        except (RuntimeError, ValueError) as e:  # xgrammar's: "[time] file:line: message"
            raise GrammarError(f"invalid {kind}: {_message(e)}") from None
        raise GrammarError(f"unknown grammar kind {kind!r}")

    def matcher(self, compiled: Any) -> xgr.Matcher:
        return xgr.Matcher(compiled, self.stop_token_ids)

    @property
    def cache_size_bytes(self) -> int:
        return int(self._compiler.get_cache_size_bytes())


def _message(e: Exception) -> str:
    """Drop xgrammar's "[hh:mm:ss] /path/file.cc:123: " prefix."""
    text = str(e).strip()
    head, sep, rest = text.partition(": ")
    return rest.strip() if sep and ".cc:" in head else text
