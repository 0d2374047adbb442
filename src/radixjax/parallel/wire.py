"""Messages between hosts in a form that cannot run code: a JSON outline of the value
and its numpy arrays in an .npz archive read with allow_pickle=False, signed with a
shared secret (HMAC-SHA256) when the cluster has one.

    message = MAGIC | mac [32 bytes, zeros without a secret] | len(outline) [4] | outline
              (JSON) | arrays (.npz)

The outline names each NamedTuple or dataclass by its class name, and a decoder only
builds the classes it was given (the step's argument types); any other name, a pickled
array, a bad signature or a malformed message is a WireError, before anything is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import json
import struct
from typing import Any

import numpy as np

MAGIC = b"RJW1"
MAC_BYTES = 32


class WireError(ValueError):
    """A message that is not one of ours: refused, nothing in it was built."""


class Wire:
    """Encoder and decoder over a fixed set of classes (NamedTuples and dataclasses whose
    fields hold None, bools, numbers, strings, tuples, lists, numpy arrays or these
    classes again)."""

    def __init__(self, types: tuple[type, ...], secret: bytes | None = None) -> None:
        self._types = {t.__name__: t for t in types}
        self._secret = secret

    # -- encode -----------------------------------------------------------------------------

    def encode(self, value: Any) -> bytes:
        arrays: list[np.ndarray] = []
        outline = json.dumps(self._outline(value, arrays)).encode()
        buf = io.BytesIO()
        np.savez(buf, *arrays)
        body = struct.pack("<I", len(outline)) + outline + buf.getvalue()
        return MAGIC + self._mac(body) + body

    def _outline(self, v: Any, arrays: list[np.ndarray]) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, np.ndarray | np.generic):
            arr = np.asarray(v)
            if arr.dtype == object:
                raise WireError("object arrays do not cross hosts")
            arrays.append(arr)
            return {"array": len(arrays) - 1}
        name = type(v).__name__
        if self._types.get(name) is type(v):
            if dataclasses.is_dataclass(v):
                fields = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
            else:
                fields = v._asdict()
            return {"type": name, "fields": {k: self._outline(x, arrays)
                                             for k, x in fields.items()}}
        if isinstance(v, tuple | list):
            return {"tuple" if isinstance(v, tuple) else "list":
                    [self._outline(x, arrays) for x in v]}
        raise WireError(f"a {name} does not cross hosts (not one of the wire's types)")

    # -- decode -----------------------------------------------------------------------------

    def decode(self, message: bytes) -> Any:
        if not message.startswith(MAGIC) or len(message) < len(MAGIC) + MAC_BYTES + 4:
            raise WireError("not a radixjax message")
        mac = message[len(MAGIC): len(MAGIC) + MAC_BYTES]
        body = message[len(MAGIC) + MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise WireError("the message's signature does not match this cluster's secret")
        (n,) = struct.unpack("<I", body[:4])
        try:
            outline = json.loads(body[4: 4 + n])
            with np.load(io.BytesIO(body[4 + n:]), allow_pickle=False) as npz:
                arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]
        except (ValueError, OSError, KeyError) as e:  # incl. a pickled array refused
            raise WireError(f"a malformed message: {e}") from e
        return self._build(outline, arrays)

    def _build(self, o: Any, arrays: list[np.ndarray]) -> Any:
        if o is None or isinstance(o, bool | int | float | str):
            return o
        if not isinstance(o, dict) or len(o) not in (1, 2):
            raise WireError("a malformed outline")
        if "array" in o:
            i = o["array"]
            if not isinstance(i, int) or not 0 <= i < len(arrays):
                raise WireError("an array index out of range")
            a = arrays[i]
            return a[()] if a.ndim == 0 else a
        if "tuple" in o or "list" in o:
            items = [self._build(x, arrays) for x in o.get("tuple", o.get("list"))]
            return tuple(items) if "tuple" in o else items
        cls = self._types.get(o.get("type"))
        if cls is None:
            raise WireError(f"a {o.get('type')!r} is not one of the wire's types")
        fields = o.get("fields")
        if not isinstance(fields, dict):
            raise WireError("a malformed outline")
        try:
            return cls(**{k: self._build(x, arrays) for k, x in fields.items()})
        except TypeError as e:  # fields the class does not have
            raise WireError(f"a malformed {cls.__name__}: {e}") from e

    def _mac(self, body: bytes) -> bytes:
        if self._secret is None:
            return bytes(MAC_BYTES)
        return hmac.new(self._secret, body, hashlib.sha256).digest()
