"""Schemas whose members or branches repeat, recurse or exclude each other: what keeps
their grammars exact and small.

- ``anyOf``/``oneOf`` products under ``allOf`` pair equal branches into the branch itself
  (a property and a ``patternProperties`` with the same ``oneOf``), so provably disjoint
  branches stay disjoint;
- disjointness seen through ``allOf`` of several parts and through size bounds
  (``maxItems: 0`` against ``minItems: 1``);
- a ``$ref`` to a schema being compiled (recursion through properties or items) merges with
  sibling keywords;
- "no branch holds" over branches told apart by a discriminator key: one alternative per
  key value instead of the product of the branches' negations;
- keywords no validator knows negate to nothing (they always hold); ``not multipleOf`` over
  integers is a difference of remainder automata;
- "some member fails its schema" (the negation of properties / patternProperties /
  additionalProperties): the object requiring a declared key with a failing value, or
  an extra member written last whose key is of the class and whose value fails (last, so
  that where keys repeat the value a parser keeps is the failing one);
- equal rule bodies share one rule.

Tables run through the matcher token by token (Llama 3 vocabulary); the random checks run
the byte automaton against ``jsonschema``: walks give valid JSON, and random instances that
``jsonschema`` rejects are rejected.
"""

from __future__ import annotations

import json
import random

import pytest

from deepinfer.constraints.json_schema import schema_to_grammar

from .test_json_schema_logic import _automaton, _validator, _walks_are_valid
from .test_json_schema_tokens import env  # noqa: F401  (fixture)

PET = {
    "$defs": {
        "cat": {
            "type": "object",
            "required": ["kind"],
            "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
        },
        "dog": {
            "type": "object",
            "required": ["kind"],
            "additionalProperties": False,
            "properties": {"kind": {"const": "dog"}, "bark": {"type": "boolean"}},
        },
    }
}
PETS = {
    **PET,
    "type": "object",
    "properties": {"main": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]}},
    "patternProperties": {".*": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]}},
}
SECTION = {
    **PET,
    "type": "object",
    "properties": {
        "pet": {
            "oneOf": [
                {"$ref": "#/$defs/dog"},
                {"allOf": [{"$ref": "#/$defs/cat"}, {"properties": {"lives": {"maximum": 9}}}]},
            ]
        }
    },
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "kids": {
                    "type": "array",
                    "items": {"allOf": [{"$ref": "#/$defs/node"}, {"required": ["id"]}]},
                },
            },
        }
    },
    "$ref": "#/$defs/node",
}
LISTS = {
    "oneOf": [
        {"type": "array", "maxItems": 0},
        {"type": "array", "minItems": 1, "items": {"type": "integer"}},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
    ]
}
FILES = [
    {"required": ["t", "size"], "properties": {"t": {"enum": ["file"]}, "size": {"type": "integer"}}},
    {"required": ["t", "n"], "properties": {"t": {"enum": ["dir"]}, "n": {"type": "integer"}}},
    {"required": ["t"], "properties": {"t": {"enum": ["link"]}}},
]
NO_FILE = {"type": "object", "not": {"anyOf": FILES}}
NO_FILE_UNTYPED = {"not": {"anyOf": FILES}}
ONE_FILE = {
    "type": "object",
    "properties": {"extra": {"type": "boolean"}},
    "oneOf": [*FILES, {"required": ["extra"]}],
}
SOME_MEMBER = {
    "type": "object",
    "not": {
        "properties": {"a": {"type": "integer"}, "xd": {"minimum": 0}},
        "patternProperties": {"^x": {"type": "string"}},
        "additionalProperties": {"type": "boolean"},
    },
}
SOME_EXTRA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "additionalProperties": {"type": "integer"},
    "not": {"additionalProperties": {"maximum": 5}},
}
SOME_COUNTED = {
    "type": "object",
    "maxProperties": 2,
    "not": {"patternProperties": {"^x": {"type": "integer"}}},
}
ONE_PATTERN = {
    "oneOf": [
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        {"type": "object", "required": ["x1"]},
    ]
}
UNKNOWN = {"type": "object", "properties": {"a": {"not": {"type": "string", "x-format": "date"}}}}

# (name, schema, [(instance text, expected)])
TABLE = [
    (
        "equal oneOf pairs",
        PETS,
        [
            ('{"main":{"kind":"cat"}}', True),
            ('{"main":{"kind":"dog","bark":true}}', True),
            ('{"main":{"kind":"cow"}}', False),
            ('{"x":{"kind":"dog"}}', True),
            ('{"x":{"kind":"dog","lives":1}}', False),
            ('{"main":{"kind":"cat","lives":"x"}}', False),
        ],
    ),
    (
        "disjoint through allOf",
        SECTION,
        [
            ('{"pet":{"kind":"dog"}}', True),
            ('{"pet":{"kind":"cat","lives":9}}', True),
            ('{"pet":{"kind":"cat","lives":10}}', False),
            ('{"pet":{"kind":"bird"}}', False),
        ],
    ),
    (
        "recursive ref merged",
        TREE,
        [
            ('{"id":1,"kids":[{"id":2,"kids":[{"id":3}]}]}', True),
            ("{}", True),
            ('{"kids":[{}]}', False),
            ('{"kids":[{"id":1,"kids":[{"kids":[]}]}]}', False),
            ('{"id":"x"}', False),
        ],
    ),
    (
        "disjoint by size bounds",
        LISTS,
        [
            ("[]", True),
            ("[1,2]", True),
            ('["a"]', True),
            ('[1,"a"]', False),
            ("[null]", False),
            ("{}", False),
        ],
    ),
    (
        "none of discriminated",
        NO_FILE,
        [
            ("{}", True),
            ('{"t":"x"}', True),
            ('{"t":"file"}', True),
            ('{"t":"file","size":"s"}', True),
            ('{"t":"file","size":1}', False),
            ('{"t":"dir","n":1}', False),
            ('{"t":"dir","size":1}', True),
            ('{"t":"link"}', False),
            ("1", False),
        ],
    ),
    (
        "none of discriminated, untyped",
        NO_FILE_UNTYPED,
        [("1", False), ('"s"', False), ("{}", True), ('{"t":"link"}', False), ('{"t":"dir"}', True)],
    ),
    (
        "oneOf with a discriminated part",
        ONE_FILE,
        [
            ('{"t":"file","size":1}', True),
            ('{"extra":true,"t":"file","size":1}', False),
            ('{"extra":true}', True),
            ('{"extra":true,"t":"link"}', False),
            ('{"extra":false,"t":"dir"}', True),
            ("{}", False),
        ],
    ),
    (
        "some member fails",
        SOME_MEMBER,
        [
            ('{"a":"s"}', True),
            ('{"x1":1}', True),
            ('{"b":1}', True),
            ('{"a":1,"b":2}', True),
            ('{"xd":-1}', True),
            ('{"xd":"s"}', False),
            ("{}", False),
            ('{"a":1}', False),
            ('{"x":"s","b":true}', False),
            ('{"a":1,"x":"s","y":false}', False),
            ("1", False),
        ],
    ),
    (
        "some extra member fails",
        SOME_EXTRA,
        [
            ('{"a":6}', True),
            ('{"b":7}', True),
            ('{"a":1,"b":9}', True),
            ('{"a":1}', False),
            ('{"b":2}', False),
            ("{}", False),
            ('{"b":"s"}', False),
            ('{"a":"s","b":7}', False),
            ('{"c":1,"b":9}', True),
            ('{"b":1,"b":9}', True),
            ('{"b":9,"b":1}', False),
        ],
    ),
    (
        "some member fails, counted",
        SOME_COUNTED,
        [
            ('{"x":"s"}', True),
            ('{"a":1,"x":"s"}', True),
            ('{"a":1,"b":2,"x":"s"}', False),
            ('{"x":1}', False),
            ("{}", False),
        ],
    ),
    (
        "not only patterns",
        {"type": "object", "not": {"patternProperties": {"^a": {}}, "additionalProperties": False}},
        [('{"a":1}', False), ('{"b":1}', True), ("{}", False), ('{"a":1,"b":2}', True)],
    ),
    (
        "oneOf with patternProperties",
        ONE_PATTERN,
        [
            ('{"x1":1}', False),
            ('{"x1":"s"}', True),
            ("{}", True),
            ('{"y":1}', True),
            ('{"x1":"s","x2":1}', True),
            ('{"x2":"s"}', False),
        ],
    ),
    (
        "not multipleOf of integers",
        {"type": "integer", "minimum": 0, "maximum": 20, "not": {"multipleOf": 4}},
        [("3", True), ("4", False), ("8", False), ("10", True), ("21", False), ("0", False), ("1.5", False)],
    ),
    (
        "not multipleOf under an integral multipleOf",
        {"multipleOf": 10, "maximum": 35, "not": {"multipleOf": 20}},
        [
            ("10", True),
            ("20", False),
            ("30", True),
            ("40", False),
            ("0", False),
            ("-10", True),
            ("15", False),
            ('"x"', False),
            ("null", False),
        ],
    ),
    (
        "not fractional multipleOf",
        {"type": "integer", "not": {"multipleOf": 2.5}},
        [("5", False), ("10", False), ("3", True), ("7", True), ("-5", False)],
    ),
    (
        "unknown keyword under not",
        UNKNOWN,
        [("{}", True), ('{"a":1}', True), ('{"a":"2024-01-01"}', False), ('{"a":"x"}', False)],
    ),
]
CASES = [(name, schema, text, exp) for name, schema, rows in TABLE for text, exp in rows]


def _tokens_accept(env, schema, text: str) -> bool:  # noqa: F811
    from deepinfer.constraints import Matcher

    tok, _, compiler = env
    m = Matcher(compiler.json_schema(schema))
    return all(m.accept(t) for t in tok.encode(text, add_special_tokens=False).ids) and m.can_end()


@pytest.mark.parametrize("name,schema,text,expected", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_members_table(env, name, schema, text, expected):  # noqa: F811
    assert _tokens_accept(env, schema, text) == expected
    assert _validator(schema).is_valid(json.loads(text)) == expected, "table disagrees with jsonschema"


def test_equal_branches_share_one_rule():
    big = [
        {
            "type": "object",
            "required": [k],
            "properties": {
                k: {"type": "string", "pattern": f"^{k}[0-9]+$"},
                "n": {"type": "integer", "minimum": i},
            },
        }
        for i, k in enumerate(("x", "y"))
    ]
    schema = {"type": "object", "properties": {p: {"anyOf": big} for p in "abc"}}
    rules = schema_to_grammar(schema, whitespace="compact").rules
    # the three equal property values are one rule (not three copies for the automaton)
    assert [r for r in rules if r.startswith("value:")] == ["value:#/properties/a"]


def test_named_rules_never_overwrite():
    """The same pointer compiled in two contexts (merged with different keywords) keeps two
    rules; an equal body reuses the first rule."""
    from deepinfer.constraints.ir import lit
    from deepinfer.constraints.json_schema.lowering import _SchemaCompiler

    c = _SchemaCompiler({}, "compact", False, False)
    a, b = c.named("value:#/p", lit("a")), c.named("value:#/p", lit("b"))
    assert a.name != b.name and c.rules[a.name] == lit("a") and c.rules[b.name] == lit("b")
    assert c.named("value:#/q", lit("a")) == a


def _random_value(rng: random.Random, depth: int = 0) -> object:
    keys = ["t", "size", "n", "kind", "lives", "bark", "main", "pet", "id", "kids", "extra", "a", "x"]
    scalars = [None, True, False, 0, 1, 9, 10, -1, "", "x", "cat", "dog", "file", "dir", "link", "2024-01-01"]
    r = rng.random()
    if depth > 3 or r < 0.4:
        return rng.choice(scalars)
    if r < 0.55:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {k: _random_value(rng, depth + 1) for k in rng.sample(keys, rng.randint(0, 3))}


@pytest.mark.parametrize("name,schema", [(n, s) for n, s, _ in TABLE], ids=[n for n, _, _ in TABLE])
def test_random_against_jsonschema(name, schema):
    a = _automaton(schema)
    validator = _validator(schema)
    rng = random.Random(name)
    # instances jsonschema rejects are rejected (whatever their key order)
    for _ in range(300):
        value = _random_value(rng)
        if not validator.is_valid(value):
            text = json.dumps(value, separators=(",", ":"))
            assert not a.accepts(text.encode()), f"accepted an invalid instance: {text}"
    # walks over the automaton, finished along a shortest completion, give valid JSON
    _walks_are_valid(a, validator, rng)
