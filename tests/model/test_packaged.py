"""--model names of GGUFs shipped as raw part wheels (loaders/packaged.py): the parts are
found by import name, joined in order once, checked against the file's SHA-256 (a wrong
or missing part is a clear error, never a half-written file), and found again after."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from radixjax.loaders.packaged import PACKAGED_MODELS, ModelNotFoundError, Parts, assemble_parts


def _fake_parts(root: Path, prefix: str, chunks: list[bytes]) -> None:
    for i, chunk in enumerate(chunks, 1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('a part is never imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)


def test_parts_join_once_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"GGUF" + bytes(range(200)), bytes(1000), b"tail"]
    whole = b"".join(chunks)
    _fake_parts(tmp_path / "site", "rjfake_part", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = Parts("rjfake_part", 3, "fake.gguf", len(whole), hashlib.sha256(whole).hexdigest(),
                 "fake")
    out = assemble_parts(spec, tmp_path / "cache")
    assert out.read_bytes() == whole
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())  # no temp left
    (tmp_path / "site" / "rjfake_part2" / "data" / "part02.bin").unlink()  # found again:
    assert assemble_parts(spec, tmp_path / "cache") == out  # the parts are not read
    assert not any(m.startswith("rjfake_part") for m in sys.modules)


def test_a_wrong_or_missing_part_is_a_clear_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_parts(tmp_path / "site", "rjbad_part", [b"abc", b"def"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    wrong = Parts("rjbad_part", 2, "bad.gguf", 6, "0" * 64, "bad")
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        assemble_parts(wrong, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())
    missing = wrong._replace(count=3)
    with pytest.raises(ModelNotFoundError, match=r"rjbad_part3 is not installed.*radixjax\[bad\]"):
        assemble_parts(missing, tmp_path / "cache")


def test_the_qwen_names_are_known() -> None:
    for name, size in (("qwen2.5-coder-1.5b", 1_117_320_768), ("qwen2.5-coder-0.5b", 491_400_064)):
        entry = PACKAGED_MODELS[name]
        assert isinstance(entry, Parts) and entry.size == size and len(entry.sha256) == 64
