"""Writes tests/model/data/gemma3_270m_hf.npz: what HF transformers (torch, float32, eager
attention) computes from the Gemma 3 270M GGUF, for tests/model/test_gemma3_gguf.py.
HF's own load of the file (its dequantization and 262k-token tokenizer conversion) takes
~55 s on the 2-core VM, so the suite reads its numbers from here instead. Rerun after a
transformers upgrade:

    .venv/bin/python -m tests.model.gemma3_reference
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "data" / "gemma3_270m_hf.npz"
TEXTS = ["Hello, world!", "  leading spaces and\ttabs\nnewlines\r\n",
         "naïve café — déjà vu; Ελληνικά, русский, 日本語のテキスト",
         "code: def f(x):\n    return x**2  # comment", "numbers 1234567890 3.14159 -42"]
PROMPT = ("The Python Language Reference describes the syntax and core semantics of the "
          "language. It is terse, but attempts to be exact and complete. The semantics of")
TOP = 64  # logits kept per position: the largest, and their ids
NEW_TOKENS = 16


def main() -> None:
    import torch
    import transformers

    from radixjax.loaders import resolve_model_path

    path = resolve_model_path("gemma3-270m")
    kw = dict(gguf_file=path.name)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, dtype=torch.float32, attn_implementation="eager", **kw).eval()
    ids = tok(PROMPT).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    top_ids = np.argsort(-logits, axis=-1)[:, :TOP]
    texts = [np.asarray(tok(t).input_ids, np.int64) for t in TEXTS]
    np.savez_compressed(
        OUT, prompt_ids=np.asarray(ids, np.int64), top_ids=top_ids,
        top_logits=np.take_along_axis(logits, top_ids, axis=-1),
        greedy=out[0, len(ids):].numpy(),
        text_ids=np.concatenate(texts), text_lens=np.asarray([len(t) for t in texts]))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
