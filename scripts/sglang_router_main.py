"""SGLang's Rust router, started as `python -m sglang_router.launch_router` starts it
(RouterArgs from the same command line, then `Router.from_args(...).start()`), without
that module's import of its Python debugging balancer (sglang_router.mini_lb), which
imports the whole `sglang` package: ~13 s of CPU per router start on the 2-core VM. The
tests (tests/server/conftest.py) and the benchmarks (benchmarks/peers/servers.py) start
the router with it.

    python scripts/sglang_router_main.py --host H --port P [router arguments]
"""

from __future__ import annotations

import argparse
import sys

from sglang_router.router import Router
from sglang_router.router_args import RouterArgs


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args._validate_router_args()
    Router.from_args(args).start()


if __name__ == "__main__":
    main(sys.argv[1:])
