"""SGLang's native /generate, field for field, over an Engine: the request's parsing, its
items (a batch is a list in, a list out; n samples per prompt), and each output's
`meta_info`. Shared by the HTTP server (server/app.py) and radixjax.lang's in-process
backend, so both answer a program the same way.

    body -> parse_generate -> NativeBatch [items]  -- run (per item: ids, sampling) -->
         GenerateOutput per item -> response(item, out) -> {"text", "output_ids", "meta_info"}

Logprob entries are SGLang's [logprob, token_id, text or None]; a prompt's position 0 has
logprob None (nothing predicts it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from radixjax.api.errors import APIError, bad
from radixjax.disagg.bootstrap import FIELDS as BOOTSTRAP_FIELDS
from radixjax.disagg.bootstrap import Bootstrap, BootstrapError, parse_bootstrap
from radixjax.engine.output import GenerateOutput, StreamChunk
from radixjax.sampling.params import MAX_TOP_LOGPROBS, SamplingParams, SamplingParamsError

REQUEST_FIELDS = {"text", "input_ids", "sampling_params", "rid", "stream", "return_logprob",
                  "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                  *BOOTSTRAP_FIELDS}
# sampling_params: ours by name; SGLang's that we accept only at their neutral value.
SAMPLING_FIELDS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                   "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
                   "frequency_penalty", "presence_penalty", "json_schema", "regex", "ebnf",
                   "structural_tag", "logit_bias"}
NEUTRAL = {"min_new_tokens": (0,), "repetition_penalty": (1, 1.0), "stop_regex": ((), []),
           "no_stop_trim": (False,), "custom_params": ({},)}
IGNORED = {"spaces_between_special_tokens"}  # text-join detail of special tokens
# Request fields SGLang's clients and router send that change nothing here whatever
# their value; any other field of SGLang's is accepted at a neutral value (null, false,
# empty: e.g. the router forwards return_hidden_states: false), else refused.
IGNORED_FIELDS = {"model", "log_metrics", "no_logs", "data_parallel_rank"}


def _neutral(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, list | dict | str)
                                               and not value)
MAX_N = 16


@dataclass(frozen=True)
class NativeItem:
    """One generation of a /generate request: a prompt and its i-th sample."""

    prompt: str | list[int]
    sampling: SamplingParams
    index: int  # which of the prompt's n samples (offsets the seed)
    rid: str
    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    bootstrap: Bootstrap | None = None  # a disaggregated request (disagg/bootstrap.py)
    max_tokens_given: bool = False  # sampling_params named max_new_tokens


@dataclass(frozen=True)
class NativeBatch:
    items: list[NativeItem]
    batched: bool  # answer with a list (a list of prompts came in, or n > 1)
    stream: bool


def _per_prompt(value: Any, num: int, name: str, batched: bool) -> list[Any]:
    """A field given once for all prompts, or (batched) as a list with one per prompt."""
    if batched and isinstance(value, list):
        if len(value) != num:
            raise bad(f"'{name}' has {len(value)} entries for {num} prompts", name)
        return value
    return [value] * num


def _sampling(raw: Any) -> tuple[SamplingParams, int]:
    """SGLang sampling_params -> (SamplingParams, n). None values mean the default."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad("'sampling_params' must be an object", "sampling_params")
    raw = {k: v for k, v in raw.items() if v is not None and k not in IGNORED}
    n = raw.pop("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad(f"'n' must be an integer in [1, {MAX_N}]", "sampling_params")
    for name, neutral in NEUTRAL.items():
        if name in raw and raw.pop(name) not in neutral:
            raise bad(f"sampling_params.{name} is not supported (only {neutral[0]!r})",
                      "sampling_params")
    if "sampling_seed" in raw:
        raw["seed"] = raw.pop("sampling_seed")
    unknown = sorted(set(raw) - SAMPLING_FIELDS)
    if unknown:
        raise bad(f"unknown sampling_params: {unknown}", "sampling_params")
    for name in ("stop", "stop_token_ids"):
        if isinstance(raw.get(name), list):
            raw[name] = tuple(raw[name])
    try:
        return SamplingParams(**raw), n
    except (SamplingParamsError, TypeError) as e:
        raise bad(str(e), "sampling_params") from e


def _prompts(body: dict) -> tuple[list[str | list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise bad("give exactly one of 'text' or 'input_ids'")
    if text is not None:
        batched = isinstance(text, list)
        prompts = text if batched else [text]
        if not prompts or not all(isinstance(t, str) and t for t in prompts):
            raise bad("'text' must be a non-empty string or a list of them", "text")
        return prompts, batched
    batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0],
                                                                             list)
    prompts = input_ids if batched else [input_ids]
    for ids in prompts:
        if not (isinstance(ids, list) and ids and all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise bad("'input_ids' must be a non-empty list of integers, or a list of them",
                      "input_ids")
    return prompts, batched


def parse_generate(body: Any) -> NativeBatch:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    unknown = sorted(k for k in set(body) - REQUEST_FIELDS - IGNORED_FIELDS
                     if not _neutral(body[k]))
    if unknown:
        raise bad(f"unknown or unsupported fields: {unknown}", unknown[0])
    prompts, batched = _prompts(body)
    num = len(prompts)
    fields = {name: _per_prompt(body.get(name), num, name, batched) for name in (
        "sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
        "return_text_in_logprobs")}
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    try:
        bootstraps = parse_bootstrap(body, num, batched)
    except BootstrapError as e:
        raise bad(str(e)) from e
    items, any_n = [], False
    for i, prompt in enumerate(prompts):
        sp, n = _sampling(fields["sampling_params"][i])
        raw = fields["sampling_params"][i]
        given = isinstance(raw, dict) and raw.get("max_new_tokens") is not None
        any_n |= n > 1
        want = bool(fields["return_logprob"][i])
        start = fields["logprob_start_len"][i]
        start = -1 if start is None or not want else start
        top = fields["top_logprobs_num"][i] or 0
        for name, value in (("logprob_start_len", start), ("top_logprobs_num", top)):
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise bad(f"'{name}' must be an integer", name)
        if top > MAX_TOP_LOGPROBS:
            raise bad(f"'top_logprobs_num' may be at most {MAX_TOP_LOGPROBS}",
                      "top_logprobs_num")
        try:
            sp = replace(sp, logprobs=want, top_logprobs=top if want else 0,
                         logprob_start_len=start)
        except SamplingParamsError as e:
            raise bad(str(e)) from e
        rid = fields["rid"][i] or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise bad("'rid' must be a string", "rid")
        if n > 1 and bootstraps[i] is not None:
            raise bad("a disaggregated request takes n = 1", "sampling_params")
        for j in range(n):
            items.append(NativeItem(prompt, sp, j, rid if n == 1 else f"{rid}-{j}", want,
                                    top if want else 0,
                                    bool(fields["return_text_in_logprobs"][i]),
                                    bootstraps[i], given))
    return NativeBatch(items, batched or any_n, stream)


def _entry(tok: Any, with_text: bool, lp: float | None, token: int) -> list:
    return [lp, token, tok.decode([token]) if with_text and tok is not None else None]


def _tops(tok: Any, with_text: bool, top: list[tuple[int, float]] | None) -> list | None:
    return None if top is None else [_entry(tok, with_text, lp, t) for t, lp in top]


def finish_reason(out: GenerateOutput | None, eos: tuple[int, ...]) -> dict | None:
    """SGLang's form: {"type": "stop", "matched": token or None} | {"type": "length",
    "length": n} | {"type": "abort"}; None while running."""
    if out is None or out.finish_reason is None:
        return None
    if out.finish_reason == "length":
        return {"type": "length", "length": out.completion_tokens}
    if out.finish_reason == "stop":
        last = out.token_ids[-1] if out.token_ids else None
        return {"type": "stop", "matched": last if last in eos else None}
    return {"type": out.finish_reason}


def meta_info(item: NativeItem, prompt_ids: list[int], out: GenerateOutput | None,
              tok: Any, eos: tuple[int, ...], partial: dict | None = None) -> dict:
    """meta_info of one item: the finished output's, or (streaming) `partial`, the fields
    known so far: {"token_ids", "logprobs", "top_logprobs", "cached_tokens"}."""
    meta: dict[str, Any] = {"id": item.rid, "prompt_tokens": len(prompt_ids),
                            "finish_reason": finish_reason(out, eos)}
    if out is not None:
        meta.update(completion_tokens=out.completion_tokens, cached_tokens=out.cached_tokens,
                    seed=out.seed)
        ids, lps, tops = out.token_ids, out.logprobs, out.top_logprobs
    else:
        partial = partial or {}
        meta.update(completion_tokens=len(partial.get("token_ids", [])),
                    cached_tokens=partial.get("cached_tokens", 0))
        ids, lps, tops = (partial.get(k, []) for k in ("token_ids", "logprobs",
                                                      "top_logprobs"))
    if item.return_logprob:
        text = item.return_text_in_logprobs
        start = item.sampling.logprob_start_len
        scored = prompt_ids[start:] if start >= 0 else []
        in_lps = out.prompt_logprobs if out is not None else [None] * len(scored)
        in_tops = out.prompt_top_logprobs if out is not None else [None] * len(scored)
        meta["input_token_logprobs"] = [_entry(tok, text, lp, t)
                                        for lp, t in zip(in_lps, scored, strict=True)]
        meta["output_token_logprobs"] = [_entry(tok, text, lp, t)
                                         for lp, t in zip(lps, ids, strict=False)]
        if item.top_logprobs_num:
            meta["input_top_logprobs"] = [_tops(tok, text, t) for t in in_tops]
            meta["output_top_logprobs"] = [_tops(tok, text, t) for t in tops]
    return meta


def response(item: NativeItem, prompt_ids: list[int], out: GenerateOutput, tok: Any,
             eos: tuple[int, ...]) -> dict:
    return {"text": out.text or "", "output_ids": out.token_ids,
            "meta_info": meta_info(item, prompt_ids, out, tok, eos)}


class StreamState:
    """One streamed item: its chunks so far -> SGLang's cumulative stream bodies."""

    def __init__(self, item: NativeItem, prompt_ids: list[int], tok: Any,
                 eos: tuple[int, ...], index: int | None = None) -> None:
        self.item, self.prompt_ids, self.tok, self.eos = item, prompt_ids, tok, eos
        self.index = index  # set in a batched stream: each body says which item
        self.text = ""
        self.so_far: dict[str, Any] = dict(token_ids=[], logprobs=[], top_logprobs=[],
                                           cached_tokens=0)

    def push(self, chunk: StreamChunk) -> dict | None:
        """The body to send after this chunk (None: nothing new to show)."""
        self.text += chunk.text
        self.so_far["token_ids"] += chunk.token_ids
        self.so_far["logprobs"] += chunk.logprobs
        self.so_far["top_logprobs"] += chunk.top_logprobs
        self.so_far["cached_tokens"] = chunk.cached_tokens
        if not (chunk.text or chunk.token_ids or chunk.finish_reason):
            return None
        body = {"text": self.text, "output_ids": list(self.so_far["token_ids"]),
                "meta_info": meta_info(self.item, self.prompt_ids, chunk.output, self.tok,
                                       self.eos, self.so_far)}
        if self.index is not None:
            body["index"] = self.index
        return body


def engine_error_body(e: Exception) -> dict:
    return APIError(500, f"the engine failed while serving this request: {e}",
                    type_="internal_error", code="engine_error").body()
