"""Per-request sampling parameters (host side, validated once) and their padded,
per-batch array form that the jitted sampler consumes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries
# Sizes a request may not exceed: each stop string is matched on every step's new text,
# each grammar is compiled (and cached) before the request runs.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512  # per stop string
MAX_GRAMMAR_CHARS = 128 * 1024  # a JSON schema's text, a regex, an EBNF grammar
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range or of the wrong type."""


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k <= 0 means no top-k cut; seed None means the
    engine picks one (so outputs are still reproducible from its logs).

    max_new_tokens 0: prefill only (caches the prompt's prefix; with logprob_start_len,
    scores the prompt). logprob_start_len >= 0: the log-probability of every prompt token
    from that position on, each given the tokens before it (None for position 0), with
    its top `top_logprobs` alternatives; -1: none (SGLang's convention)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    logprobs: bool = False  # of each output token
    top_logprobs: int = 0  # alternatives per output (and scored prompt) position
    logprob_start_len: int = -1  # prompt logprobs from this position on; -1: none
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings (checked by the engine on decoded text)
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # in the output text
    frequency_penalty: float = 0.0  # OpenAI: logit -= freq * count(token in the output)
    presence_penalty: float = 0.0  # OpenAI: logit -= pres * (token in the output)
    # Structured output (grammar/), at most one: a JSON schema (a dict or its JSON text;
    # {} = any JSON value), a regex, an EBNF grammar (GBNF style, `root ::= ...`), or an
    # xgrammar structural tag (a dict or its JSON text: tool calls, reasoning then a format).
    json_schema: str | dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    json_strict: bool = True  # no properties/items beyond the schema's (OpenAI `strict`)
    # OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs added to the logits
    # before sampling (a dict {id: bias} is taken too); at most MAX_LOGIT_BIAS of them
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.logit_bias, dict):
            try:
                pairs = tuple(sorted((int(k), v) for k, v in self.logit_bias.items()))
            except (TypeError, ValueError):
                raise SamplingParamsError("logit_bias keys must be token ids") from None
            object.__setattr__(self, "logit_bias", pairs)
        if isinstance(self.json_schema, dict | bool):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        if isinstance(self.structural_tag, dict):
            object.__setattr__(self, "structural_tag", json.dumps(self.structural_tag))

        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise SamplingParamsError(msg)

        check(isinstance(self.max_new_tokens, int) and not isinstance(self.max_new_tokens, bool)
              and self.max_new_tokens >= 0,
              f"max_new_tokens must be an integer >= 0, got {self.max_new_tokens!r}")
        check(isinstance(self.logprob_start_len, int) and self.logprob_start_len >= -1,
              f"logprob_start_len must be an integer >= -1, got {self.logprob_start_len!r}")
        check(isinstance(self.temperature, int | float) and 0.0 <= self.temperature <= 100.0,
              f"temperature must be in [0, 100], got {self.temperature!r}")
        check(isinstance(self.top_k, int), f"top_k must be an integer, got {self.top_k!r}")
        check(isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0,
              f"top_p must be in (0, 1], got {self.top_p!r}")
        check(isinstance(self.min_p, int | float) and 0.0 <= self.min_p <= 1.0,
              f"min_p must be in [0, 1], got {self.min_p!r}")
        check(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**31),
              f"seed must be an integer in [0, 2^31), got {self.seed!r}")
        check(all(isinstance(s, str) for s in self.stop), "stop must be strings")
        check(len(self.stop) <= MAX_STOP_STRINGS,
              f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        check(all(len(s) <= MAX_STOP_CHARS for s in self.stop),
              f"a stop string may have at most {MAX_STOP_CHARS} characters")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            check(isinstance(value, int | float) and -2.0 <= value <= 2.0,
                  f"{name} must be in [-2, 2], got {value!r}")
        bias = self.logit_bias
        check(isinstance(bias, tuple) and len(bias) <= MAX_LOGIT_BIAS,
              f"logit_bias may have at most {MAX_LOGIT_BIAS} entries")
        check(all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], int)
                  and not isinstance(p[0], bool) and p[0] >= 0 for p in bias),
              "logit_bias keys must be token ids (non-negative integers)")
        check(all(isinstance(p[1], int | float) and not isinstance(p[1], bool)
                  and -100.0 <= p[1] <= 100.0 for p in bias),
              "logit_bias values must be numbers in [-100, 100]")
        check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
              "stop_token_ids must be non-negative integers")
        check(isinstance(self.top_logprobs, int)
              and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
              f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        given = [k for k in GRAMMAR_KINDS if getattr(self, k) is not None]
        check(len(given) <= 1, f"give at most one of {', '.join(GRAMMAR_KINDS)}; got {given}")
        check(all(isinstance(getattr(self, k), str) for k in given),
              f"{', '.join(given)} must be a string")
        check(all(len(getattr(self, k)) <= MAX_GRAMMAR_CHARS for k in given),
              f"{', '.join(given)} may have at most {MAX_GRAMMAR_CHARS} characters")
        for kind in ("json_schema", "structural_tag"):
            if getattr(self, kind) is not None:
                try:
                    json.loads(getattr(self, kind))
                except ValueError as e:
                    raise SamplingParamsError(f"{kind} is not valid JSON: {e}") from None

    @property
    def grammar(self) -> tuple[str, str, bool] | None:
        """(kind, source, strict) of the grammar this request is constrained by, or None;
        the key compiled grammars are cached by."""
        for kind in GRAMMAR_KINDS:
            source = getattr(self, kind)
            if source is not None:
                return kind, source, self.json_strict
        return None

    @property
    def scores_prompt(self) -> bool:
        return self.logprob_start_len >= 0

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class SamplingArrays(NamedTuple):
    """[B] arrays, one row per request of the step (padded rows are greedy)."""

    temperature: np.ndarray  # [B] f32
    top_k: np.ndarray  # [B] int32, <= 0: off
    top_p: np.ndarray  # [B] f32
    min_p: np.ndarray  # [B] f32
    seed: np.ndarray  # [B] int32
    frequency_penalty: np.ndarray  # [B] f32
    presence_penalty: np.ndarray  # [B] f32
    bias_ids: np.ndarray  # [B, MAX_LOGIT_BIAS] int32, logit_bias token ids (padding: 0)
    bias_values: np.ndarray  # [B, MAX_LOGIT_BIAS] f32 (padding: 0)

    @staticmethod
    def build(params: list[SamplingParams], seeds: list[int], num_rows: int) -> SamplingArrays:
        pad = num_rows - len(params)
        return SamplingArrays(
            temperature=np.array([p.temperature for p in params] + [0.0] * pad, np.float32),
            top_k=np.array([p.top_k for p in params] + [-1] * pad, np.int32),
            top_p=np.array([p.top_p for p in params] + [1.0] * pad, np.float32),
            min_p=np.array([p.min_p for p in params] + [0.0] * pad, np.float32),
            seed=np.array(list(seeds) + [0] * pad, np.int32),
            frequency_penalty=np.array([p.frequency_penalty for p in params] + [0.0] * pad,
                                       np.float32),
            presence_penalty=np.array([p.presence_penalty for p in params] + [0.0] * pad,
                                      np.float32),
            **_bias_arrays(params, num_rows),
        )


def _bias_arrays(params: list[SamplingParams], num_rows: int) -> dict[str, np.ndarray]:
    ids = np.zeros((num_rows, MAX_LOGIT_BIAS), np.int32)
    values = np.zeros((num_rows, MAX_LOGIT_BIAS), np.float32)
    for i, p in enumerate(params):
        for j, (token, bias) in enumerate(p.logit_bias):
            ids[i, j], values[i, j] = token, bias
    return {"bias_ids": ids, "bias_values": values}
