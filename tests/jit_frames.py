"""Keep XLA's JIT unwind tables away from libgcc in the test processes (tests/native/
no_jit_frames.c says why): compiled once into the build folder, loaded RTLD_GLOBAL
before jaxlib so its __register_frame calls resolve to the stub."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).parent / "native" / "no_jit_frames.c"
LIB = Path(__file__).parents[1] / "build" / "no_jit_frames.so"


def install() -> ctypes.CDLL | None:
    """Load the stub (building it if missing or stale); None where it cannot be (no C
    compiler, not Linux) or jaxlib was imported first (then it would not take)."""
    if not sys.platform.startswith("linux") or "jaxlib" in sys.modules:
        return None
    if not LIB.exists() or LIB.stat().st_mtime < SOURCE.stat().st_mtime:
        LIB.parent.mkdir(exist_ok=True)
        tmp = LIB.with_suffix(f".{os.getpid()}.so")  # (xdist workers may race here)
        try:
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        os.replace(tmp, LIB)
    return ctypes.CDLL(str(LIB), mode=ctypes.RTLD_GLOBAL)
