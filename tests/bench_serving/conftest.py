"""benchmarks/serving.py's parts are imported from benchmarks/ (not an installed
package), as `python benchmarks/serving.py` itself does."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))


class WordTokenizer:
    """One token per whitespace-separated word: enough to test workload shapes without
    loading a real tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [hash(w) % 10_000 for w in text.split()] if text else []

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool,
                            tokenize: bool) -> str:
        assert not tokenize
        body = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return body + (" <assistant>" if add_generation_prompt else "")
