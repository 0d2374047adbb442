"""Structured output without torch: in a fresh interpreter where `import torch` fails
(torch is only a test dependency), xgrammar's modules load through radixjax.grammar.xgr,
compile a schema for the default model's tokenizer, and fill a numpy bitmask that allows
exactly the tokens a JSON object can start with."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    import numpy as np
    from radixjax.grammar.backend import GrammarBackend
    from radixjax.grammar import xgr
    from radixjax.loaders import load_model
    from radixjax.sampling.bitmask import bitmask_width

    m = load_model(None)
    backend = GrammarBackend(m.tokenizer, m.cfg.vocab_size, (m.tokenizer.eos_token_id,))
    key = ("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}', True)
    compiled = backend.compile(key)
    size = backend.cache_size_bytes
    assert backend.compile(key) is not None and backend.cache_size_bytes == size  # cached
    matcher = backend.matcher(compiled)
    mask = np.zeros((3, bitmask_width(m.cfg.vocab_size)), np.int32)
    matcher.fill_bitmask(mask, 1)
    bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")
    allowed = np.flatnonzero(bits[1][: m.cfg.vocab_size])
    texts = [m.tokenizer.decode([int(t)]) for t in allowed]
    assert not bits[0].any() and not bits[2].any(), "only row 1 is written"
    assert texts and all(t.startswith("{") for t in texts), texts
    assert "torch" not in [k for k, v in sys.modules.items() if v is not None]
    # The compiled-grammar cache is bounded: past the limit the least recently used go.
    schemas = [("json_schema", '{"type": "object", "properties": {"k%d": {"type": "string", '
                '"maxLength": %d}}}' % (i, i + 3), True) for i in range(12)]
    sizes = {}
    for limit in (1 << 30, 150_000):
        b = GrammarBackend(m.tokenizer, m.cfg.vocab_size, (m.tokenizer.eos_token_id,),
                           cache_limit_bytes=limit)
        for key in schemas:
            b.compile(key)
        sizes[limit] = b.cache_size_bytes
    assert sizes[150_000] < 2 * 150_000 < sizes[1 << 30] / 3, sizes  # ~1 MB unbounded
    print("ok", xgr.load().version, len(texts))
""")


def test_grammar_works_without_torch() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok 0.2.9")
