"""Per-keyword accept/reject tables for the JSON Schema front end (byte-level automaton).

Every instance whose text is its own canonical serialization is also checked against
``jsonschema`` (the oracle, with format assertion on): our verdict must equal it.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from deepinfer.constraints.errors import ConstraintError, ConstraintTooComplex
from deepinfer.constraints.json_schema import schema_to_grammar

from .checked import compile_checked

OBJ_AB = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a"],
}
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

# (keyword, schema, [(instance text, expected)])
TABLE = [
    ("true", True, [("1", True), ('{"a":[null]}', True), ('"x"', True)]),
    ("empty", {}, [("null", True), ("[1,2.5e3]", True), ('"\\u00e9\\n"', True), ("01", False)]),
    (
        "type",
        {"type": "integer"},
        [("1", True), ("-20", True), ("1.5", False), ('"1"', False), ("01", False)],
    ),
    ("type list", {"type": ["string", "null"]}, [("null", True), ('"a"', True), ("1", False)]),
    ("type number", {"type": "number"}, [("1", True), ("-1.5e-3", True), ("1.", False), (".5", False)]),
    ("type boolean", {"type": "boolean"}, [("true", True), ("false", True), ("0", False)]),
    (
        "string",
        {"type": "string"},
        [('"a\\"b"', True), ('"\\ud83d\\ude00"', True), ('"é"', True), ('"\x01"', False), ('"\\x"', False)],
    ),
    (
        "minLength",
        {"type": "string", "minLength": 2, "maxLength": 3},
        [('"ab"', True), ('"abc"', True), ('"a"', False), ('"abcd"', False), ('"é😀"', True)],
    ),
    (
        "pattern",
        {"type": "string", "pattern": "^[a-z]+\\d$"},
        [('"ab1"', True), ('"1"', False), ('"ab"', False)],
    ),
    ("pattern search", {"type": "string", "pattern": "b+"}, [('"abbc"', True), ('"ac"', False)]),
    (
        "pattern $ inside",
        {"type": "string", "pattern": "x(a|b$)"},
        [('"zxb"', True), ('"xaz"', True), ('"xbz"', False), ('"xb"', True), ('"x"', False)],
    ),
    (
        "pattern $ inside anchored",
        {"type": "string", "pattern": "^(\\/?((\\.{2})|([a-z0-9\\-]*))($|\\/))*$"},
        [('"a/../b-c"', True), ('"/a/"', True), ('"a/.x"', False), ('"A"', False)],
    ),
    ("pattern quote", {"type": "string", "pattern": '^a"b$'}, [('"a\\"b"', True), ('"ab"', False)]),
    (
        "format date",
        {"type": "string", "format": "date"},
        [('"2024-02-29"', True), ('"2023-02-29"', False), ('"2023-13-01"', False)],
    ),
    ("format ipv4", {"type": "string", "format": "ipv4"}, [('"1.2.3.4"', True), ('"1.2.3.256"', False)]),
    (
        "format uuid",
        {"type": "string", "format": "uuid"},
        [('"123e4567-e89b-12d3-a456-426614174000"', True), ('"123e4567e89b12d3a456426614174000"', False)],
    ),
    ("format email", {"type": "string", "format": "email"}, [('"a.b@c.org"', True)]),
    (
        "minimum",
        {"type": "integer", "minimum": -12, "maximum": 105},
        [("-12", True), ("105", True), ("0", True), ("-13", False), ("106", False), ("1000", False)],
    ),
    (
        "exclusive",
        {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 7},
        [("4", True), ("6", True), ("3", False), ("7", False)],
    ),
    (
        "number range",
        {"type": "number", "minimum": 0.5, "maximum": 2},
        [("0.5", True), ("1.75", True), ("2", True), ("2.0", True), ("2.01", False), ("0.49", False)],
    ),
    (
        "multipleOf int",
        {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 30},
        [("0", True), ("25", True), ("26", False)],
    ),
    (
        "multipleOf 0.01",
        {"type": "number", "multipleOf": 0.01, "minimum": 0},
        [("1.25", True), ("3", True), ("1.255", False), ("-1", False)],
    ),
    (
        "enum",
        {"enum": ["a", 1, None, [1, {"x": True}]]},
        [('"a"', True), ("1", True), ("null", True), ('[1,{"x":true}]', True), ('"b"', False), ("2", False)],
    ),
    ("const", {"const": {"k": "v"}}, [('{"k":"v"}', True), ('{"k":"w"}', False)]),
    (
        "properties",
        OBJ_AB,
        [
            ('{"a":1}', True),
            ('{"a":1,"b":"x"}', True),
            ('{"b":"x"}', False),
            ('{"a":1,"c":[true]}', True),
            ('{"a":"1"}', False),
            ('{"a":1,"a":2}', False),
        ],
    ),
    (
        "additionalProperties false",
        {**OBJ_AB, "additionalProperties": False},
        [('{"a":1}', True), ('{"a":1,"c":2}', False)],
    ),
    (
        "additionalProperties schema",
        {**OBJ_AB, "additionalProperties": {"type": "boolean"}},
        [('{"a":1,"c":true}', True), ('{"a":1,"c":2}', False)],
    ),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
        [('{"x-a":1}', True), ('{"x-a":"s"}', False), ('{"y":1}', False), ("{}", True)],
    ),
    (
        "min/maxProperties",
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "additionalProperties": False,
            "minProperties": 1,
            "maxProperties": 2,
        },
        [('{"a":1}', True), ('{"a":1,"c":2}', True), ("{}", False), ('{"a":1,"b":2,"c":3}', False)],
    ),
    (
        "items",
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        [("[1]", True), ("[1,2,3]", True), ("[]", False), ("[1,2,3,4]", False), ('[1,"a"]', False)],
    ),
    (
        "prefixItems",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
        [('["a",true]', True), ('["a"]', True), ("[]", True), ('["a",true,1]', False), ("[true]", False)],
    ),
    (
        "anyOf",
        {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 5}]},
        [('"a"', True), ("5", True), ('"ab"', False), ("4", False)],
    ),
    (
        "oneOf types",
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        [('"a"', True), ("1", True), ("null", False)],
    ),
    (
        "oneOf discriminator",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["k"],
                },
                {
                    "type": "object",
                    "properties": {"k": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["k"],
                },
            ]
        },
        [('{"k":"a","x":1}', True), ('{"k":"b","y":"s"}', True), ('{"k":"c"}', False)],
    ),
    (
        "allOf",
        {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}]},
        [("0", True), ("10", True), ("11", False)],
    ),
    (
        "allOf objects",
        {"allOf": [OBJ_AB, {"properties": {"c": {"type": "null"}}, "required": ["c"]}]},
        [('{"a":1,"c":null}', True), ('{"a":1}', False)],
    ),
    (
        "$ref recursion",
        TREE,
        [('{"v":1}', True), ('{"v":1,"kids":[{"v":2,"kids":[]}]}', True), ('{"v":1,"kids":[{}]}', False)],
    ),
    (
        "$ref pointer",
        {"properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}, "type": "object"},
        [('{"a":1,"b":2}', True), ('{"a":1,"b":"x"}', False)],
    ),
    (
        "definitions",
        {"definitions": {"s": {"type": "string"}}, "type": "array", "items": {"$ref": "#/definitions/s"}},
        [('["a"]', True), ("[1]", False)],
    ),
    # pattern / format / length / several patterns: all intersected (product DFAs)
    (
        "pattern+length",
        {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3},
        [('"ab"', True), ('"abc"', True), ('"a"', False), ('"abcd"', False), ('"a1"', False)],
    ),
    (
        "pattern+length unicode",
        {"type": "string", "pattern": "^.*$", "maxLength": 2},
        [('"é😀"', True), ('"\\t"', True), ('"abc"', False), ('"é😀x"', False)],
    ),
    (
        "format+length",
        {"type": "string", "format": "ipv4", "maxLength": 7},
        [('"1.2.3.4"', True), ('"10.2.3.4"', False)],
    ),
    (
        "format+pattern",
        {"type": "string", "format": "date", "pattern": "^2024"},
        [('"2024-02-29"', True), ('"2023-02-28"', False), ('"2024-02-30"', False)],
    ),
    (
        "allOf patterns",
        {"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]},
        [('"ab"', True), ('"ba"', True), ('"a"', False), ('"b"', False)],
    ),
    (
        "long maxLength",
        {"type": "string", "maxLength": 100},
        [('"' + "x" * 100 + '"', True), ('"' + "x" * 101 + '"', False), ('"' + "\\n" * 100 + '"', True)],
    ),
    (
        "multipleOf 7",
        {"type": "integer", "multipleOf": 7},
        [("0", True), ("-14", True), ("700007", True), ("15", False), ("-15", False)],
    ),
    (
        "multipleOf 16 min",
        {"type": "integer", "multipleOf": 16, "minimum": 20},
        [("32", True), ("1600", True), ("16", False), ("40", False)],
    ),
    (
        "multipleOf 1.5 integer",
        {"type": "integer", "multipleOf": 1.5},
        [("3", True), ("9", True), ("4", False)],
    ),
    (
        "patternProperties overlap",
        {
            "type": "object",
            "properties": {"xa": {"type": "integer", "minimum": 5}},
            "patternProperties": {"^x": {"type": "integer"}, "a$": {"maximum": 10}},
            "additionalProperties": {"type": "string"},
        },
        [
            ('{"xa":7}', True),
            ('{"xa":11}', False),
            ('{"xb":1}', True),
            ('{"xb":"s"}', False),
            ('{"ya":11}', False),
            ('{"ya":"s"}', True),
            ('{"xya":12}', False),
            ('{"xya":2}', True),
            ('{"q":"s"}', True),
            ('{"q":1}', False),
        ],
    ),
    (
        "additional keys except declared",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        [
            ('{"a":1,"b":"x"}', True),
            ('{"a":1,"a":"x"}', False),
            ('{"a":1,"\\u0061":"x"}', False),
            ('{"a":1,"ab":"x"}', True),
        ],
    ),
    # draft-04 `id`: "#" (an empty fragment) is no new base and must not re-anchor the root
    (
        "draft-04 id #",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "d": {"id": "#", "type": "object", "properties": {"x": {"type": "string"}}},
            },
            "required": ["a"],
        },
        [
            ('{"a":1}', True),
            ('{"a":1,"d":{"x":"s"}}', True),
            ('{"x":"s"}', False),
            ('{"a":"1"}', False),
            ('{"a":1,"d":{"x":1}}', False),
        ],
    ),
    (
        "2020-12 $id #",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "d": {"$id": "#", "type": "string"}},
            "required": ["a"],
        },
        [('{"a":1}', True), ('{"a":1,"d":"s"}', True), ('{"d":"s"}', False)],
    ),
    (
        "draft-04 id anchor",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "definitions": {"s": {"id": "#str", "type": "string"}},
            "type": "array",
            "items": {"$ref": "#str"},
        },
        [('["a"]', True), ("[1]", False)],
    ),
    # an unsatisfiable optional property / item / branch / additionalProperties is dropped
    (
        "unsatisfiable optional property",
        {
            "type": "object",
            "properties": {"b": {"enum": ["X", "Y"], "type": "object"}, "c": {"type": "integer"}},
        },
        [
            ("{}", True),
            ('{"c":1}', True),
            ('{"b":"X"}', False),
            ('{"b":{}}', False),
            ('{"b":"X","c":1}', False),
        ],
    ),
    (
        "unsatisfiable required property",
        {
            "type": ["object", "null"],
            "properties": {"b": {"enum": ["X"], "type": "object"}},
            "required": ["b"],
        },
        [("null", True), ('{"b":"X"}', False), ("{}", False)],
    ),
    (
        "unsatisfiable nested required",
        {
            "type": "object",
            "properties": {
                "o": {"type": "object", "properties": {"b": False}, "required": ["b"]},
                "c": {"type": "null"},
            },
        },
        [("{}", True), ('{"c":null}', True), ('{"o":{}}', False), ('{"o":{"b":1}}', False)],
    ),
    (
        "unsatisfiable items",
        {"type": "array", "items": {"enum": ["X"], "type": "integer"}},
        [("[]", True), ('["X"]', False), ("[1]", False)],
    ),
    (
        "unsatisfiable items minItems",
        {"type": ["array", "null"], "items": {"enum": ["X"], "type": "integer"}, "minItems": 1},
        [("null", True), ("[]", False), ('["X"]', False)],
    ),
    (
        "unsatisfiable anyOf branch",
        {"anyOf": [{"enum": ["X"], "type": "integer"}, {"type": "string"}]},
        [('"X"', True), ('"y"', True), ("1", False)],
    ),
    (
        "unsatisfiable additionalProperties",
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"enum": [1], "type": "string"}},
        [("{}", True), ('{"a":1}', True), ('{"a":1,"b":1}', False), ('{"b":"1"}', False)],
    ),
    # a JS-style /.../ pattern is an ECMA regex with literal slashes: "/^" can never match
    (
        "slashed pattern optional",
        {
            "type": "object",
            "properties": {"y": {"type": "string", "pattern": "/^[0-9]{4}$/"}, "z": {"type": "integer"}},
        },
        [("{}", True), ('{"z":1}', True), ('{"y":"2001"}', False), ('{"y":"/2001/"}', False)],
    ),
    (
        "slashed pattern root",
        {"type": ["string", "null"], "pattern": "/^[0-9]{4}$/"},
        [("null", True), ('"2001"', False), ('"/2001/"', False)],
    ),
    (
        "slashed pattern branch",
        {"type": "string", "pattern": "/^a$/|^b$"},
        [('"b"', True), ('"a"', False), ('"/a/"', False)],
    ),
    (
        "slashed pattern end",
        {"type": ["string", "integer"], "pattern": "^a$/"},
        [("1", True), ('"a"', False), ('"a/"', False), ('"b"', False)],
    ),
    (
        "slashed pattern no type",
        {"pattern": "/^[0-9]{4}$/"},
        [("1", True), ("null", True), ('"2001"', False)],
    ),
    (
        "slashed patternProperties",
        {
            "type": "object",
            "patternProperties": {"/^x$/": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        [('{"x":"s"}', True), ('{"/x/":"s"}', True), ('{"x":1}', False)],
    ),
    (
        "propertyNames with declared",
        {"type": "object", "properties": {"id": {}}, "propertyNames": {"maxLength": 3}},
        [('{"id":1,"abc":1}', True), ('{"id":1,"abcd":1}', False)],
    ),
    (
        "uniqueItems enum",
        {"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b", "c"]}},
        [
            ("[]", True),
            ('["a","b","c"]', True),
            ('["c","a"]', True),
            ('["a","a"]', False),
            ('["a","b","a"]', False),
            ('["d"]', False),
        ],
    ),
    (
        "uniqueItems boolean",
        {"type": "array", "uniqueItems": True, "items": {"type": "boolean"}, "minItems": 1},
        [
            ("[true,false]", True),
            ("[false]", True),
            ("[true,true]", False),
            ("[]", False),
            ("[false,true,false]", False),
        ],
    ),
    (
        "uniqueItems numbers",
        {"type": "array", "uniqueItems": True, "items": {"enum": [1, 2.0, None]}},
        [
            ("[1,2]", True),
            ("[2.0,1,null]", True),
            ("[1,1.0]", False),
            ("[2,2.0]", False),
            ("[null,null]", False),
        ],
    ),
    (
        "uniqueItems prefixItems",
        {
            "type": "array",
            "uniqueItems": True,
            "items": False,
            "prefixItems": [{"type": "boolean"}, {"enum": [True, "x"]}],
        },
        [
            ("[false,true]", True),
            ('[true,"x"]', True),
            ("[true,true]", False),
            ("[]", True),
            ("[false,false]", False),
        ],
    ),
    (
        "uniqueItems enum ref",
        {
            "type": "array",
            "uniqueItems": True,
            "items": {"$ref": "#/$defs/e"},
            "maxItems": 2,
            "$defs": {"e": {"type": "string", "enum": ["x", "y", 3]}},
        },
        [('["x","y"]', True), ('["y","x"]', True), ('["x","x"]', False), ("[3]", False), ('["y"]', True)],
    ),
]
CASES = [(name, schema, text, exp) for name, schema, rows in TABLE for text, exp in rows]


def _automaton(schema, **kw):
    return compile_checked(schema_to_grammar(schema, **kw))


_CACHE: dict = {}


@pytest.mark.parametrize("name,schema,text,expected", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_keyword_table(name, schema, text, expected):
    key = json.dumps(schema, sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = _automaton(schema)
    assert _CACHE[key].accepts(text.encode()) == expected
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        assert not expected
        return
    canonical = json.dumps(value, separators=(",", ":"), ensure_ascii=False) == text
    if canonical:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        oracle = cls(schema, format_checker=jsonschema.FormatChecker()).is_valid(value)
        assert oracle == expected, "table disagrees with jsonschema"


def test_flexible_whitespace_bounded():
    a = _automaton(OBJ_AB, whitespace="flexible")
    assert a.accepts(json.dumps({"a": 1, "b": "x"}, indent=2).encode())
    assert a.accepts(b'{ "a" : 1 }')
    assert not a.accepts(b"{" + b" " * 40 + b'"a":1}')
    assert not _automaton(OBJ_AB, whitespace="compact").accepts(b'{ "a":1}')


def test_natural_whitespace_is_what_models_write_and_bounded():
    """ "natural": the layouts of json.dumps (spaced, indented, compact); nothing before ':' or
    ',', at most one space or one line break + FLEX_INDENT spaces at a time."""
    a = _automaton(OBJ_AB, whitespace="natural")
    v = {"a": 1, "b": "x"}
    for text in (
        json.dumps(v),
        json.dumps(v, indent=2),
        json.dumps(v, indent=4),
        json.dumps(v, separators=(",", ":")),
    ):
        assert a.accepts(text.encode()), text
    assert a.accepts(b'{ "a": 1 }')
    assert not a.accepts(b'{"a" : 1}')  # before ':'
    assert not a.accepts(b'{"a": 1 , "b": "x"}')  # before ','
    assert not a.accepts(b'{"a":  1}')  # two spaces
    assert not a.accepts(b'{\n\n"a": 1}')  # two line breaks
    assert not a.accepts(b"{\n" + b" " * 21 + b'"a": 1}')  # indent past FLEX_INDENT
    assert not a.accepts(b'{\t"a": 1}')


def test_whitespace_too_large_falls_back_to_a_narrower_one():
    """Where a whitespace makes the automaton too large, the schema compiles with the next
    narrower whitespace (whose outputs the wider one allows), says so in ``notes``, and keeps
    that result under the wider key; with none left, the size error stands."""
    from deepinfer.constraints import Compiler
    from deepinfer.constraints.automaton.nfa import Limits

    from .vocabs import small_vocab

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefgh"}}
    vocab = small_vocab()
    sizes = {
        ws: Compiler(vocab).json_schema(schema, whitespace=ws).automaton.n_states
        for ws in ("compact", "natural", "flexible")
    }
    assert sizes["compact"] < sizes["natural"] < sizes["flexible"]
    indented = json.dumps({"a": 1, "b": 2}, indent=2).encode()
    for bound, used in ((sizes["flexible"] - 1, "natural"), (sizes["natural"] - 1, "compact")):
        c = Compiler(vocab, limits=Limits(max_dfa_states=bound))
        got = c.json_schema(schema, whitespace="flexible")
        assert got.whitespace_used == used and got.automaton.n_states == sizes[used]
        assert len(got.notes) == 1 and "too large" in got.notes[0] and f"with {used!r}" in got.notes[0]
        assert got.accepts(b'{"a":1,"b":2}') and got.accepts(indented) == (used == "natural")
        assert not got.accepts(b'{\t"a":1}')  # flexible only
        assert c.json_schema(schema, whitespace="flexible") is got  # kept under the wider key
        assert c.json_schema(schema, whitespace=used).notes == []  # the narrower one's own
    with pytest.raises(ConstraintTooComplex, match="states"):
        Compiler(vocab, limits=Limits(max_dfa_states=sizes["compact"] - 1)).json_schema(schema)


def test_whitespace_too_large_in_tags_and_after_reasoning_falls_back():
    """Schemas inside structural tags and after a reasoning block fall back as a schema
    alone does: where their whitespace makes the automaton too large, each is compiled one
    step narrower, with a note, and the result is kept under the wider spec's key."""
    from deepinfer.constraints import Compiler
    from deepinfer.constraints.automaton.nfa import Limits

    from .vocabs import small_vocab

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcdefgh"}}
    vocab = small_vocab()
    tag = {"begin": "<t>", "end": "</t>", "json_schema": schema}

    def tags(c: Compiler, ws: str | None = None):
        return c.structural_tags([dict(tag, whitespace=ws) if ws else tag])

    def reasoning(c: Compiler, ws: str | None = None):
        after = {"json_schema": schema, **({"whitespace": ws} if ws else {})}
        return c.reasoning(after, begin="<r>", end="</r>")

    indented = json.dumps({"a": 1, "b": 2}, indent=2)
    for make, text in ((tags, "hi <t>{}</t> bye"), (reasoning, "<r>so</r>{}")):
        sizes = {
            ws: make(Compiler(vocab), ws).automaton.n_states for ws in ("compact", "natural", "flexible")
        }
        assert sizes["compact"] < sizes["natural"] < sizes["flexible"]
        for bound, used in ((sizes["flexible"] - 1, "natural"), (sizes["natural"] - 1, "compact")):
            c = Compiler(vocab, limits=Limits(max_dfa_states=bound))
            got = make(c)  # the default whitespace: flexible
            assert got.automaton.n_states == sizes[used]
            assert len(got.notes) == 1 and "too large" in got.notes[0] and f"with {used!r}" in got.notes[0]
            assert got.accepts(text.format('{"a":1,"b":2}').encode())
            assert got.accepts(text.format(indented).encode()) == (used == "natural")
            assert make(c) is got  # kept under the wider spec's key
            assert make(c, used).notes == []
        with pytest.raises(ConstraintTooComplex, match="states"):
            make(Compiler(vocab, limits=Limits(max_dfa_states=sizes["compact"] - 1)))


def test_strict_forbids_extra_keys():
    assert not _automaton(OBJ_AB, strict=True).accepts(b'{"a":1,"c":2}')


def test_schema_as_text_and_pydantic():
    pydantic = pytest.importorskip("pydantic")

    class User(pydantic.BaseModel):
        name: str
        age: int

    a = _automaton(User)
    assert a.accepts(b'{"name":"x","age":3}')
    assert not a.accepts(b'{"name":"x"}')
    assert _automaton('{"type":"boolean"}').accepts(b"true")


ERRORS = [
    ({"properties": {"a": {"not": {"uniqueItems": True}}}}, r"'not'.*#/properties/a/not"),
    ({"if": {"not": {"uniqueItems": True}}, "then": {"minItems": 1}}, r"'if'.*at #/if"),
    ({"type": "array", "prefixItems": [{}], "contains": {"type": "integer"}}, r"contains.*#/contains"),
    ({"oneOf": [{"type": "array"}, {"uniqueItems": True}]}, r"oneOf.*#/oneOf"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, r"unsatisfiable.*at #"),
    ({"enum": []}, r"no enum value.*#/enum"),
    ({"type": "object", "required": ["x"], "additionalProperties": False}, r"'x' is not allowed.*#/required"),
    ({"$ref": "http://example.com/s.json"}, r"remote refs.*#/\$ref"),
    ({"type": "integer", "multipleOf": 10007}, r"multipleOf.*#/multipleOf"),
    ({"type": "string", "pattern": "a?^b"}, r"anchor \^ not at the start.*#/pattern"),
    ({"type": "string", "pattern": "(/)^b"}, r"anchor \^ not at the start.*#/pattern"),
    (
        {"type": "object", "properties": {"b": False}, "required": ["b"]},
        r"unsatisfiable.*'b'.*#/properties/b",
    ),
    ({"type": "string", "pattern": "/^[0-9]{4}$/"}, r"unsatisfiable.*matches no string.*#/pattern"),
]


@pytest.mark.parametrize("schema,match", ERRORS)
def test_errors_name_keyword_and_pointer(schema, match):
    with pytest.raises(ConstraintError, match=match):
        schema_to_grammar(schema)


def test_lenient_relaxes_and_notes():
    # (uniqueItems over free items is checked at run time, see test_unique_items.py; without
    # that check it is relaxed and noted as before)
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    g = schema_to_grammar(schema, lenient=True, runtime_unique=False)
    assert g.notes == ["uniqueItems at #/properties/tags/uniqueItems"]
    with pytest.raises(ConstraintError, match=r"uniqueItems.*#/properties/tags/uniqueItems"):
        schema_to_grammar(schema, runtime_unique=False)
    g = schema_to_grammar(schema, lenient=True)
    assert g.notes == [] and g.unique == ("#/properties/tags/uniqueItems",)


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": list(range(20_000))},
        {
            "type": "array",
            "items": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)}},
            "maxItems": 100_000,
        },
    ],
)
def test_untrusted_sizes_are_bounded(schema):
    with pytest.raises(ConstraintTooComplex):
        schema_to_grammar(schema)


def test_huge_max_length_is_counted_not_copied():
    """A string's maxLength of ten million was over the size bound while the automaton copied
    the character once per position; counted (one copy and a counter) it compiles at once."""
    from deepinfer.constraints.json_schema.common import MAX_REPEAT_COST, cost

    g = schema_to_grammar({"type": "string", "maxLength": 10_000_000})
    assert sum(cost(e) for e in g.rules.values()) < MAX_REPEAT_COST


def test_deep_nesting_bounded():
    s: dict = {"type": "integer"}
    for _ in range(200):
        s = {"type": "array", "items": s}
    with pytest.raises(ConstraintTooComplex, match="nesting"):
        schema_to_grammar(s)
