"""JSON keys in any order inside a tagged segment and after a reasoning block: the key-order
check (:mod:`deepinfer.constraints.key_order`) on a structural-tag or reasoning automaton,
and composed with the reasoning budget (its matcher wraps the key-order check's).

- Soundness: random walks over the masks (the shared ``random_walk``: masks compared with
  the token-by-token reference on the way, a marker written now and then, the completion
  found through the check) end in texts whose segments, cut by an independent splitter,
  jsonschema validates; texts with a key twice or a required key missing are refused.
- Completeness: valid segments with their keys in every order are accepted, byte by byte.
- Where the check cannot be kept, the segment falls back to schema order and the notes say so.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest

from deepinfer import SamplingParams
from deepinfer.constraints import Compiler, Matcher
from deepinfer.constraints.key_order import KeyOrderCheck
from deepinfer.constraints.reasoning import ReasoningBudget

from .test_structural_tags import byte_ids, random_walk, split
from .vocabs import small_vocab

ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
CALL = {
    "begin": "<call>",
    "json_schema": {
        "type": "object",
        "properties": {"name": {"const": "w"}, "arguments": ARGS},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "whitespace": "compact",
    "key_order": "any",
    "end": "</call>",
}
CODE = {"begin": "<code>", "regex": r"[a-z]{1,4}", "end": "</code>"}
AFTER = {"json_schema": ARGS, "whitespace": "compact", "key_order": "any"}
VALUE = {"name": "w", "arguments": {"city": "Oslo", "days": 2, "unit": "c"}}


@pytest.fixture(scope="module")
def small():
    v = small_vocab()
    return v, Compiler(v), byte_ids(v)


def orders(value: dict):
    """``value`` (an object of objects) with its keys and its inner objects' keys in every order."""
    for outer in itertools.permutations(value):
        inners = [
            [dict(p) for p in itertools.permutations(value[k].items())]
            if isinstance(value[k], dict)
            else [value[k]]
            for k in outer
        ]
        for choice in itertools.product(*inners):
            yield dict(zip(outer, choice))


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_segment_keys_in_any_order_byte_by_byte(small):
    vocab, compiler, ids = small
    compiled = compiler.structural_tags([CALL, CODE])
    assert isinstance(compiled.check, KeyOrderCheck) and not compiled.notes
    n = 0
    for v in orders(VALUE):
        text = f"see <call>{dumps(v)}</call> and <code>ab</code>."
        assert compiled.accepts(text), text
        m = Matcher(compiled)
        for b in text.encode():
            assert m.accept(ids[b]), (text, b)
        assert m.can_end()
        n += 1
    assert n == 2 * 6  # every order of the outer and inner keys
    schema_order = compiler.structural_tags([{**CALL, "key_order": "schema"}])
    assert not schema_order.accepts('<call>{"arguments":{"city":"a","days":1},"name":"w"}</call>')


@pytest.mark.parametrize(
    "inner",
    [
        '{"name":"w","arguments":{"days":1,"city":"a","days":2}}',  # a key twice
        '{"name":"w","name":"w","arguments":{"days":1,"city":"a"}}',
        '{"arguments":{"days":1},"name":"w"}',  # a required key missing
        '{"name":"w","arguments":{"city":"a","days":1,"zip":1}}',  # undeclared
        '{"arguments":{"city":"a","days":1}}',
    ],
)
def test_segment_bad_keys_are_refused(small, inner):
    _, compiler, _ = small
    compiled = compiler.structural_tags([CALL, CODE])
    assert not compiled.accepts(f"x <call>{inner}</call>")


def test_random_walks_in_segments_are_valid(small):
    vocab, compiler, ids = small
    tags = [CALL, CODE]
    compiled = compiler.structural_tags(tags)
    rng = random.Random(11)

    def marker(rng, out):  # now and then a trigger, or a key out of schema order
        r = rng.random()
        if r < 0.08:
            return rng.choice([b"<call>", b"<code>"])
        if r < 0.2:
            return rng.choice([b'{"arguments":{"days":', b'"unit":"f","city":"', b'"days":3,'])
        return None

    segments = dead = 0
    for walk in range(12):
        out = random_walk(compiled, vocab, ids, rng, rng.randint(10, 45), 6, marker)
        if out is None:  # (a key written twice: the check stops it at its colon)
            dead += 1
            continue
        text = out.decode("utf-8")
        parts = split(text, tags, ["<call>", "<code>"])
        assert parts is not None, f"walk {walk} produced {text!r}"
        for tag, content in parts:
            if "json_schema" in tag:
                jsonschema.validate(json.loads(content), tag["json_schema"])
                segments += 1
    assert segments >= 2 and dead <= 6, (segments, dead)  # the walks did write calls


def test_reasoning_then_keys_in_any_order_with_a_budget(small):
    vocab, compiler, ids = small
    for budget in (None, 3):
        compiled = compiler.reasoning(AFTER, max_tokens=budget)
        check = compiled.check
        if budget is None:
            assert isinstance(check, KeyOrderCheck)
        else:
            assert isinstance(check, ReasoningBudget) and isinstance(check.inner, KeyOrderCheck)
        for v in orders({"a": VALUE["arguments"]}):
            text = f"<think>ok</think>{dumps(v['a'])}"
            assert compiled.accepts(text), text
        assert not compiled.accepts('<think>ok</think>{"days":1,"days":2,"city":"a"}')
        assert not compiled.accepts('<think>ok</think>{"days":1}')


def test_reasoning_budget_random_walks_keep_the_keys_check(small):
    vocab, compiler, ids = small
    compiled = compiler.reasoning(AFTER, max_tokens=6)
    rng = random.Random(5)

    def marker(rng, out):
        if b"</think>" not in out and rng.random() < 0.1:
            return b"</think>"
        if b"</think>" in out and rng.random() < 0.25:
            return rng.choice([b'{"days":', b'"unit":"c",', b'"city":"x",'])
        return None

    done = 0
    for _ in range(8):
        out = random_walk(compiled, vocab, ids, rng, rng.randint(5, 30), 12, marker)
        if out is None:
            continue
        done += 1
        text = out.decode("utf-8")
        body = text[len("<think>") :]
        k = body.index("</think>")
        jsonschema.validate(json.loads(body[k + len("</think>") :]), ARGS)
    assert done >= 4, done


def test_budget_forces_the_end_then_checks_keys(small):
    vocab, compiler, ids = small
    compiled = compiler.reasoning(AFTER, max_tokens=2)
    m = Matcher(compiled)
    out = b""
    for b in b"<think>ab":
        if m.accept(ids[b]):
            out += bytes([b])
    assert m.reasoning_tokens >= 2
    while not out.endswith(b"</think>"):  # over budget: only the end marker's tokens
        t = m.forced_tokens()[0]
        assert list(m.allowed_tokens()) == [t]
        assert m.accept(t)
        out += vocab.token_bytes[t]
    for b in b'{"days":2,"city":"x"}':
        assert m.accept(ids[b])
    assert m.can_end()
    r = m.copy()
    assert not all(r.accept(ids[b]) for b in b',"days":3')  # (a key twice is refused)


def test_fallback_to_schema_order_is_noted():
    # a long string is a counted repetition; the check needs the automaton without counters,
    # past this compiler's state bound: the segment is compiled in schema order, as noted
    from deepinfer.constraints.limits import Limits

    compiler = Compiler(small_vocab(), limits=Limits(max_dfa_states=3_000))
    long = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "s": {"type": "string", "maxLength": 4000}},
        "additionalProperties": False,
    }
    tags = [{"begin": "<x>", "json_schema": long, "whitespace": "compact", "key_order": "any", "end": "</x>"}]
    c = compiler.structural_tags(tags)
    assert c.check is None
    assert any("key_order='any' cannot be enforced" in n and "#/structural_tags/0" in n for n in c.notes), (
        c.notes
    )
    assert c.accepts('<x>{"a":1,"s":"q"}</x>') and not c.accepts('<x>{"s":"q","a":1}</x>')
    r = compiler.reasoning({"json_schema": long, "whitespace": "compact", "key_order": "any"}, max_tokens=4)
    assert isinstance(r.check, ReasoningBudget) and r.check.inner is None
    assert any("key_order='any' cannot be enforced" in n for n in r.notes), r.notes
    assert r.accepts('<think></think>{"a":1,"s":"q"}')


def test_sampling_params_carry_key_order_into_tags_and_after_reasoning():
    from deepinfer.structured import Structured

    p = SamplingParams(structural_tags=[{k: v for k, v in CALL.items() if k != "key_order"}], key_order="any")
    q = SamplingParams(
        json_schema=ARGS, whitespace="compact", key_order="any", reasoning=("<think>", "</think>")
    )

    class Tok:  # (the engine's tokenizer: only its vocabulary and special tokens are read)
        special_token_ids: list = []

        def vocabulary(self, n):
            return small_vocab()

    s = Structured(Tok(), 0)
    tags = s.compile(p)
    assert isinstance(tags.check, KeyOrderCheck)
    assert tags.accepts('<call>{"arguments":{"days":1,"city":"a"},"name":"w"}</call>')
    after = s.compile(q)
    assert after.accepts('<think>x</think>{"days":1,"city":"a"}')
