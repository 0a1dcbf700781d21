"""Structured generation end to end on the embedded SmolLM2-135M-Instruct.

Every constraint kind is generated over a seeded set of prompts (greedy and temperature 0.8)
in one mixed batch with unconstrained requests, and each output is judged here
independently of the engine: json.loads + jsonschema + the pydantic model, re.fullmatch,
a lark parse, membership. The constraints are bounded (short strings, a ranged integer,
a fixed-width regex, a grammar of at most nine characters) so max_tokens always leaves room
to finish: a "length" here would be a real failure, not a budget problem.
"""

from __future__ import annotations

import json
import re

import jsonschema
import lark
import pytest
from pydantic import BaseModel, ConfigDict, Field

from deepinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false: the object must close

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


# [0-9], not \d: like Python's re, the compiler reads \d as any Unicode decimal digit, and
# the model can wander into 4-byte ones ('🯸', U+1FBF8) that 16 tokens cannot finish.
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
SUM_GRAMMAR = """
start: NUM _SP OP _SP NUM
OP: "+" | "-" | "*"
NUM: /[0-9]{1,3}/
_SP: " "
"""
MOODS = ["positive", "negative", "neutral"]

PEOPLE = [
    "Maria Lopez is 34 and lives in Madrid.",
    "John Carter, a retired teacher, turned 71 last week.",
    "Kenji Sato is a 28-year-old engineer.",
    "Claire Dubois (45) runs a bakery in Lyon.",
    "Twelve-year-old Amir Haddad won the chess final.",
    "Ingrid Berg, aged 56, wrote her first novel.",
]

# kind -> (user message for a text, SamplingParams keywords, independent check of the text)
KINDS = {
    "json_schema": (
        "Return JSON with the person's name and age: {}",
        {"json_schema": Person, "max_tokens": 64},
        lambda text: jsonschema.validate(json.loads(text), Person.model_json_schema()) is None,
    ),
    "regex": (
        "On what date (YYYY-MM-DD) might this have happened? {}",
        {"regex": DATE, "max_tokens": 16},
        lambda text: re.fullmatch(DATE, text) is not None,
    ),
    "grammar": (
        "Write a small sum with the age in it, like '3 + 4'. {}",
        {"grammar": SUM_GRAMMAR, "max_tokens": 16},
        lambda text: lark.Lark(SUM_GRAMMAR, parser="earley").parse(text) is not None,
    ),
    "choice": (
        "Is the tone of this sentence positive, negative or neutral? {}",
        {"choice": MOODS, "max_tokens": 8},
        lambda text: text in MOODS,
    ),
}
# each prompt three times: greedy, and sampled at temperature 0.8 with two seeds of its own
SETTINGS = [{"temperature": 0.0}] + [{"temperature": 0.8, "top_p": 0.95, "seed": s} for s in (101, 202)]
FREE = ["Name a colour.", "Say hello in French."]


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    # float32: on CPU, bfloat16 matmuls round differently with the batch's shape, so a greedy
    # request can change tokens with what else is in the batch even unconstrained (batch
    # invariance is deterministic mode's job); float32 is batch-invariant here.
    return LLM(seed=0, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def mixed(llm):
    """One generate call: len(KINDS) x 6 prompts x len(SETTINGS) constrained requests and
    len(FREE) unconstrained ones, interleaved. Returns [(kind, conversation, params, output)]."""
    reqs = []
    for i, person in enumerate(PEOPLE):
        for kind, (template, kw, _) in KINDS.items():
            for j, setting in enumerate(SETTINGS):
                s = dict(setting)
                if "seed" in s:
                    s["seed"] += 10 * i + j
                reqs.append((kind, chat(template.format(person)), SamplingParams(**kw, **s)))
        if i < len(FREE):
            reqs.append((None, chat(FREE[i]), SamplingParams(temperature=0, max_tokens=12)))
    outs = llm.chat([r[1] for r in reqs], [r[2] for r in reqs], use_tqdm=False)
    return [(*r, o) for r, o in zip(reqs, outs)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_are_valid(mixed, kind):
    check = KINDS[kind][2]
    rows = [(p, o) for k, _, p, o in mixed if k == kind]
    assert len(rows) == len(PEOPLE) * len(SETTINGS)
    bad = []
    for p, o in rows:
        ok = o.finish_reason == "stop" and o.error is None and o.valid
        try:
            ok = ok and check(o.text)
        except Exception as e:  # json / jsonschema / lark errors: not valid
            ok = False
            o = f"{o!r} ({type(e).__name__}: {e})"
        if not ok:
            bad.append((p.temperature, p.seed, o))
    assert not bad, f"{len(bad)}/{len(rows)} invalid {kind} outputs: {bad}"


def test_parsed(mixed):
    for k, _, _, o in mixed:
        if k == "json_schema":
            assert isinstance(o.parsed, Person) and o.parsed.model_dump() == json.loads(o.text)
        elif k is not None:
            assert o.parsed == o.text
        else:
            assert o.parsed is None and o.error is None and o.finish_reason in ("stop", "length")


def test_mixed_batch_equals_alone_greedy(llm, mixed):
    """A request gives the same tokens in the mixed batch as alone (greedy): one of each kind,
    plus an unconstrained one."""
    picked = {}
    for k, conv, p, o in mixed:
        if p.temperature == 0 and k not in picked:
            picked[k] = (conv, p, o)
    assert set(picked) == {*KINDS, None}
    for k, (conv, p, o) in picked.items():
        alone = llm.chat(conv, p, use_tqdm=False)[0]
        assert (alone.token_ids, alone.finish_reason) == (o.token_ids, o.finish_reason), k


BAD = [
    (
        {"json_schema": {"type": "object", "properties": {"a": {"type": "strin"}}}},
        r"json_schema: invalid JSON Schema .*'strin' is not valid .*\(at #/properties/a/type\)",
    ),
    (
        {"json_schema": {"type": "object", "unevaluatedProperties": False}},
        r"'unevaluatedProperties'.*lenient=True.*#/unevaluatedProperties",
    ),
    ({"json_schema": '{"type": "object",'}, r"not valid JSON.*line 1 column 19"),
    ({"regex": "(abc"}, r"regex: invalid regex: missing \).*position 0"),
    (
        {"grammar": 'start: NUM OP NUM\nOP: "+" "(\nNUM: /[0-9]+/\n'},
        r"grammar: .*syntax error.*line 2, column 9",
    ),
    ({"grammar": "start: NUM undefined_rule\nNUM: /[0-9]+/\n"}, r"undefined rule 'undefined_rule'.*line 1"),
    ({"grammar": "no_such_grammar.lark"}, r"Unknown grammar 'no_such_grammar.lark'"),
]


def test_bad_constraints_fail_alone(llm):
    """Each bad constraint fails its own request with an error that names the problem; the
    good requests around them in the same batch still run and are valid."""
    good = [
        SamplingParams(regex=DATE, temperature=0, max_tokens=16),
        SamplingParams(json_schema=Person, temperature=0, max_tokens=64),
        SamplingParams(temperature=0, max_tokens=6),
    ]
    params = [good[0]] + [SamplingParams(**kw, max_tokens=16) for kw, _ in BAD] + good[1:]
    outs = llm.chat([chat(PEOPLE[0])] * len(params), params, use_tqdm=False)
    for o, (_, pattern) in zip(outs[1 : 1 + len(BAD)], BAD):
        assert o.finish_reason == "error" and not o.valid and o.token_ids == [] and o.parsed is None
        assert re.search(pattern, o.error), o.error
    first, person, free = outs[0], outs[-2], outs[-1]
    assert first.valid and re.fullmatch(DATE, first.text)
    assert person.valid and isinstance(person.parsed, Person)
    assert free.valid and len(free.token_ids) > 0
    # the good ones are what they would be alone
    for p, o in zip(good, (first, person, free)):
        assert llm.chat(chat(PEOPLE[0]), p, use_tqdm=False)[0].token_ids == o.token_ids


def test_lenient_relaxes_and_reports(llm):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "unevaluatedProperties": {"type": "string"},
    }
    p = SamplingParams(json_schema=schema, lenient=True, temperature=0, max_tokens=48)
    o = llm.chat(chat("A digit as JSON, key n."), p, use_tqdm=False)[0]
    assert o.relaxed == ["unevaluatedProperties at #/unevaluatedProperties"]
    obj = json.loads(o.text)  # the grammar enforced the rest; jsonschema judged the relaxed keyword
    assert o.valid == jsonschema.Draft202012Validator(schema).is_valid(obj)


def test_unique_items_is_enforced_not_relaxed(llm):
    p = SamplingParams(
        json_schema={
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 3,
            "maxItems": 3,
            "uniqueItems": True,
        },
        lenient=True,
        temperature=0,
        max_tokens=16,
    )
    o = llm.chat(chat("Three digits as a JSON array."), p, use_tqdm=False)[0]
    assert o.relaxed == [] and o.valid
    arr = json.loads(o.text)
    assert len(arr) == 3 and len(set(arr)) == 3


@pytest.mark.parametrize(
    "kw",
    [{"json_schema": Person}, {"regex": DATE}, {"grammar": SUM_GRAMMAR}],
    ids=["json_schema", "regex", "grammar"],
)
def test_cut_by_max_tokens_is_never_valid(llm, kw):
    o = llm.chat(chat(PEOPLE[1]), SamplingParams(**kw, temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert o.finish_reason == "length" and len(o.token_ids) == 2
    assert not o.valid and o.parsed is None and "max_tokens" in o.error
