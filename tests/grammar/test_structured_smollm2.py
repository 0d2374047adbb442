"""Grammar-constrained decoding with the default model: JSON schemas (greedy and sampled)
produce output that validates, regexes and EBNF grammars match their language, bad
grammars are typed errors, constrained neighbours leave unconstrained outputs unchanged,
and jump-forward, overlap and retraction keep outputs valid."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixjax import Engine, SamplingParams
from radixjax.engine.errors import RequestError
from radixjax.grammar.backend import GrammarBackend
from radixjax.sampling.params import SamplingParamsError
from tests.conftest import SMOLLM2_ENGINE
from tests.grammar.schemas import PROMPTS, SCHEMAS

pytestmark = pytest.mark.slow


def chat(tok, text: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True, tokenize=False)


def make_engine(smollm2, **options) -> Engine:
    opts = SMOLLM2_ENGINE | options
    return Engine(params=smollm2.params, model_config=smollm2.cfg, tokenizer=smollm2.tokenizer,
                  **opts)


@pytest.fixture(scope="module")
def engine(smollm2):
    with make_engine(smollm2) as e:
        yield e
        assert e.stats()["num_late_compiles"] == 0  # grammar steps are warm programs too


def greedy(**kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=160, temperature=0.0, **kw)


def sampled(seed: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=160, temperature=0.8, top_p=0.95, seed=seed, **kw)


def assert_valid(schema: dict, out) -> None:
    assert out.finish_reason == "stop", (out.finish_reason, out.text)
    jsonschema.Draft202012Validator(schema).validate(json.loads(out.text))


def test_json_schemas_greedy_and_sampled(engine, smollm2) -> None:
    names = list(SCHEMAS)
    assert len(names) >= 20
    # every schema greedy, every other one sampled too (the suite's time: each is up to
    # 160 decode steps)
    runs = names + names[::2]
    prompts = [chat(smollm2.tokenizer, PROMPTS[k]) for k in runs]
    sps = ([greedy(json_schema=SCHEMAS[k]) for k in names]
           + [sampled(i, json_schema=SCHEMAS[k]) for i, k in enumerate(names[::2])])
    outs = engine.generate(prompts, sps)
    bad = []
    for k, out in zip(runs, outs, strict=True):
        try:
            assert_valid(SCHEMAS[k], out)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            bad.append((k, out.text, str(e).splitlines()[0]))
    assert not bad, bad
    stats = engine.stats()
    assert stats["num_jump_forward_tokens"] > 0  # the keys were jumped over
    engine.check_integrity()


def test_any_json_regex_and_ebnf(engine, smollm2) -> None:
    regexes = {r"\(\d{3}\) \d{3}-\d{4}": "What is your phone number?",
               r"(yes|no), because [a-z ]{1,30}\.": "Is the sky blue?",
               r"[A-Z][a-z]+ [0-9]{1,2}, [0-9]{4}": "When was the moon landing?"}
    ebnf = ('root ::= sentence ("; " sentence)?\n'
            'sentence ::= subject " " verb\n'
            'subject ::= "the cat" | "a dog" | "my friend"\n'
            'verb ::= "runs" | "sleeps" | "eats"')
    ebnf_re = r"(the cat|a dog|my friend) (runs|sleeps|eats)" \
              r"(; (the cat|a dog|my friend) (runs|sleeps|eats))?"
    cases = [(chat(smollm2.tokenizer, q), dict(regex=rx), rx) for rx, q in regexes.items()]
    cases.append((chat(smollm2.tokenizer, "Tell me about an animal."), dict(ebnf=ebnf), ebnf_re))
    cases.append((chat(smollm2.tokenizer, "Give me some JSON data."), dict(json_schema={}), None))
    prompts = [p for p, _, _ in cases] * 2
    sps = [greedy(**kw) for _, kw, _ in cases] + [sampled(7, **kw) for _, kw, _ in cases]
    outs = engine.generate(prompts, sps)
    for (_, _, rx), sp, out in zip(cases * 2, sps, outs, strict=True):
        if rx is None and out.finish_reason == "length":
            # any JSON: the model may wander on (a long string, a deep array) until
            # max_new_tokens (the default form's greedy answer runs a long string of
            # digits); every token it took must still be grammatical
            assert grammatical_prefix(engine, smollm2, sp, out.token_ids), out.text
            continue
        assert out.finish_reason == "stop", out.text
        if rx is None:
            json.loads(out.text)  # any JSON value
        else:
            assert re.fullmatch(rx, out.text), (rx, out.text)
    engine.check_integrity()


def grammatical_prefix(engine, smollm2, sp: SamplingParams, token_ids: list[int]) -> bool:
    """Whether a fresh matcher of sp's grammar accepts every one of token_ids."""
    backend = GrammarBackend(smollm2.tokenizer, smollm2.cfg.vocab_size, engine.eos_token_ids)
    matcher = backend.matcher(backend.compile(sp.grammar))
    return all(matcher.accept(t) for t in token_ids) and not matcher.is_terminated


def test_unconstrained_outputs_unchanged_by_constrained_neighbours(engine, smollm2) -> None:
    plain = [chat(smollm2.tokenizer, q) for q in ("Name three colors.", "What is 2 + 2?",
                                                  "Say hello in French.")]
    sp = SamplingParams(max_new_tokens=24, temperature=0.0)
    alone = engine.generate(plain, sp)
    engine.flush_cache()
    schema = SCHEMAS["mixed_types"]
    constrained = [chat(smollm2.tokenizer, PROMPTS["mixed_types"])] * 3
    mixed = engine.generate(constrained + plain, [greedy(json_schema=schema)] * 3 + [sp] * 3)
    for a, b in zip(alone, mixed[3:], strict=True):
        assert a.token_ids == b.token_ids
    for out in mixed[:3]:
        assert_valid(schema, out)
    engine.check_integrity()


PATH_NAMES = ["person", "nested_address", "array_of_objects"]
SMALL: dict = {}  # the shared configuration (tests/conftest.py SMOLLM2_ENGINE)


@pytest.fixture(scope="module")
def path_reference(smollm2):
    """Greedy outputs on the default path (overlap, jump-forward) of a small engine."""
    prompts = [chat(smollm2.tokenizer, PROMPTS[k]) for k in PATH_NAMES]
    sps = [greedy(json_schema=SCHEMAS[k]) for k in PATH_NAMES]
    with make_engine(smollm2, **SMALL) as eng:
        return prompts, sps, [o.text for o in eng.generate(prompts, sps)]


@pytest.mark.parametrize("options", [
    dict(enable_jump_forward=False), dict(enable_overlap=False, chunk_size=16),
    dict(retract_every=3), dict(page_size=16, enable_mixed=True, warmup=False),
], ids=["no-jump-forward", "no-overlap-chunk-16", "retract-every-3", "page-16-mixed"])
def test_paths_stay_valid(smollm2, options, path_reference) -> None:
    prompts, sps, reference = path_reference
    with make_engine(smollm2, **(SMALL | options)) as eng:
        outs = eng.generate(prompts, sps)
        for k, out in zip(PATH_NAMES, outs, strict=True):
            assert_valid(SCHEMAS[k], out)
        if "enable_jump_forward" in options:
            assert eng.stats()["num_jump_forward_tokens"] == 0
        else:  # greedy, jump-forward on in both: the same text
            assert [o.text for o in outs] == reference
            assert eng.stats()["num_jump_forward_tokens"] > 0
        if "retract_every" in options:
            assert eng.stats()["num_retractions"] > 0
        eng.check_integrity()


def test_bad_grammars_are_typed_errors_and_the_engine_keeps_serving(engine, smollm2) -> None:
    for kw, words in [(dict(json_schema={"type": "bogus"}), "json_schema"),
                      (dict(regex="a(b"), "parenthesis"),
                      (dict(ebnf="root ::= undefined_rule"), "undefined_rule")]:
        with pytest.raises(RequestError, match=words):
            engine.generate("hi", greedy(**kw))
    with pytest.raises(SamplingParamsError, match="at most one"):
        SamplingParams(regex="a", ebnf='root ::= "a"')
    with pytest.raises(SamplingParamsError, match="not valid JSON"):
        SamplingParams(json_schema="{nope")
    out = engine.generate(chat(smollm2.tokenizer, "Pick a color."),
                          greedy(json_schema=SCHEMAS["enum_color"]))
    assert_valid(SCHEMAS["enum_color"], out)
    engine.check_integrity()
