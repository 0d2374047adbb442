"""A GGUF matrix's blocks as planes a GPU kernel reads (gguf_matmul.py), on the host.

Every type the CPU kernel multiplies (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K) is one
formula over unsigned codes of `bits` bits, in groups of `group` values along K, inside
super-blocks of `sblock` values (a K-quant's 256; a legacy type's block is its group):

    w = (d[sb] * s[g]) * (code - off) + dm[sb] * mn[g]

d, dm: the file's f16 scales as they are (a K-quant's dmin negated, so one form adds);
s, mn: a K-quant's 6-bit / int8 sub-block scales and mins (absent: 1, or no dm term).
Computed in f32 in this order, every w is the gguf package's dequantized value, bit for
bit. The codes, [N, K] each:

    bits 8      codes [N, K] u8
    bits 4-6    nib [N, K / 2] u8: byte p * group + j holds value j of group 2p (low
                nibble) and of group 2p + 1 (high nibble)
    bits 5, 6   hi [N, K / 4] u8: byte q * group + j holds the bits above the nibble of
                value j of groups 4q .. 4q + 3, two bits each (group 4q + b at bit 2b)

so the kernel takes a group's codes with one load, a shift and a mask, whatever its
type. Bits a weight (file): Q4_K 4.63 (4.5), Q6_K 6.56 (6.56), Q5_K 6.63 (5.5), Q4_0 4.5
(4.5), Q4_1 5 (5), Q5_0 6.5 (5.5), Q8_0 8.5 (8.5): never a float copy, never near bf16's 16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import jax
import numpy as np


class Form(NamedTuple):
    """What a matrix's planes hold (the module docstring's formula)."""

    bits: int  # code bits: 4, 5, 6 or 8
    group: int  # values a sub-scale (s, mn) covers
    sblock: int  # values a d / dm covers
    off: int  # subtracted from every code
    scales: bool  # an s plane
    mins: int  # 0: no dm term; 1: dm alone (legacy min); 2: dm * mn (K-quants)


FORMS = {  # GGML type id -> its own form
    2: Form(4, 32, 32, 8, False, 0),  # Q4_0
    3: Form(4, 32, 32, 0, False, 1),  # Q4_1
    6: Form(5, 32, 32, 16, False, 0),  # Q5_0
    7: Form(5, 32, 32, 0, False, 1),  # Q5_1
    8: Form(8, 32, 32, 128, False, 0),  # Q8_0 (codes stored + 128)
    12: Form(4, 32, 256, 0, True, 2),  # Q4_K
    13: Form(5, 32, 256, 0, True, 2),  # Q5_K
    14: Form(6, 16, 256, 32, True, 0),  # Q6_K
}
FILE_BYTES = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 12: 144, 13: 176, 14: 210}  # a block's


def common_form(forms: list[Form]) -> Form:
    """The least form every one of `forms` converts to exactly (a stacked layer group
    whose layers differ in type: Q4_K_M's Q4_K and Q6_K ffn_down -> 6 bits, groups of
    16, codes offset by 32, with mins)."""
    out = Form(max(f.bits for f in forms), min(f.group for f in forms),
               min(f.sblock for f in forms), max(f.off for f in forms),
               any(f.scales for f in forms) or len({f.group for f in forms}) > 1,
               max(f.mins for f in forms))
    for f in forms:
        if (1 << f.bits) - 1 + out.off - f.off >= 1 << out.bits:
            raise ValueError(f"no common form for {forms}")
    return out


@partial(jax.tree_util.register_dataclass,
         data_fields=["codes", "hi", "d", "s", "dm", "mn"], meta_fields=["form", "n", "k"])
@dataclass(frozen=True)
class Planes:
    """One matrix [n, k] as planes of a form (module docstring); numpy on the host, jax
    arrays once put on a device (a pytree's leaves are the arrays; a stack of layers'
    planes has a leading layer axis)."""

    form: Form
    n: int
    k: int
    codes: object  # [N, K] u8 (8 bits) or nib [N, K / 2] u8
    hi: object | None  # [N, K / 4] u8 (5 and 6 bits)
    d: object  # [N, K / sblock] f16
    s: object | None  # [N, K / group] i8 (form.scales)
    dm: object | None  # [N, K / sblock] f16 (form.mins >= 1)
    mn: object | None  # [N, K / group] i8 (form.mins == 2)

    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize
                   for a in (self.codes, self.hi, self.d, self.s, self.dm, self.mn)
                   if a is not None)


class Parts(NamedTuple):
    """A matrix's fields unpacked, in some form: codes [N, K] (unsigned), d and dm
    [N, K / sblock] f16, s and mn [N, K / group] i8 (absent: None)."""

    codes: np.ndarray
    d: np.ndarray
    s: np.ndarray | None
    dm: np.ndarray | None
    mn: np.ndarray | None


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] u8 -> [...] f16."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., m] u8 -> [..., 2m]: the m low nibbles, then the m high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _k_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 scale bytes [..., 12] -> 6-bit scales, mins [..., 8]."""
    s = sc.astype(np.uint8)
    lo, hi = s[..., :4] & 63, s[..., 4:8] & 63
    sc8 = np.concatenate([lo, (s[..., 8:] & 15) | ((s[..., :4] >> 6) << 4)], axis=-1)
    m8 = np.concatenate([hi, (s[..., 8:] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc8, m8


def _decode(raw: np.ndarray, qtype: int) -> tuple:
    """File blocks [N, nb, bytes] -> codes [N, nb, sblock] (unsigned), d, s, dm, mn."""
    b = raw
    s = dm = mn = None
    if qtype in (2, 3, 6, 7):  # legacy: d (m) (qh u32) qs[16]
        d = _f16(b[..., 0:2])
        at = 2
        if qtype in (3, 7):
            dm, at = _f16(b[..., 2:4]), 4
        high = None
        if qtype in (6, 7):
            qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")[..., 0]
            high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
            at += 4
        codes = _nibbles(b[..., at:at + 16])
        if high is not None:
            codes = codes | (high.astype(np.uint8) << 4)
    elif qtype == 8:  # Q8_0: d qs[32] (int8)
        d = _f16(b[..., 0:2])
        codes = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    elif qtype in (12, 13):  # Q4_K / Q5_K: d dmin scales[12] (qh[32]) qs[128]
        d, dm = _f16(b[..., 0:2]), -_f16(b[..., 2:4])
        s, mn = _k_scales(b[..., 4:16])
        at = 16 + (32 if qtype == 13 else 0)
        qs = b[..., at:at + 128].reshape(*b.shape[:-1], 4, 32)
        codes = _nibbles(qs).reshape(*b.shape[:-1], 256)  # chunk c: groups 2c, 2c + 1
        if qtype == 13:
            qh = b[..., 16:48]  # [.., 32]: bit g of byte j is value j of group g's 5th
            high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
            codes = codes | (high.reshape(*b.shape[:-1], 256) << 4)
    elif qtype == 14:  # Q6_K: ql[128] qh[64] scales[16] (int8) d
        ql = b[..., :128].reshape(*b.shape[:-1], 2, 64)
        qh = b[..., 128:192].reshape(*b.shape[:-1], 2, 32)
        lo = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4,
                       ql[..., 32:] >> 4], axis=-2)  # [.., 2 halves, 4, 32]
        hb = np.stack([(qh >> (2 * i)) & 3 for i in range(4)], axis=-2)
        codes = (lo | (hb << 4)).reshape(*b.shape[:-1], 256)
        s = b[..., 192:208].view(np.int8)
        d = _f16(b[..., 208:210])
    else:
        raise ValueError(f"no GPU planes for GGML type {qtype}")
    return codes, d, s, dm, mn


def fits(form: Form, k: int) -> bool:
    """Whether rows of k values have planes in `form`: whole super-blocks, and whole
    pairs of groups (the nibble plane) or quads (the high plane of 5 and 6 bits)."""
    per = (4 if form.bits in (5, 6) else 2) * form.group
    return k % form.sblock == 0 and k % per == 0


def _convert(p: Parts, src: Form, dst: Form) -> Parts:
    """Parts of form src -> the same weights (bit for bit) in form dst."""
    n, k = p.codes.shape

    def per(a: np.ndarray | None, size: int, fill: int | None, dtype) -> np.ndarray | None:
        """A field per `size` values in src -> per `size` values in dst (absent: fill)."""
        width = k // size
        if a is None:
            return None if fill is None else np.full((n, width), fill, dtype)
        return np.repeat(a, width // a.shape[1], axis=1)

    codes = (p.codes.astype(np.int16) + (dst.off - src.off)).astype(np.uint8)
    d = per(p.d, dst.sblock, None, np.float16)
    s = per(p.s, dst.group, 1, np.int8) if dst.scales else None
    dm = per(p.dm, dst.sblock, 0, np.float16) if dst.mins else None
    mn = per(p.mn, dst.group, 1 if src.mins == 1 else 0, np.int8) if dst.mins == 2 else None
    return Parts(codes, d, s, dm, mn)


def _encode(p: Parts, form: Form) -> Planes:
    n, k = p.codes.shape
    if not fits(form, k):
        raise ValueError(f"K = {k} does not fit the form {form}'s planes")
    c = p.codes.reshape(n, k // form.group, form.group)  # [N, groups, G]
    hi = None
    if form.bits == 8:
        plane = c.reshape(n, k)
    else:
        pairs = c.reshape(n, -1, 2, form.group) & 15
        plane = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, k // 2)
        if form.bits > 4:
            quads = (c.reshape(n, -1, 4, form.group) >> 4) & 3
            shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
            hi = np.bitwise_or.reduce(quads << shifts, axis=2).astype(np.uint8).reshape(n, k // 4)
    return Planes(form, n, k, np.ascontiguousarray(plane), hi,
                  *(None if a is None else np.ascontiguousarray(a) for a in p[1:]))


def to_planes(raw: np.ndarray, qtype: int, k: int, form: Form | None = None) -> Planes:
    """The file's rows of one matrix ([N, row bytes] u8, or flat) -> Planes, in the
    type's own form or in `form` (one every layer of a stack converts to)."""
    own = FORMS.get(qtype)
    if own is None:
        raise ValueError(f"no GPU planes for GGML type {qtype}")
    if k % own.sblock:
        raise ValueError(f"K = {k} does not fit GGML type {qtype}")
    raw = np.asarray(raw, np.uint8).reshape(-1, k // own.sblock, FILE_BYTES[qtype])
    n = raw.shape[0]
    codes, d, s, dm, mn = _decode(raw, qtype)

    def flat(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a.reshape(n, -1)

    parts = Parts(codes.reshape(n, k).astype(np.uint8), flat(d), flat(s), flat(dm), flat(mn))
    return _encode(_convert(parts, own, form or own), form or own)


def to_form(p: Planes, form: Form) -> Planes:
    """The same matrix (its rows as they are, padded or not) in another form."""
    if p.form == form:
        return p
    codes = np.asarray(_codes(p)).reshape(-1, p.k).astype(np.uint8)
    parts = Parts(codes, *(None if a is None else np.asarray(a) for a in (p.d, p.s, p.dm, p.mn)))
    return replace(_encode(_convert(parts, p.form, form), form), n=p.n)


def _codes(p: Planes, xp=np):
    """Planes -> codes [N, groups, G] int32 (unsigned)."""
    form = p.form
    g = p.k // form.group
    groups = xp.arange(g)
    rows = p.codes.shape[0]  # p.n, or more where padded
    if form.bits == 8:
        return p.codes.reshape(rows, g, form.group).astype(xp.int32)
    nib = p.codes.reshape(rows, g // 2, form.group).astype(xp.int32)
    code = (nib[:, groups // 2] >> (4 * (groups % 2))[None, :, None]) & 15
    if form.bits > 4:
        hb = p.hi.reshape(rows, g // 4, form.group).astype(xp.int32)
        code = code | (((hb[:, groups // 4] >> (2 * (groups % 4))[None, :, None]) & 3) << 4)
    return code


def dequantize(p: Planes, xp=np):
    """Planes -> [N, K] f32 (the gguf package's values, bit for bit); xp: numpy or jnp
    (an embedding's gathered rows; the kernel's reference in tests)."""
    form = p.form
    code = _codes(p, xp)
    sb = xp.arange(p.k // form.group) // (form.sblock // form.group)
    scale = p.d.astype(xp.float32)[:, sb]  # [N, groups]
    if p.s is not None:
        scale = scale * p.s.astype(xp.float32)
    w = scale[:, :, None] * (code - form.off).astype(xp.float32)
    if p.dm is not None:
        mins = p.dm.astype(xp.float32)[:, sb]
        if p.mn is not None:
            mins = mins * p.mn.astype(xp.float32)
        w = w + mins[:, :, None]
    return w.reshape(-1, p.k)
