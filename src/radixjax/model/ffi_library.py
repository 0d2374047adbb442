"""Our C++ XLA FFI handlers (model/onednn.py, model/cpu_decode.py): each compiled on this
machine by g++ next to its source (`python -m radixjax.model.<module> --build`, which
scripts/setup.sh runs), then loaded and registered with XLA's CPU backend once per
process. Without its library a handler's module says so once and the program keeps its
XLA form."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from pathlib import Path

import jax

log = logging.getLogger(__name__)


def compile_handler(source: Path, library: Path, flags: list[str]) -> Path:
    """g++ source (against jaxlib's FFI headers) -> library; returns its path."""
    cmd = ["g++", "-std=c++17", "-shared", "-fPIC", "-isystem", str(jax.ffi.include_dir()),
           str(source), *flags, "-o", str(library)]
    subprocess.run(cmd, check=True)
    return library


def load_handlers(module: str, source: Path, library: Path, targets: dict[str, str],
                  without: str) -> ctypes.CDLL | None:
    """The built library, its FFI symbols registered as XLA CPU targets (target name ->
    symbol); None (and a warning: `without` says what runs instead) if not built.
    module: the Python module that builds it (radixjax.model.<module> --build)."""
    if not library.exists():
        log.warning("%s is not built (python -m %s --build): %s", library.name, module, without)
        return None
    if library.stat().st_mtime < source.stat().st_mtime:  # its functions may differ
        log.warning("%s is older than its source: not used, %s (rebuild it: python -m %s "
                    "--build)", library.name, without, module)
        return None
    try:
        lib = ctypes.CDLL(os.fspath(library))
        capsules = {t: jax.ffi.pycapsule(getattr(lib, s)) for t, s in targets.items()}
    except (OSError, AttributeError) as e:  # not loadable here, or another version
        log.warning("%s cannot be used (%s): %s (rebuild it: python -m %s --build)",
                    library.name, e, without, module)
        return None
    for target, capsule in capsules.items():
        jax.ffi.register_ffi_target(target, capsule, platform="cpu")
    return lib
