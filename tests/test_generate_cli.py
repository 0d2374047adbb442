"""The README's run command path: `python -m radixjax.cli`."""

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


def test_cli_tp_and_ep_give_the_single_device_text(tmp_path) -> None:
    """--tp / --ep on the CLI, on a fake 8-device CPU mesh and a tiny Qwen3-MoE folder:
    the greedy text equals the single-device text, and a bad layout is a clear error."""
    import os

    from tests.tiny_models import EIGHT_CPU_DEVICES_XLA_FLAGS, save_char_tokenizer, save_tiny_model

    folder = save_char_tokenizer(save_tiny_model("qwen3_moe", tmp_path / "m"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=EIGHT_CPU_DEVICES_XLA_FLAGS)

    def cli(*flags: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "radixjax.cli", "--model", str(folder), "--raw",
             "--prompt", "hello world", "--max-tokens", "8", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def result(proc: subprocess.Popen) -> tuple[int, str, str]:
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err

    # the three at once: each compiles on one core
    single, sharded, bad = map(result, [cli(), cli("--tp", "4", "--ep", "2"),
                                        cli("--tp", "3", "--ep", "2")])
    assert single[0] == 0 and sharded[0] == 0, sharded[2]
    assert single[1].rstrip("\n")  # some text: one character per token
    assert sharded[1] == single[1]
    assert bad[0] == 2 and "Traceback" not in bad[2], bad[2]
