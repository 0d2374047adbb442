"""The in-jit bitmask against a numpy reference: random words (sign bit included), a
vocabulary that is not a multiple of 32, all-ones rows untouched."""

from __future__ import annotations

import numpy as np

from radixjax.sampling.bitmask import apply_token_bitmask, bitmask_width


def test_bitmask_matches_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    b, vocab = 4, 70  # 3 words, the last one partly past the vocabulary
    logits = rng.normal(size=(b, vocab)).astype(np.float32)
    mask = rng.integers(-(2**31), 2**31, size=(b, bitmask_width(vocab)), dtype=np.int64)
    mask = mask.astype(np.int32)
    mask[0] = -1  # an unconstrained row
    mask[1, 1] = np.int32(-(2**31))  # only bit 31 of word 1: token 63
    bits = np.unpackbits(mask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    want = np.where(bits.astype(bool), logits, -np.inf)
    got = np.asarray(apply_token_bitmask(logits, mask))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[0], logits[0])
    assert np.isfinite(got[1, 63]) and not np.isfinite(got[1, 32:63]).any()
