"""Boolean keywords lowered by the JSON Schema front end: ``not``, ``oneOf`` with overlapping
branches, ``if``/``then``/``else``, dependencies, and keywords filtered by ``enum``.

- accept/reject tables at the byte level (every canonical instance also checked against
  ``jsonschema``, the oracle: our verdict must equal it);
- soundness: seeded random walks over the automaton's allowed bytes, finished along a
  shortest completion, give JSON that ``jsonschema`` accepts.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

import jsonschema
import pytest

from deepinfer.constraints.errors import ConstraintError
from deepinfer.constraints.json_schema import schema_to_grammar

from .checked import compile_checked
from .test_json_schema_tokens import _shortest_completion

AREA = {
    "type": "object",
    "properties": {"length": {"type": "number"}, "width": {"type": "number"}, "radius": {"type": "number"}},
    "oneOf": [{"required": ["length", "width"]}, {"required": ["radius"]}],
}
PROMO = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"category": {"enum": ["a", "b", "c"]}, "url": {"type": "string"}},
    "oneOf": [{"properties": {"category": {"enum": [v]}}, "required": ["url"]} for v in "abc"],
}
RECURSIVE_NOT = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "not": {"required": ["bad"]},
        }
    },
    "$ref": "#/$defs/node",
}

# (name, schema, [(instance text, expected)])
TABLE = [
    (
        "not type",
        {"not": {"type": "string"}},
        [("1", True), ('"a"', False), ("null", True), ('{"a":"b"}', True), ("[1]", True)],
    ),
    ("not type list", {"not": {"type": ["string", "null"]}}, [("1", True), ('"a"', False), ("null", False)]),
    (
        "not integer",
        {"not": {"type": "integer"}},
        [
            ("1", False),
            ("1.0", False),
            ("1.5", True),
            ("-0.25", True),
            ("1e-05", True),
            ('"x"', True),
            ("2e5", False),
        ],
    ),
    (
        "not integer with bounds",
        {"type": "number", "minimum": 1, "not": {"type": "integer"}},
        [("1", False), ("1.5", True), ("0.5", False), ("3.25", True)],
    ),
    (
        "not integer under integer",
        {"type": ["integer", "string"], "not": {"type": "integer"}},
        [("1", False), ('"1"', True), ("1.5", False)],
    ),
    (
        "not pattern",
        {"type": "string", "not": {"pattern": "^a"}},
        [('"abc"', False), ('"bc"', True), ('""', True), ('"\\u0061"', False), ("1", False)],
    ),
    ("not pattern untyped", {"not": {"pattern": "^a"}}, [('"abc"', False), ('"bc"', True), ("1", False)]),
    (
        "not string enum",
        {"type": "string", "not": {"enum": ["a", "b"]}},
        [('"a"', False), ('"b"', False), ('"c"', True), ('""', True), ('"ab"', True)],
    ),
    (
        "not enum booleans",
        {"not": {"enum": [True, None, "x"]}},
        [("true", False), ("false", True), ("null", False), ('"x"', False), ('"y"', True), ("3", True)],
    ),
    (
        "not minLength",
        {"not": {"type": "string", "minLength": 2}},
        [('"a"', True), ('"ab"', False), ("1", True)],
    ),
    ("not maximum", {"type": "integer", "not": {"maximum": 5}}, [("5", False), ("6", True), ("-1", False)]),
    (
        "not exclusiveMinimum",
        {"type": "number", "not": {"exclusiveMinimum": 0}},
        [("0", True), ("-0.5", True), ("0.5", False)],
    ),
    (
        "not maxItems",
        {"type": "array", "not": {"maxItems": 1}},
        [("[]", False), ("[1]", False), ("[1,2]", True)],
    ),
    (
        "not required",
        {"type": "object", "not": {"required": ["a", "b"]}},
        [("{}", True), ('{"a":1}', True), ('{"a":1,"b":2}', False), ('{"b":1}', True)],
    ),
    (
        "not required untyped",
        {"not": {"required": ["a"]}},
        [("{}", True), ('{"a":1}', False), ('"x"', False)],
    ),
    (
        "not required with allOf",
        {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "args": {}},
            "not": {"allOf": [{"required": ["cmd"]}, {"required": ["args"]}]},
        },
        [('{"cmd":"x"}', True), ('{"args":[]}', True), ('{"cmd":"x","args":[]}', False), ("{}", True)],
    ),
    (
        "not properties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "not": {"properties": {"a": {"minimum": 5}}},
        },
        [('{"a":1}', True), ('{"a":5}', False), ("{}", False), ('{"a":7}', False)],
    ),
    (
        "not anyOf",
        {"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        [("null", False), ("1", True), ('"a"', False), ("true", True)],
    ),
    ("double not", {"not": {"not": {"type": "null"}}}, [("null", True), ("1", False)]),
    ("not true", {"type": "object", "properties": {"a": {"not": True}}}, [("{}", True), ('{"a":1}', False)]),
    (
        "not in recursion",
        RECURSIVE_NOT,
        [
            ('{"kids":[{}]}', True),
            ('{"kids":[{"bad":1}]}', False),
            ('{"bad":1}', False),
            ('{"x":{"bad":1}}', True),
        ],
    ),
    (
        "not oneOf",
        {"type": "integer", "not": {"oneOf": [{"minimum": 5}, {"maximum": 10}]}},
        [("7", True), ("3", False), ("12", False)],
    ),
    (
        "enum filters not",
        {"allOf": [{"enum": [3, 4]}, {"not": {"multipleOf": 2}}]},
        [("3", True), ("4", False)],
    ),
    (
        "enum filters uniqueItems",
        {"enum": [[1, 1], [1, 2]], "uniqueItems": True},
        [("[1,2]", True), ("[1,1]", False)],
    ),
    (
        "oneOf overlapping",
        {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
        [
            ("1", True),
            ("2", False),
            ("3", False),
            ("2.5", True),
            ("1.5", False),
            ('"x"', True),
            ("null", True),
        ],
    ),
    (
        "oneOf required",
        AREA,
        [
            ('{"length":1,"width":2}', True),
            ('{"radius":1}', True),
            ('{"length":1,"width":2,"radius":1}', False),
            ("{}", False),
            ('{"length":1}', False),
        ],
    ),
    (
        "oneOf enum in branches",
        PROMO,
        [('{"category":"a","url":"u"}', True), ('{"url":"u"}', False), ('{"category":"b"}', False)],
    ),
    (
        "oneOf untyped discriminator",
        {
            "oneOf": [
                {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"properties": {"k": {"const": "b"}}, "required": ["k"]},
            ]
        },
        [('{"k":"a"}', True), ('{"k":"b"}', True), ('"x"', False), ('{"k":"c"}', False), ("{}", False)],
    ),
    (
        "oneOf required vs forbidden",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"a": {"type": "string"}},
                    "required": ["a"],
                    "additionalProperties": False,
                },
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        [('{"a":"x"}', True), ('{"b":"x"}', True), ('{"b":"x","a":"y"}', True), ('{"a":"x","c":"y"}', False)],
    ),
    (
        "oneOf strings",
        {"oneOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "string", "maxLength": 2}]},
        [('"123"', True), ('"12"', False), ('"ab"', True), ('"abc"', False)],
    ),
    (
        "oneOf three",
        {"oneOf": [{"minimum": 5}, {"maximum": 10}, {"type": "string"}], "type": ["integer", "string"]},
        [("4", True), ("11", True), ("6", False), ('"s"', False), ("null", False)],
    ),
    (
        "contains",
        {"type": "array", "contains": {"type": "integer"}},
        [("[]", False), ('["a"]', False), ('["a",1]', True), ('[1,"a",2]', True)],
    ),
    (
        "contains with items",
        {"type": "array", "items": {"type": "number"}, "contains": {"minimum": 5}},
        [("[1,2]", False), ("[1,6]", True), ('[6,"a"]', False), ("[6]", True)],
    ),
    (
        "contains with length",
        {"type": "array", "contains": {"const": 1}, "minItems": 2, "maxItems": 3},
        [("[1]", False), ("[1,2]", True), ("[2,3,1]", True), ("[2,3,4]", False), ("[1,1,1,1]", False)],
    ),
    (
        "contains minItems",
        {"type": "array", "contains": {"const": 1}, "minItems": 3},
        [("[1,2]", False), ("[2,3,1]", True), ("[2,3,4,5,1]", True), ("[2,3,4]", False)],
    ),
    (
        "minContains",
        {"type": "array", "contains": {"const": 1}, "minContains": 2},
        [("[1]", False), ("[1,2,1]", True), ("[1,1]", True)],
    ),
    (
        "maxContains",
        {"type": "array", "contains": {"type": "integer"}, "maxContains": 2},
        [("[]", False), ("[1]", True), ('[1,"a",1]', True), ("[1,1,1]", False), ('["a"]', False)],
    ),
    (
        "minContains 0",
        {"type": "array", "contains": {"type": "string"}, "minContains": 0, "maxContains": 1},
        [("[]", True), ("[2]", True), ('["a",2]', True), ('["a","b"]', False)],
    ),
    (
        "two contains",
        {"type": "array", "allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}]},
        [
            ("[]", False),
            ("[1]", False),
            ("[2,2]", False),
            ("[1,2]", True),
            ("[2,1]", True),
            ("[3,2,4,1,5]", True),
        ],
    ),
    (
        "two contains one item",
        {
            "type": "array",
            "items": {"type": "number"},
            "allOf": [{"contains": {"type": "integer"}}, {"contains": {"minimum": 5}}],
        },
        [("[6]", True), ("[5.5,2]", True), ("[5.5]", False), ("[1,2]", False), ('[6,"a"]', False)],
    ),
    (
        "three contains",
        {
            "type": "array",
            "allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}, {"contains": {"minimum": 2}}],
        },
        [("[1,2]", True), ("[1]", False), ("[2,3]", False)],
    ),
    (
        "two contains maxItems",
        {
            "type": "array",
            "maxItems": 3,
            "allOf": [{"contains": {"type": "integer"}}, {"contains": {"type": "string"}}],
        },
        [
            ('[1,"a"]', True),
            ('["a",null,1]', True),
            ('[null,"a",null,1]', False),
            ("[1,2,3]", False),
            ('["a"]', False),
        ],
    ),
    (
        "two contains minItems",
        {
            "type": "array",
            "minItems": 3,
            "allOf": [{"contains": {"type": "integer"}}, {"contains": {"minimum": 5}}],
        },
        [
            ("[6]", False),
            ("[6,1]", False),
            ("[6,null,null]", True),
            ('[null,1,"a",6.5]', True),
            ("[1,2,3]", False),
        ],
    ),
    (
        "minContains in another allOf branch",
        {"type": "array", "allOf": [{"contains": {"const": 1}}, {"minContains": 0}]},
        [("[]", False), ("[2]", False), ("[1]", True)],
    ),
    (
        "minContains merged",
        {
            "type": "array",
            "allOf": [
                {"contains": {"type": "integer"}, "minContains": 0},
                {"contains": {"type": "integer"}, "maxContains": 2},
            ],
        },
        [("[]", False), ("[1]", True), ("[1,1,1]", False), ('[1,"a",1]', True)],
    ),
    (
        "allOf patternProperties and additionalProperties",
        {
            "type": "object",
            "allOf": [
                {"patternProperties": {"^x": {"type": "integer"}}},
                {"properties": {"a": {}}, "additionalProperties": {"minimum": 5}},
            ],
        },
        [
            ('{"x1":6}', True),
            ('{"x1":4}', False),
            ('{"x1":"s"}', False),
            ('{"a":1}', True),
            ('{"b":4}', False),
            ('{"b":"s"}', True),
        ],
    ),
    (
        "allOf patternProperties one side",
        {
            "type": "object",
            "allOf": [
                {"patternProperties": {"^[0-9]$": {"type": "integer"}}, "additionalProperties": False},
                {"properties": {"a": {"type": "string"}}, "required": ["1"]},
            ],
        },
        [('{"1":2}', True), ('{"1":2,"a":"s"}', False), ('{"1":"s"}', False), ('{"1":2,"2":3}', True)],
    ),
    (
        "allOf same patterns",
        {
            "type": "object",
            "allOf": [
                {"patternProperties": {"^x": {"minimum": 2}}, "additionalProperties": False},
                {"patternProperties": {"^x": {"maximum": 4}}, "additionalProperties": {"type": "string"}},
            ],
        },
        [('{"x":3}', True), ('{"x":5}', False), ('{"y":"s"}', False), ("{}", True)],
    ),
    (
        "allOf of anyOf, disjoint pairs left out",
        {
            "allOf": [
                {"anyOf": [{"const": i} for i in range(20)]},
                {"anyOf": [{"const": i} for i in range(10, 30)]},
            ]
        },
        [("15", True), ("10", True), ("5", False), ("25", False)],
    ),
    (
        "allOf of oneOf, disjoint pairs left out",
        {
            "allOf": [
                {
                    "oneOf": [
                        {"type": "string", "maxLength": 2},
                        {"type": "integer"},
                        {"type": "string", "minLength": 2},
                    ]
                },
                {"oneOf": [{"type": "string"}, {"type": "null"}]},
            ]
        },
        [('"a"', True), ('"abc"', True), ('"ab"', False), ("1", False), ("null", False)],
    ),
    (
        "not under disjoint types",
        {
            "type": "object",
            "properties": {
                "p": {"allOf": [{"type": "string"}, {"type": ["integer", "null"]}], "not": {"enum": ["a"]}}
            },
        },
        [("{}", True), ('{"p":"a"}', False), ('{"p":"b"}', False), ('{"p":1}', False), ('{"p":null}', False)],
    ),
    (
        "not propertyNames",
        {"type": "object", "not": {"propertyNames": {"not": {"enum": ["a", "b", 1]}}}},
        [("{}", False), ('{"a":1}', True), ('{"b":2,"c":1}', True), ('{"c":1}', False)],
    ),
    (
        "not only-empty object",
        {"type": "object", "not": {"patternProperties": {"x": False}, "additionalProperties": False}},
        [("{}", False), ('{"a":1}', True), ('{"xa":1}', True)],
    ),
    (
        "two not items",
        {
            "type": "array",
            "maxItems": 2,
            "allOf": [
                {"not": {"items": {"patternProperties": {"ab": False}, "additionalProperties": False}}},
                {"not": {"items": {"type": "object", "maxProperties": 1}}},
            ],
        },
        [
            ("[]", False),
            ('[{"a":1,"b":2}]', True),
            ("[{},1]", False),
            ('[{"a":1},1]', True),
            ('[{"a":1}]', False),
        ],
    ),
    (
        "allOf different patterns with additionalProperties",
        {
            "type": "object",
            "allOf": [
                {
                    "patternProperties": {"^x": {"type": "integer"}},
                    "additionalProperties": {"type": "string"},
                },
                {"patternProperties": {"y$": {"minimum": 3}}, "additionalProperties": {"maxLength": 2}},
            ],
        },
        [
            ('{"xy":4}', True),
            ('{"xy":2}', False),
            ('{"xa":1}', True),
            ('{"xa":"s"}', False),
            ('{"ay":"s"}', True),
            ('{"ay":2}', False),
            ('{"ay":"sss"}', True),
            ('{"b":"ss"}', True),
            ('{"b":"sss"}', False),
            ('{"b":1}', False),
        ],
    ),
    (
        "allOf different patterns, required and declared keys",
        {
            "type": "object",
            "required": ["xy", "b"],
            "allOf": [
                {"properties": {"b": {}}, "patternProperties": {"^x": {}}, "additionalProperties": False},
                {
                    "properties": {"c": {}},
                    "patternProperties": {"y$": {}},
                    "additionalProperties": {"type": "null"},
                },
            ],
        },
        [
            ('{"b":null,"xy":1}', True),
            ('{"b":1,"xy":1}', False),
            ('{"b":null}', False),
            ('{"b":null,"c":1,"xy":1}', False),
            ('{"b":null,"xy":1,"xz":null}', True),
            ('{"b":null,"xy":1,"xz":1}', False),
        ],
    ),
    (
        "allOf different patterns, declared key",
        {
            "type": "object",
            "allOf": [
                {"properties": {"b": {}}, "patternProperties": {"^x": {}}, "additionalProperties": False},
                {"patternProperties": {"y$": {}}, "additionalProperties": {"type": "null"}},
            ],
        },
        [
            ('{"b":null}', True),
            ('{"b":1}', False),
            ('{"x":1}', False),
            ('{"x":null}', True),
            ('{"xy":1}', True),
            ('{"y":null}', False),
        ],
    ),
    (
        "not items",
        {"type": "array", "not": {"items": {"type": "string"}}},
        [("[]", False), ('["a"]', False), ('["a",1]', True)],
    ),
    (
        "not contains",
        {"not": {"contains": {"type": "string"}}},
        [("[]", True), ('["a"]', False), ("[1,2]", True), ("1", False)],
    ),
    (
        "if then else",
        {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}},
        [('"a"', False), ('"ab"', True), ("1", True), ("1.5", False), ("null", False)],
    ),
    (
        "if then",
        {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        [("{}", True), ('{"a":1}', False), ('{"a":1,"b":2}', True)],
    ),
    ("if in allOf branches", {"allOf": [{"if": {"minimum": 5}}, {"then": {"maximum": 3}}]}, [("7", True)]),
    (
        "dependentRequired",
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        [("{}", True), ('{"a":1}', False), ('{"b":2,"a":1}', True), ('{"b":2}', True)],
    ),
    (
        "dependentSchemas",
        {
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}},
            "dependentSchemas": {"a": {"required": ["b"]}},
        },
        [("{}", True), ('{"a":1}', False), ('{"a":1,"b":2}', True), ('{"a":1,"b":"x"}', False)],
    ),
    (
        "dependencies draft 7",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "dependencies": {"a": ["b"]},
        },
        [('{"a":1,"b":2}', True), ('{"a":1}', False), ('{"b":1}', True)],
    ),
]
CASES = [(name, schema, text, exp) for name, schema, rows in TABLE for text, exp in rows]
_CACHE: dict = {}


def _automaton(schema, **kw):
    key = json.dumps([schema, kw], sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = compile_checked(schema_to_grammar(schema, **kw))
    return _CACHE[key]


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name,schema,text,expected", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_logic_table(name, schema, text, expected):
    assert _automaton(schema).accepts(text.encode()) == expected
    value = json.loads(text)
    if json.dumps(value, separators=(",", ":"), ensure_ascii=False) == text:
        assert _validator(schema).is_valid(value) == expected, "table disagrees with jsonschema"


@pytest.mark.parametrize(
    "name,schema", [(n, s) for n, s, _ in TABLE[:3] + TABLE[5:]], ids=lambda x: str(x)[:40]
)
def test_flexible_whitespace_same_verdicts(name, schema):
    """Pretty-printed valid instances are accepted in flexible mode (and compact ones still)."""
    a = _automaton(schema, whitespace="flexible")
    for text, exp in dict((r[0], r[1]) for n, _, rows in TABLE if n == name for r in rows).items():
        value = json.loads(text)
        assert a.accepts(text.encode()) == exp
        if exp and isinstance(value, (dict, list)):
            assert a.accepts(json.dumps(value, indent=2).encode())


def _exact(text: str) -> object:
    try:
        d = Decimal(text)
    except ArithmeticError:  # an exponent past Decimal's range: a stand-in of the same kind
        sign = -1 if text.startswith("-") else 1
        return sign * Decimal("1e-400" if "e-" in text.lower() else "1e400")
    if abs(d.adjusted()) > 400:
        return d  # (int() of 1e6000000 would take minutes)
    return int(d) if d == d.to_integral_value() else d


def _walks_are_valid(a, validator, rng, walks: int = 20) -> None:
    """Random byte walks over the automaton (printable ASCII where possible, so walks reach the
    interesting structure), finished along a shortest completion, give instances the validator
    accepts (numbers read exactly: a float would round 1e-999 to 0, an integer)."""
    for _ in range(walks):
        cfg, out = a.initial, bytearray()
        for _step in range(rng.randint(1, 60)):
            if a.can_end(cfg) and rng.random() < 0.2:
                break
            nxt = a.next_bytes(cfg)
            if not nxt:
                break
            b = rng.choice([b for b in nxt if 0x20 <= b < 0x7F] or nxt)
            cfg = a.step_byte(cfg, b)
            out.append(b)
        tail = _shortest_completion(a, cfg)
        assert tail is not None, f"no completion after {bytes(out)!r}"
        out += tail
        assert a.accepts(bytes(out))
        value = json.loads(out.decode("utf-8"), parse_float=_exact)
        assert validator.is_valid(value), f"walk produced an invalid instance: {bytes(out)!r}"


@pytest.mark.parametrize("name,schema", [(n, s) for n, s, _ in TABLE], ids=[n for n, _, _ in TABLE])
def test_random_walks_are_valid(name, schema):
    _walks_are_valid(_automaton(schema, whitespace="compact"), _validator(schema), random.Random(name))


@pytest.mark.parametrize(
    "schema,match",
    [
        ({"not": {"type": "array", "uniqueItems": True}}, r"'not'.*residual.*at #/not"),
        ({"not": {"enum": [1]}}, r"'not'.*at #/not"),
        ({"oneOf": [{"type": "array"}, {"uniqueItems": True}]}, r"'oneOf'.*not provably disjoint.*#/oneOf"),
        ({"if": {"not": {"uniqueItems": True}}, "then": {"minItems": 1}}, r"'if'.*at #/if"),
        (
            {"allOf": [{"contains": {"const": 1}, "minContains": 2}, {"contains": {"const": 2}}]},
            r"two different 'contains' with minContains.*at #",
        ),
        (
            {
                "allOf": [
                    {"contains": {"const": 1}},
                    {"contains": {"const": 2}},
                    {"contains": {"const": 3}},
                    {"contains": {"const": 4}},
                ]
            },
            r"'contains'.*4 contains.*#/contains",
        ),
    ],
)
def test_unenforceable_negations_raise(schema, match):
    with pytest.raises(ConstraintError, match=match):
        schema_to_grammar(schema)


def test_lenient_relaxes_residual_negation():
    g = schema_to_grammar({"type": "array", "not": {"uniqueItems": True}}, lenient=True)
    assert any("not" in n for n in g.notes)
    g = schema_to_grammar({"oneOf": [{"type": "array"}, {"uniqueItems": True}]}, lenient=True)
    assert any(n.startswith("oneOf at #/oneOf") for n in g.notes)
