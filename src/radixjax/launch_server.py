"""python -m radixjax.launch_server: serve a model over an OpenAI-compatible HTTP API.

    python -m radixjax.launch_server                      # default SmolLM2-135M on :30000
    python -m radixjax.launch_server --model PATH --port 8000 --api-key secret
    python -m radixjax.launch_server --model QWEN3_MOE_DIR --tp 4 --ep 2   # 4 devices
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from radixjax.api.reasoning import REASONING_FORMATS
from radixjax.api.tool_formats import FORMATS
from radixjax.engine.config import (
    DISAGGREGATION_MODES,
    KV_CACHE_DTYPES,
    POLICIES,
    SPECULATIVE_ALGORITHMS,
)
from radixjax.engine.dp_router import DP_POLICIES
from radixjax.model.forms import ATTENTION_BACKENDS, MOE_DISPATCH, QUANTIZATIONS
from radixjax.server.limits import Limits

KEEP_ALIVE_S = 65  # idle HTTP keep-alive (s): longer than clients keep theirs (main)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m radixjax.launch_server", description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None,
                   help="HF model folder, .gguf file or gemma3-270m (its PyPI package); "
                        "default: SmolLM2-135M-Instruct GGUF")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the file or folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=os.environ.get("RADIXJAX_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (env RADIXJAX_API_KEY)")
    g = p.add_argument_group("memory and batching")
    g.add_argument("--num-slots", "--max-total-tokens", type=int, default=None,
                   help="KV pool size in tokens (default: room for one request of the whole "
                        "context and at least 16384, within --mem-fraction-static)")
    g.add_argument("--mem-fraction-static", type=float, default=0.5,
                   help="the most of the memory available after loading that a sized KV "
                        "pool may take")
    g.add_argument("--page-size", type=int, default=1, help="KV page size in tokens")
    g.add_argument("--max-running", type=int, default=32, help="max running requests")
    g.add_argument("--context-length", type=int, default=None,
                   help="max tokens per request (prompt + output; default: the model's)")
    g.add_argument("--max-prefill-tokens", type=int, default=1024,
                   help="max new tokens in one prefill step")
    g.add_argument("--chunk-size", type=int, default=512,
                   help="chunked prefill: max tokens of one request per step")
    g.add_argument("--swa-full-tokens-ratio", type=float, default=None,
                   help="sliding-window models: the window layers' own KV pool over "
                        "--num-slots (default: the least that never stalls a step)")
    g.add_argument("--disable-hybrid-swa-memory", action="store_true",
                   help="sliding-window models: keep every position's KV in every layer")
    g = p.add_argument_group("scheduling")
    g.add_argument("--policy", choices=POLICIES, default="lpm",
                   help="waiting-queue order: longest cached prefix, DFS weight, or FCFS")
    g.add_argument("--disable-radix-cache", action="store_true", help="no prefix reuse")
    g.add_argument("--disable-overlap", action="store_true",
                   help="process each step's results before dispatching the next")
    g.add_argument("--enable-mixed", action="store_true",
                   help="decode requests ride along in prefill steps")
    g = p.add_argument_group("model")
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weight dtype, and the KV dtype of unquantized weights unless "
                        "--kv-cache-dtype (float32 is faster on CPU)")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV pool dtype (auto: bfloat16 beside int8 layer products, else "
                        "--dtype); bfloat16 halves the pool and the bytes attention reads")
    g.add_argument("--quantization", choices=("auto", *QUANTIZATIONS), default="auto",
                   help="auto (the default): w8a16_int8 on one CPU device, else none; "
                        "none: float32 throughout, its KV too (the reference); "
                        "w8a16_int8: int8 layer weights, activations as two int8 parts "
                        "(perplexity +0.5 %% "
                        "against float32); w8a8_int8: per-token int8 activations "
                        "(faster prefill, perplexity +3.7 %%; benchmarks/README.md)")
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="auto: the Pallas kernels on a GPU, the jnp gather backend elsewhere")
    g.add_argument("--enable-deterministic-inference", action="store_true", default=None,
                   help="a request's answer does not depend on its batch, chunking or "
                        "cache hits (attention in one order per request); the default "
                        "wherever the native attention backend runs")
    g.add_argument("--disable-deterministic-inference", action="store_false",
                   dest="enable_deterministic_inference",
                   help="attention free to reorder with the batch (a shared-prefix pass "
                        "for prompts, faster prefill on shared prefixes)")
    g.add_argument("--no-warmup", action="store_true",
                   help="skip compiling the step buckets at start-up")
    g.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens when a request gives none")
    g.add_argument("--max-request-bytes", type=int, default=Limits.max_request_bytes,
                   help="larger request bodies get 413 before they are parsed")
    g.add_argument("--max-concurrent-requests", type=int,
                   default=Limits.max_concurrent_requests,
                   help="engine requests in progress (a body's prompts x n each); past "
                        "it, 503 with Retry-After")
    g.add_argument("--max-batch-requests", type=int, default=Limits.max_batch_requests,
                   help="engine requests one body may ask for (prompts x n); more is a 400")
    g.add_argument("--random-seed", type=int, default=None,
                   help="seeds of requests that give none derive from it (reproducible "
                        "runs); default: drawn from the OS at each start")
    g.add_argument("--enable-debug-endpoints", action="store_true",
                   help="POST /debug/inject_fault: the next step raises (tests)")
    g = p.add_argument_group("speculative decoding (docs/speculative.md)")
    g.add_argument("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS, default=None,
                   help="ngram: drafts from the radix tree (cached continuations of the "
                        "same context) and the request's own n-grams; standalone: from "
                        "a draft model; verified in one step, outputs are plain "
                        "decoding's, token for token")
    g.add_argument("--speculative-draft-model-path", default=None,
                   help="standalone: the draft model (HF folder or GGUF) sharing the "
                        "target's tokenizer")
    g.add_argument("--speculative-num-draft-tokens", type=int, default=15,
                   help="the most drafts a request verifies per step (fewer as its "
                        "acceptance says)")
    g.add_argument("--speculative-ngram-min-match-window-size", type=int, default=2,
                   help="shortest n-gram matched against the request's own tokens")
    g.add_argument("--speculative-ngram-max-match-window-size", type=int, default=4,
                   help="longest n-gram matched against the request's own tokens")
    g = p.add_argument_group("tool calls and reasoning (docs/server.md)")
    g.add_argument("--tool-call-parser", choices=sorted(FORMATS), default=None,
                   help="how the model writes tool calls; default: read off its chat "
                        "template (hermes when it says nothing)")
    g.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a jinja chat template file instead of the model's own (e.g. one "
                        "that renders tools)")
    g.add_argument("--reasoning-parser", choices=sorted(REASONING_FORMATS), default=None,
                   help="split <think> ... </think> into reasoning_content")
    g = p.add_argument_group("parallelism (docs/sharding.md)")
    g.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel devices: heads, MLP columns, vocab and KV pool "
                        "split over them (0: every visible device)")
    g.add_argument("--dp", "--dp-size", type=int, default=1,
                   help="data-parallel engine replicas, each on its own tp devices, behind "
                        "one HTTP front (docs/scale_out.md)")
    g.add_argument("--load-balance-method", choices=DP_POLICIES, default="cache_aware",
                   help="how --dp routes a request: by cache affinity balanced with load, "
                        "to the least loaded replica, or in turn")
    g.add_argument("--ep", type=int, default=1,
                   help="expert-parallel groups inside the TP group (MoE); must divide --tp")
    g.add_argument("--enable-dp-attention", action="store_true",
                   help="attention data-parallel: each of the --tp devices a DP rank with "
                        "its own requests, KV pool (--num-slots each) and radix cache; the "
                        "MLP / MoE still split over all (for MLA models); --dp, if given, "
                        "must equal --tp")
    g.add_argument("--moe-dispatch", choices=MOE_DISPATCH, default="psum",
                   help="EP: every device sums its experts' share of all tokens (psum), or "
                        "tokens travel to their experts' devices and back (all_to_all)")
    g = p.add_argument_group("prefill-decode disaggregation (docs/disaggregation.md)")
    g.add_argument("--disaggregation-mode", choices=DISAGGREGATION_MODES, default="null",
                   help="prefill: compute prompts and hand their KV over; decode: fetch "
                        "the KV from the prefill server named in each request, then decode")
    g.add_argument("--disaggregation-timeout", type=float, default=30.0,
                   help="seconds a room waits for its prefill, its fetch or its pull")
    g.add_argument("--disaggregation-prefill-hosts", nargs="+", default=[], metavar="HOST:PORT",
                   help="decode: the prefill servers (their HTTP HOST:PORT, as the router's "
                        "--prefill URLs) a request's bootstrap fields may name; any other "
                        "is refused with a 400 and never contacted")
    g.add_argument("--disaggregation-transfer-host", default="127.0.0.1",
                   help="the address this server's KV transfer server listens on and gives "
                        "its peers: one the other servers of the pair can reach")
    g = p.add_argument_group("multi-host on jax.distributed (docs/scale_out.md)")
    g.add_argument("--nnodes", type=int, default=1,
                   help="processes (hosts) in the cluster; --tp spans all their devices")
    g.add_argument("--node-rank", type=int, default=0,
                   help="this process's rank: 0 serves HTTP, the others follow its steps")
    g.add_argument("--dist-init-addr", default=None,
                   help="HOST:PORT of rank 0's jax.distributed coordination service (it "
                        "listens there only); an address other machines can reach needs "
                        "the same RADIXJAX_DIST_SECRET in every node's environment")
    g.add_argument("--dist-timeout", type=int, default=10,
                   help="seconds without a heartbeat after which a rank counts as dead")
    return p.parse_args(argv)


def pd_options(args: argparse.Namespace) -> Any:
    from radixjax.disagg.bootstrap import BootstrapError
    from radixjax.disagg.sides import PDOptions

    if args.disaggregation_mode == "decode" and not args.disaggregation_prefill_hosts:
        raise SystemExit("radixjax: a decode server needs --disaggregation-prefill-hosts "
                         "HOST:PORT ... (the prefill servers it may fetch KV from)")
    try:
        return PDOptions(tuple(args.disaggregation_prefill_hosts),
                         args.disaggregation_transfer_host, args.api_key)
    except BootstrapError as e:
        raise SystemExit(f"radixjax: --disaggregation-prefill-hosts: {e}") from e


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from radixjax.parallel.multihost import DistConfig, MultiHostError

    secret = os.environ.get("RADIXJAX_DIST_SECRET")
    try:
        dist = DistConfig(args.nnodes, args.node_rank, args.dist_init_addr, args.dist_timeout,
                          secret=secret.encode() if secret else None)
    except ValueError as e:
        raise SystemExit(f"radixjax: {e}") from e
    if dist.is_multihost and args.dp > 1:
        raise SystemExit("--dp with --nnodes is not supported: one engine spans the hosts")
    if args.enable_dp_attention:  # SGLang's --dp N --enable-dp-attention: N ranks, one engine
        if args.dp not in (1, args.tp):
            raise SystemExit("--enable-dp-attention makes each of the --tp devices a DP rank: "
                             "--dp must equal --tp")
        args.dp = 1
    import uvicorn

    from radixjax.disagg.sides import make_side
    from radixjax.engine.engine import Engine
    from radixjax.loaders import resolve_model_path
    from radixjax.server.app import create_app
    from radixjax.server.context import ServerConfig

    print("radixjax: loading the model, then compiling the step programs", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    engine = Engine(
        args.model, background=False, num_slots=args.num_slots, page_size=args.page_size,
        mem_fraction_static=args.mem_fraction_static,
        max_running=args.max_running, max_context=args.context_length,
        max_prefill_tokens=args.max_prefill_tokens, chunk_size=args.chunk_size,
        swa_full_tokens_ratio=args.swa_full_tokens_ratio,
        disable_hybrid_swa_memory=args.disable_hybrid_swa_memory, policy=args.policy,
        enable_cache=not args.disable_radix_cache,
        enable_overlap=not args.disable_overlap, enable_mixed=args.enable_mixed,
        dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization,
        attention_backend=args.attention_backend,
        enable_deterministic_inference=args.enable_deterministic_inference, tp=args.tp, ep=args.ep,
        moe_dispatch=args.moe_dispatch, enable_dp_attention=args.enable_dp_attention,
        seed=args.random_seed, disaggregation_mode=args.disaggregation_mode,
        disaggregation_timeout=args.disaggregation_timeout,
        speculative_algorithm=args.speculative_algorithm,
        speculative_draft_model_path=args.speculative_draft_model_path,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        speculative_ngram_min_match_window_size=args.speculative_ngram_min_match_window_size,
        speculative_ngram_max_match_window_size=args.speculative_ngram_max_match_window_size,
        **({"kv_handoff": partial(make_side, options=pd_options(args))}
           if args.disaggregation_mode != "null" else {}),
        warmup=not args.no_warmup,  # every step program, before /health answers
        **({"dist": dist} if dist.is_multihost else {}),
        **({"dp": args.dp, "dp_policy": args.load_balance_method} if args.dp > 1 else {}),
    )
    if args.chat_template and engine.tokenizer is not None:
        engine.tokenizer.chat_template = Path(args.chat_template).read_text()
    if not dist.is_leader:
        print(f"radixjax: rank {dist.node_rank} of {dist.nnodes} ready, following rank 0",
              file=sys.stderr, flush=True)
        try:
            fail_at = os.environ.get("RADIXJAX_DEBUG_FOLLOWER_FAIL_AT")  # test hook
            engine.follow(int(fail_at) if fail_at and args.enable_debug_endpoints else None)
        except MultiHostError as e:
            print(f"radixjax: rank {dist.node_rank}: {e}", file=sys.stderr, flush=True)
            # At once: jax's exit handler would wait at the shutdown barrier for a rank 0
            # that may be alive (this rank failed alone) and stuck waiting for this one.
            os._exit(1)
        return 0
    path = str(resolve_model_path(args.model))
    name = args.served_model_name or os.path.basename(path).removesuffix(".gguf")
    app = create_app(engine, ServerConfig(
        name, args.api_key, args.default_max_tokens, args.enable_debug_endpoints,
        Limits(args.max_request_bytes, args.max_concurrent_requests,
               args.max_batch_requests), model_path=path,
        tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser))
    print(f"radixjax: serving {name} on http://{args.host}:{args.port} "
          f"(ready in {time.perf_counter() - t0:.0f}s, "
          f"{getattr(engine, 'replicas', [engine])[0].runner.num_programs} step programs"
          f"{f', {args.dp} replicas' if args.dp > 1 else ''})", file=sys.stderr, flush=True)
    # Idle connections stay open past the 5 s after which httpx-based clients (openai,
    # radixjax.lang) drop theirs: with uvicorn's own 5 s the two timers race, and a request
    # sent on a connection the server is closing fails ("Server disconnected without
    # sending a response", seen once in the suite).
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_keep_alive=KEEP_ALIVE_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
