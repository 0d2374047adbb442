"""The servers the comparison starts, one at a time, on loopback: ours (its default
form, float32, and the other forms by name), llama.cpp's llama-server, and the HF
transformers baseline, all on the same SmolLM2 GGUF."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from radixjax.loaders import resolve_model_path

PEERS = Path(__file__).resolve().parent
REPO = PEERS.parents[1]


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: tuple[str, ...]
    port: int
    # untimed requests before each cell (serving.py --warmup-requests): the whole
    # workload, so ours has compiled every step shape the cell will dispatch (prefix hits
    # make extend shapes that start-up does not compile). HF generates one request at a
    # time and compiles nothing, so 2 do.
    warmup_requests: str = "all"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def server_specs(parallel: int, base_port: int = 30100,
                 model: str | None = None) -> dict[str, ServerSpec]:
    """model: a GGUF path or a packaged name (loaders.resolve_model_path) every server
    loads; None: the default SmolLM2 (the HF peer always serves its own)."""
    py = sys.executable
    ours = (py, "-m", "radixjax.launch_server", "--host", "127.0.0.1", "--max-running",
            str(max(parallel, 16)), *(("--model", model) if model else ()))
    gguf = () if model is None else ("--model", str(resolve_model_path(model)))
    return {
        # the default form (EngineConfig's "auto": w8a16_int8, bf16 KV, deterministic)
        "ours": ServerSpec("ours", (*ours, "--port", str(base_port)), base_port),
        # float32 throughout, one flag away (deterministic, as by default)
        "ours-f32": ServerSpec("ours-f32", (*ours, "--port", str(base_port + 10),
                                            "--quantization", "none"), base_port + 10),
        # the forms below name every choice that the default would make otherwise
        "ours-w8a8": ServerSpec("ours-w8a8", (
            *ours, "--port", str(base_port + 3), "--quantization", "w8a8_int8",
            "--kv-cache-dtype", "float32", "--disable-deterministic-inference"),
            base_port + 3),
        # and a bf16 KV pool (half the bytes attention reads)
        "ours-w8a8-bf16kv": ServerSpec("ours-w8a8-bf16kv", (
            *ours, "--port", str(base_port + 5), "--quantization", "w8a8_int8",
            "--kv-cache-dtype", "bfloat16", "--disable-deterministic-inference"),
            base_port + 5),
        # the activations as two int8 parts (perplexity within 0.5 % of f32), f32 KV
        "ours-w8a16": ServerSpec("ours-w8a16", (
            *ours, "--port", str(base_port + 6), "--quantization", "w8a16_int8",
            "--kv-cache-dtype", "float32", "--disable-deterministic-inference"),
            base_port + 6),
        "ours-w8a16-det": ServerSpec("ours-w8a16-det", (
            *ours, "--port", str(base_port + 8), "--quantization", "w8a16_int8",
            "--kv-cache-dtype", "float32", "--enable-deterministic-inference"),
            base_port + 8),
        "ours-w8a16-bf16kv": ServerSpec("ours-w8a16-bf16kv", (
            *ours, "--port", str(base_port + 7), "--quantization", "w8a16_int8",
            "--kv-cache-dtype", "bfloat16", "--disable-deterministic-inference"),
            base_port + 7),
        # decode requests ride along in prefill steps
        "ours-w8a8-mixed": ServerSpec("ours-w8a8-mixed", (
            *ours, "--port", str(base_port + 4), "--quantization", "w8a8_int8",
            "--kv-cache-dtype", "float32", "--disable-deterministic-inference",
            "--enable-mixed"), base_port + 4),
        "llama.cpp": ServerSpec("llama.cpp", ("bash", str(PEERS / "start_llama_server.sh"),
                                              "--port", str(base_port + 1), "--parallel",
                                              str(parallel), *gguf), base_port + 1),
        "hf": ServerSpec("hf", (py, str(PEERS / "hf_server.py"), "--port",
                                str(base_port + 2)), base_port + 2, warmup_requests="2"),
    }


class RunningServer:
    """A started server process; `stop()` ends it (and only it)."""

    def __init__(self, spec: ServerSpec, log: Path, timeout: float = 600.0) -> None:
        self.spec = spec
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("w")
        self.proc = subprocess.Popen(spec.command, cwd=REPO, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self.startup_s = self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited ({self.proc.returncode}); "
                                   f"see {self._log.name}")
            try:
                if httpx.get(self.spec.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.spec.name} not healthy after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_ours(name: str, port: int, flags: list[str], log_dir: Path,
               warm: Callable[[str], None]) -> RunningServer:
    """Our server with these flags, warmed by `warm(url)` (untimed requests), then its
    radix cache flushed: every measured run starts from the same warm, empty state."""
    cmd = (sys.executable, "-m", "radixjax.launch_server", "--host", "127.0.0.1", "--port",
           str(port), *flags)
    server = RunningServer(ServerSpec(name, cmd, port), log_dir / f"{name}.log")
    warm(server.spec.url)
    httpx.post(server.spec.url + "/flush_cache", timeout=60).raise_for_status()
    return server


def start_router(port: int, args: list[str], log: Path) -> subprocess.Popen:
    """SGLang's router (sglang-router, its Rust binary) on loopback with these arguments
    (policy, workers, or PD mode), once it answers /health."""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "sglang_router_main.py"), "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-port", str(port + 50), *args],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(240):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the router did not start; see {log}")


def stop_router(proc: subprocess.Popen) -> None:
    """The router ignores SIGTERM: SIGINT."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
