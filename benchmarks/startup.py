"""Server start-up time, as `make serve` pays it: cold (an empty compile cache) and warm
(a restart on the cache the cold start filled), and how many step programs it compiles;
this tree next to another revision, side by side in one run.

    .venv/bin/python benchmarks/startup.py [--base REV] [--args ...launch_server flags]

The time is from process start to the first 200 from /health (model load + warm-up).
--base REV runs the same measurement on REV, checked out in a temporary git worktree.
The program count is the total of the warm-up progress bar in the server's log.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_once(tree: Path, cache: str, extra: list[str]) -> tuple[float, int | None]:
    """Seconds until /health answers 200, and the warm-up's program count."""
    port = free_port()
    env = dict(os.environ, RADIXJAX_JAX_CACHE=cache, PYTHONPATH=f"{tree / 'src'}:{tree}")
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "radixjax.launch_server", "--port",
                                 str(port), *extra], cwd=tree, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"server exited:\n{log.read()[-2000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            seconds = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        log.seek(0)
        totals = re.findall(r"\| *\d+/(\d+) \[", log.read())
    return seconds, int(totals[-1]) if totals else None


def measure(tree: Path, extra: list[str]) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory() as cache:
        cold, programs = start_once(tree, cache, extra)
        warm, _ = start_once(tree, cache, extra)
    return {"cold_s": cold, "warm_s": warm, "programs": programs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="git revision to compare against (the 'before')")
    ap.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                    help="launch_server flags (default: make serve's, i.e. none)")
    args = ap.parse_args()
    rows = {}
    if args.base:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "rev"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.base],
                           check=True, cwd=ROOT, capture_output=True)
            try:
                rows[f"before ({args.base})"] = measure(tree, args.args)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               check=False, capture_output=True)
    rows["after (this tree)"] = measure(ROOT, args.args)
    print("| revision | cold start s | warm restart s | step programs |")
    print("|---|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['cold_s']:.0f} | {r['warm_s']:.0f} | {r['programs']} |")


if __name__ == "__main__":
    main()
