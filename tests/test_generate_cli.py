"""The README's run command path: `python -m radixjax.generate` with the default model."""

from __future__ import annotations

import subprocess
import sys


def test_cli_generates_text_with_the_default_model() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "radixjax.cli", "--prompt", "What is 2+2?",
         "--max-tokens", "12"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip()) > 0
    assert "tokens in" in proc.stderr


def test_cli_rejects_a_missing_model() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "radixjax.cli", "--prompt", "x", "--model", "/nonexistent"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert "error: ModelNotFoundError" in proc.stderr and "Traceback" not in proc.stderr
