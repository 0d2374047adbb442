"""The HF transformers baseline: a small OpenAI-compatible server around
`model.generate` with a TextIteratorStreamer, on the same GGUF as ours (transformers
dequantizes it; loading a GGUF needs `accelerate`). One request at a time (a lock):
transformers has no continuous batching, so this is the no-serving-engine baseline.

    .venv/bin/python benchmarks/peers/hf_server.py --port 30002 [--model PATH.gguf]

Endpoints: GET /health, GET /v1/models, POST /v1/completions and /v1/chat/completions
(stream or not; greedy when temperature is 0; `ignore_eos` honoured as
min_new_tokens = max_tokens; `stream_options.include_usage`). Test/bench only: needs
torch (the `test` extra)."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30002)
    p.add_argument("--model", default=None, help="GGUF file (default: radixjax's default)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    return p.parse_args()


class HFGenerator:
    """Model + tokenizer; `stream()` runs one generate at a time in a worker thread."""

    def __init__(self, gguf: Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.name = gguf.stem
        self.tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
        self.lock = asyncio.Lock()

    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            text = self.tok.apply_chat_template(body["messages"], add_generation_prompt=True,
                                                tokenize=False)
            return self.tok(text, add_special_tokens=False).input_ids
        return self.tok(body["prompt"]).input_ids

    async def stream(self, ids: list[int], max_tokens: int, temperature: float,
                     ignore_eos: bool, out: dict[str, int]) -> AsyncIterator[str]:
        """Text pieces as generate produces them; out["completion_tokens"] when done."""
        import torch
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tok, skip_prompt=True, skip_special_tokens=True)
        kwargs: dict[str, Any] = dict(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=int),
            max_new_tokens=max_tokens, streamer=streamer,
            pad_token_id=self.tok.eos_token_id,
            do_sample=temperature > 0, **({"temperature": temperature} if temperature > 0
                                          else {"top_p": None, "top_k": None}))
        if ignore_eos:
            kwargs["min_new_tokens"] = max_tokens

        def run() -> None:
            with torch.inference_mode():
                seq = self.model.generate(**kwargs)
            out["completion_tokens"] = int(seq.shape[1]) - len(ids)

        async with self.lock:
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            pieces = iter(streamer)
            while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
                if piece:
                    yield piece
            await asyncio.to_thread(worker.join)


def create_app(gen: HFGenerator) -> Starlette:
    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": gen.name, "object": "model", "owned_by": "hf-transformers"}]})

    def endpoint(is_chat: bool):
        async def handle(request: Request):
            body = await request.json()
            fmt = body.get("response_format")
            if fmt not in (None, {"type": "text"}):
                return JSONResponse({"error": {"message": "response_format is not supported",
                                               "type": "invalid_request_error"}}, 400)
            ids = gen.prompt_ids(body)
            max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
            args = (ids, max_tokens, float(body.get("temperature", 1.0)),
                    bool(body.get("ignore_eos", False)))
            rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
            kind = "chat.completion" if is_chat else "text_completion"

            def usage(n: int) -> dict[str, int]:
                return {"prompt_tokens": len(ids), "completion_tokens": n,
                        "total_tokens": len(ids) + n}

            def choice(text: str, finish: str | None, chunk: bool) -> dict[str, Any]:
                if not is_chat:
                    return {"index": 0, "text": text, "finish_reason": finish}
                key = "delta" if chunk else "message"
                return {"index": 0, key: {"role": "assistant", "content": text},
                        "finish_reason": finish}

            def finish(n: int) -> str:
                return "length" if n >= max_tokens else "stop"

            if not body.get("stream"):
                out: dict[str, int] = {}
                text = "".join([p async for p in gen.stream(*args, out)])
                n = out["completion_tokens"]
                return JSONResponse({"id": rid, "object": kind, "created": created,
                                     "model": gen.name, "usage": usage(n),
                                     "choices": [choice(text, finish(n), False)]})

            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunk_kind = kind + ".chunk" if is_chat else kind

            async def sse() -> AsyncIterator[str]:
                out: dict[str, int] = {}
                head = {"id": rid, "object": chunk_kind, "created": created,
                        "model": gen.name}
                async for piece in gen.stream(*args, out):
                    yield f"data: {json.dumps(head | {'choices': [choice(piece, None, True)]})}\n\n"
                n = out["completion_tokens"]
                yield f"data: {json.dumps(head | {'choices': [choice('', finish(n), True)]})}\n\n"
                if include_usage:
                    yield f"data: {json.dumps(head | {'choices': [], 'usage': usage(n)})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")
        return handle

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", endpoint(False), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(True), methods=["POST"]),
    ])


def main() -> None:
    args = parse_args()
    if args.model:
        gguf = Path(args.model)
    else:
        from radixjax.loaders import default_model_path

        gguf = default_model_path()
    uvicorn.run(create_app(HFGenerator(gguf, args.threads)), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
