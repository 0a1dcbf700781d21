"""Hostile input to the compiler: every refusal is a ConstraintError naming where (a JSON
pointer, a regex position, a grammar line and column), every bound is met at its value and
refused just past it (fast), and the front end is linear and under the compile deadline.

Regression examples for the three classes of the hardening issue: (1) errors that were not
ConstraintError, (2) unbounded time or memory in the front end, (3) judging a whole output
in linear time (``CompiledConstraint.accepts``). ``test_fuzz.py`` looks for the next ones.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import time

import pytest

from deepinfer.constraints import Compiler, ConstraintError, ConstraintTooComplex, Matcher, ir
from deepinfer.constraints.frontends.regex import regex_to_ir
from deepinfer.constraints.json_schema import checks, objects, schema_to_grammar
from deepinfer.constraints.limits import Limits

from .vocabs import small_vocab

FAST = 1.5  # seconds: a size bound refuses before the work it bounds


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(small_vocab())


@pytest.fixture(scope="module")
def custom() -> Compiler:
    """A compiler whose limits a test replaces (and puts back)."""
    return Compiler(small_vocab())


def refused(fn, cls=ConstraintError, *, path=None, line=None, column=None, position=None, within=FAST):
    """Call ``fn``: it must raise ``cls`` within ``within`` seconds, naming the location given
    (attribute and message); returns the error."""
    t0 = time.monotonic()
    with pytest.raises(cls) as info:
        fn()
    took = time.monotonic() - t0
    e = info.value
    assert took < within, f"refused after {took:.2f} s: {e}"
    assert e.located, f"no location: {e}"
    msg = str(e)
    if path is not None:
        assert e.path == path and f"at {path}" in msg, msg
    if line is not None:
        assert e.line == line and f"line {line}" in msg, msg
    if column is not None:
        assert e.column == column and f"column {column}" in msg, msg
    if position is not None:
        assert e.position == position and f"position {position}" in msg, msg
    return e


# ------------------------------------------------ class 1: the error is a ConstraintError

WRONG_TYPES = [
    ({"properties": []}, "#/properties", "is not of type 'object'"),
    ({"type": "string", "pattern": 5}, "#/pattern", "is not of type 'string'"),
    (
        {"properties": {"age": {"maxLength": "3"}}},
        "#/properties/age/maxLength",
        "'3' is not of type 'integer'",
    ),
    ({"type": "object", "required": "a"}, "#/required", "is not of type 'array'"),
    ({"enum": {}}, "#/enum", "is not of type 'array'"),
    ({"type": "array", "items": 3}, "#/items", "is not of type 'object', 'boolean'"),
    ({"$ref": 5}, "#/$ref", "is not of type 'string'"),
    ({"anyOf": []}, "#/anyOf", "should be non-empty"),
    ({"allOf": [{"type": 3}]}, "#/allOf/0/type", ""),
    ({"type": "foo"}, "#/type", ""),
    ({"minLength": 1.5}, "#/minLength", "is not of type 'integer'"),
    ({"minimum": "0"}, "#/minimum", "is not of type 'number'"),
    ({"$defs": {"a/b~c": {"minItems": -1}}}, "#/$defs/a~1b~0c/minItems", "less than the minimum"),
    (
        {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"required": [1]}}},
        "#/definitions/a/required/0",
        "draft 7",
    ),
    (
        {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": 3},
        "#/exclusiveMinimum",
        "draft 4",
    ),
]


@pytest.mark.parametrize("schema, pointer, why", WRONG_TYPES)
def test_wrong_typed_keywords_are_refused_at_their_pointer(compiler, schema, pointer, why):
    e = refused(lambda: compiler.json_schema(schema), path=pointer)
    assert type(e) is ConstraintError and "invalid JSON Schema" in str(e) and why in str(e)
    # the same through JSON text
    refused(lambda: compiler.json_schema(json.dumps(schema)), path=pointer)


def test_metaschema_check_of_a_big_schema_in_pieces_finds_a_deep_error(compiler):
    props = {f"p{i}": {"type": "string", "description": "x" * (i % 7)} for i in range(600)}
    props["p599"] = {"type": "object", "properties": {"q": {"maxItems": "2"}}}
    schema = {"type": "object", "properties": props}
    assert checks.check_value(schema, Limits())[id(schema)] > checks.CHUNK_NODES
    refused(lambda: compiler.json_schema(schema), path="#/properties/p599/properties/q/maxItems")
    props["p599"] = {"type": "object", "properties": {"q": {"maxItems": 2}}}
    compiler.json_schema(schema, whitespace="compact")


@pytest.mark.parametrize(
    "text, pointer",
    [
        ('{"type": "number", "minimum": NaN}', "#/minimum"),
        ('{"type": "number", "maximum": Infinity}', "#/maximum"),
        ('{"enum": [1, -Infinity]}', "#/enum/1"),
        ('{"type": "integer", "multipleOf": 1e999}', "#/multipleOf"),
    ],
)
def test_nan_and_infinity_in_json_text_are_refused(compiler, text, pointer):
    e = refused(lambda: compiler.json_schema(text), path=pointer)
    assert "not a JSON number" in str(e)


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"type": "number", "minimum": float("nan")}, "#/minimum"),
        ({"type": "integer", "maximum": float("inf")}, "#/maximum"),
        ({"properties": {"a": {"exclusiveMinimum": float("-inf")}}}, "#/properties/a/exclusiveMinimum"),
        ({"type": "integer", "multipleOf": float("inf")}, "#/multipleOf"),
    ],
)
def test_nan_and_infinity_in_dicts_are_refused(compiler, schema, pointer):
    refused(lambda: compiler.json_schema(schema), path=pointer)


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"type": "object", "properties": {"\ud800": {}}}, "#/properties/\ud800"),
        ({"type": "object", "required": ["a\udfffb"]}, "#/required/0"),
        ({"type": "string", "pattern": "a\ud83d"}, "#/pattern"),
        ({"enum": ["ok", "\ud800"]}, "#/enum/1"),
        ({"const": {"k": "\udc00"}}, "#/const/k"),
    ],
)
def test_lone_surrogates_in_schemas_are_refused(compiler, schema, pointer):
    e = refused(lambda: compiler.json_schema(schema), path=pointer)
    assert "lone surrogate" in str(e)


def test_lone_surrogates_in_regexes_grammars_and_choices(compiler):
    e = refused(lambda: compiler.grammar('start: "a"\n  | "\ud800"'), line=2, column=6)
    assert "lone surrogate" in str(e)
    refused(lambda: compiler.choice(["a", "b\udfff"]), path="#/1")
    # a regex is matched over UTF-8 text: a lone surrogate matches nothing, like re over text
    c = compiler.regex("a|\ud800")
    assert c.accepts(b"a") and not c.accepts("\ud800")
    refused(lambda: compiler.regex("\ud800"), position=0)


def test_json_text_nested_past_any_parser_is_refused(compiler):
    text = "[" * 100_000 + "]" * 100_000
    e = refused(lambda: compiler.json_schema(text), ConstraintTooComplex)
    assert e.bound == "max_schema_nesting" and e.path == "#" + "/0" * 128
    text = '{"items": ' * 5_000 + "{}" + "}" * 5_000
    e = refused(lambda: compiler.json_schema(text), ConstraintTooComplex)
    assert e.path == "#" + "/items" * 128


def test_dicts_nested_past_any_parser_and_cycles_are_refused(compiler):
    deep: dict = {}
    for _ in range(50_000):
        deep = {"not": deep}
    e = refused(lambda: compiler.json_schema(deep), ConstraintTooComplex)
    assert e.bound == "max_schema_nesting" and e.path == "#" + "/not" * 128
    cyclic: dict = {"type": "array"}
    cyclic["items"] = cyclic
    refused(lambda: compiler.json_schema(cyclic), ConstraintTooComplex, path="#" + "/items" * 128)


def test_values_that_are_not_json_are_refused(compiler):
    refused(lambda: compiler.json_schema({"enum": [{1, 2}]}), path="#/enum/0")
    refused(lambda: compiler.json_schema({"properties": {1: {}}}), path="#/properties")
    refused(lambda: compiler.json_schema({"const": b"x"}), path="#/const")


def test_schema_nesting_past_the_lowering_bound_names_the_pointer(compiler):
    from deepinfer.constraints.json_schema.common import MAX_DEPTH

    def chain(n: int) -> dict:
        s: dict = {"type": "integer"}
        for _ in range(n):
            s = {"type": "array", "items": s}
        return s

    compiler.json_schema(chain(MAX_DEPTH - 1), whitespace="compact")
    e = refused(lambda: compiler.json_schema(chain(MAX_DEPTH)), ConstraintTooComplex)
    assert e.path.startswith("#/items/items") and "nesting deeper than" in str(e)


@pytest.mark.parametrize(
    "text, line, column",
    [
        ("start: " + "(" * 5000 + '"a"' + ")" * 5000, 1, 8 + 64),
        ("start: x\nx: " + "[" * 300 + '"a"' + "]" * 300, 2, 4 + 64),
        ('start: "a" x\nx: ' + '("b" ' * 400 + ")*" * 400, 2, 4 + 64 * 5),
    ],
)
def test_deep_lark_grammars_are_refused_with_line_and_column(compiler, text, line, column):
    e = refused(lambda: compiler.grammar(text), ConstraintTooComplex, line=line, column=column)
    assert e.bound == "max_grammar_nesting"


def test_deep_regexes_are_refused_with_their_position(compiler):
    for p, pos in [
        ("(" * 5000 + "a" + ")" * 5000, 100),
        ("(?:" * 500 + "a" + ")" * 500, 300),
        ("a(b|" * 200, 401),
    ]:
        e = refused(lambda p=p: compiler.regex(p), ConstraintTooComplex, position=pos)
        assert e.bound == "max_regex_nesting"


def test_bad_arguments_are_constraint_errors(compiler):
    refused(lambda: compiler.regex(None), position=0)
    refused(lambda: compiler.regex("a", flags="x"), position=0)
    refused(lambda: compiler.regex("a", flags=re.LOCALE), position=0)
    refused(lambda: compiler.grammar(5), line=1, column=1)
    refused(lambda: compiler.grammar('start: "a"', start=3), line=1, column=1)
    refused(lambda: compiler.choice("abc"), path="#")
    refused(lambda: compiler.choice(["a", 2]), path="#/1")
    refused(lambda: compiler.json_schema({}, whitespace=3), path="#")
    refused(lambda: compiler.json_schema(None), path="#")
    refused(lambda: compiler.json_schema('{"type": "string"'), path="#")
    refused(lambda: compiler.json_schema("1" * 5000), path="#")  # past Python's int digits


def test_errors_of_the_automaton_stage_name_a_location(compiler, custom):
    # a grammar unsatisfiable only once compiled: the start rule's definition
    refused(lambda: compiler.grammar('x: "a"\nstart: x start'), line=2, column=1)
    # a regex too big for the automaton: the whole pattern
    with_limits(custom, max_dfa_states=50)
    try:
        refused(lambda: custom.regex("[ab]*a[ab]{8}"), ConstraintTooComplex, position=0)
        refused(
            lambda: custom.json_schema({"type": "string", "pattern": "^[ab]*a[ab]{8}$"}),
            ConstraintTooComplex,
            path="#",
        )
    finally:
        custom.limits = Limits()


def test_unresolvable_refs_under_enum_are_constraint_errors(compiler):
    refused(lambda: compiler.json_schema({"$ref": "a", "enum": [1]}), path="#/enum")


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"allOf": [{"$ref": "#"}], "enum": [1]}, "#/enum"),
        ({"anyOf": [{"not": {"$ref": "#"}}], "enum": [1]}, "#/enum"),
        ({"maxContains": 65, "$ref": "#", "multipleOf": 97, "enum": [2.5, "", True, {"a": 1}]}, "#/enum"),
    ],
)
def test_ref_cycles_under_enum_recurse_into_a_constraint_error(compiler, schema, pointer):
    e = refused(lambda: compiler.json_schema(schema), ConstraintTooComplex, path=pointer, within=10)
    assert "recursed too deeply" in str(e)


def test_a_rust_panic_of_jsonschema_is_a_constraint_error(compiler, monkeypatch):
    """jsonschema's ``referencing`` (Rust, pyo3) panics when Python's recursion limit hits
    inside its callbacks: ``pyo3_runtime.PanicException``, a BaseException."""

    class PanicException(BaseException):
        pass

    class Exploding:
        def iter_errors(self, node):
            raise PanicException("__eq__ failed!: PyErr { value: <unprintable RecursionError object> }")

    monkeypatch.setattr(checks, "jsonschema_validator", lambda cls: Exploding())
    # (an invalid schema: the fast metaschema check hands it to jsonschema for the error)
    e = refused(
        lambda: compiler.json_schema({"type": "integer", "minimum": "panic"}), ConstraintTooComplex, path="#"
    )
    assert "too deeply" in str(e)


def test_a_counted_repetition_in_an_unreachable_rule_is_not_compiled():
    from deepinfer.constraints.automaton.pushdown import compile_grammar
    from deepinfer.constraints.json_schema import formats as jf

    # (was KeyError: '\x00count0': the rule's counter region was compiled, its rule not)
    g = ir.Grammar({"start": ir.lit("a"), "dead": ir.seq(jf.QUOTE, ir.rep(jf.CHAR, 0, 5000), jf.QUOTE)})
    a = compile_grammar(g)
    assert a.accepts(b"a") and not a.accepts(b'""')


def test_catastrophic_patterns_do_not_hang_the_front_end(compiler):
    # Python's re backtracks exponentially on these; the front end matches with automata
    evil = "^(a+)+$"
    key = "a" * 40 + "!"
    compiler.json_schema(
        {"type": "object", "patternProperties": {evil: {"type": "integer"}}, "required": [key]},
        whitespace="compact",
    )
    refused(lambda: compiler.json_schema({"enum": [key], "pattern": evil, "type": "string"}), path="#")


# ------------------------------------------------ class 2: bounds, at and past their value


def with_limits(c: Compiler, **changes) -> None:
    c.limits = dataclasses.replace(Limits(), **changes)


def test_schema_chars_bound(compiler):
    bound = Limits().max_schema_chars
    head, tail = '{"description": "', '"}'
    text = head + "x" * (bound - len(head) - len(tail)) + tail
    assert len(text) == bound
    compiler.json_schema(text)
    e = refused(lambda: compiler.json_schema(text[:-2] + 'x"}'), ConstraintTooComplex, path="#")
    assert e.bound == "max_schema_chars"


def test_schema_nodes_bound(compiler):
    bound = Limits().max_schema_nodes
    compiler.json_schema({"examples": [0] * (bound - 2)})  # the object, the array, its items
    e = refused(
        lambda: compiler.json_schema({"examples": [1] * (bound - 1)}),
        ConstraintTooComplex,
        path=f"#/examples/{bound - 2}",
    )
    assert e.bound == "max_schema_nodes"


def test_schema_nesting_bound(compiler):
    bound = Limits().max_schema_nesting

    def nested(n: int) -> dict:  # n nested containers: the object and n - 1 arrays
        v: object = 0
        for _ in range(n - 1):
            v = [v]
        return {"const": v}

    compiler.json_schema(nested(bound))
    compiler.json_schema(json.dumps(nested(bound)))
    e = refused(lambda: compiler.json_schema(nested(bound + 1)), ConstraintTooComplex)
    assert e.bound == "max_schema_nesting" and e.path == "#/const" + "/0" * (bound - 1)


def test_properties_bound(compiler):
    bound = Limits().max_properties

    def wide(n: int) -> dict:
        props = {f"p{i}": {"type": "boolean"} for i in range(n)}
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}

    c = compiler.json_schema(wide(bound), whitespace="compact")
    assert c.accepts(json.dumps({f"p{i}": True for i in range(bound)}, separators=(",", ":")))
    e = refused(lambda: compiler.json_schema(wide(bound + 1)), ConstraintTooComplex, path="#/properties")
    assert e.bound == "max_properties"


def test_count_bound(compiler):
    compiler.json_schema({"type": "string", "maxLength": checks.MAX_COUNT}, whitespace="compact")
    e = refused(
        lambda: compiler.json_schema({"type": "string", "maxLength": checks.MAX_COUNT + 1}),
        ConstraintTooComplex,
        path="#/maxLength",
    )
    assert e.bound == "MAX_COUNT"
    refused(
        lambda: compiler.json_schema({"type": "array", "minItems": 1e300}),
        ConstraintTooComplex,
        path="#/minItems",
    )


def test_regex_chars_bound(compiler):
    bound = Limits().max_regex_chars
    assert compiler.regex("a" * bound).accepts(b"a" * bound)
    e = refused(lambda: compiler.regex("b" * (bound + 1)), ConstraintTooComplex, position=bound)
    assert e.bound == "max_regex_chars"


def test_regex_nesting_bound(compiler):
    bound = Limits().max_regex_nesting
    assert compiler.regex("(" * bound + "a" + ")" * bound).accepts(b"a")
    e = refused(lambda: compiler.regex("(" * (bound + 1) + "b" + ")" * (bound + 1)), ConstraintTooComplex)
    assert e.bound == "max_regex_nesting" and e.position == bound


def test_grammar_chars_bound(compiler):
    bound = Limits().max_grammar_chars
    head = 'start: "a"\n// '
    text = head + "x" * (bound - len(head))
    assert compiler.grammar(text).accepts(b"a")
    e = refused(
        lambda: compiler.grammar(text + "y"), ConstraintTooComplex, line=2, column=bound - len(head) + 4
    )
    assert e.bound == "max_grammar_chars"


def test_grammar_nesting_bound(compiler):
    bound = Limits().max_grammar_nesting
    assert compiler.grammar("start: " + "(" * bound + '"a"' + ")" * bound).accepts(b"a")
    e = refused(
        lambda: compiler.grammar("start: " + "[" * (bound + 1) + '"b"' + "]" * (bound + 1)),
        ConstraintTooComplex,
        line=1,
        column=8 + bound,
    )
    assert e.bound == "max_grammar_nesting"


def test_ir_nodes_bound(custom):
    pattern = "(ab|cd)*e[0-9]{3}"
    n = ir.count_nodes([regex_to_ir(pattern)], 10**9)
    with_limits(custom, max_ir_nodes=n)
    try:
        assert custom.regex(pattern).accepts(b"abcde123")
        e = refused(lambda: custom.regex(pattern + "f"), ConstraintTooComplex, position=0)
        assert e.bound == "max_ir_nodes"
    finally:
        custom.limits = Limits()


def test_enum_bound(compiler):
    from deepinfer.constraints.json_schema.common import MAX_ENUM

    compiler.json_schema({"enum": list(range(MAX_ENUM))}, whitespace="compact")
    refused(
        lambda: compiler.json_schema({"enum": list(range(MAX_ENUM + 1))}), ConstraintTooComplex, path="#/enum"
    )


def wide_optional(n: int, kind: str = "string") -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": kind} for i in range(n)}}


def test_time_bound_covers_the_front_end(custom):
    schema = {**wide_optional(1000, "boolean"), "required": [f"p{i}" for i in range(1000)]}
    # within the bound (the default): compiles; past it: refused in the front end, at once.
    # The bound is a quarter of the front end's own time (warm), so the refusal lands there
    # whatever the automaton's share of the whole
    custom.json_schema(schema, whitespace="compact")
    schema_to_grammar(schema, whitespace="natural")
    front = float("inf")
    for _ in range(3):  # (the fastest of three: a pause of the host or of Python's collector in
        # one would set a bound the front end may then beat, leaving the refusal to the automaton)
        t0 = time.monotonic()
        schema_to_grammar(schema, whitespace="natural")
        front = min(front, time.monotonic() - t0)
    with_limits(custom, max_seconds=min(0.05, front / 4))
    try:
        e = refused(
            lambda: custom.json_schema(schema, whitespace="natural"), ConstraintTooComplex, within=1.0
        )
        assert e.bound == "max_seconds" and "too long" in str(e)
        assert any(stage in str(e) for stage in ("schema check", "metaschema check", "lowering", "front end"))
    finally:
        custom.limits = Limits()


def test_time_bound_covers_the_automaton(custom):
    # 1,000 optional strings: most of the compile is subset construction. The bound is set from
    # this machine's own times: above the front end's, well below a whole compile of a twin schema
    # (other names, so no cache answers), so the refusal lands in the automaton whatever the host
    schema, twin = (
        wide_optional(1000),
        {"type": "object", "properties": {f"q{i}": {"type": "string"} for i in range(1000)}},
    )
    t0 = time.monotonic()
    custom.json_schema(twin, whitespace="compact")
    whole = time.monotonic() - t0
    front = float("inf")
    for _ in range(3):
        t0 = time.monotonic()
        schema_to_grammar(schema, whitespace="compact")
        front = min(front, time.monotonic() - t0)
    assert whole > 4 * front, (whole, front)  # (else this schema no longer tests the automaton)
    bound = max(2 * front, whole / 4)
    with_limits(custom, max_seconds=bound)
    try:
        compile_it = lambda: custom.json_schema(schema, whitespace="compact")  # noqa: E731
        e = refused(compile_it, ConstraintTooComplex, path="#", within=bound + 0.8)
        assert e.bound == "max_seconds" and "too long" in str(e)
        assert "construction" in str(e), str(e)  # (NFA or DFA: the automaton, not the front end)
    finally:
        custom.limits = Limits()
    c = custom.json_schema(schema, whitespace="compact")
    assert c.accepts(b'{"p3":"x","p999":""}') and not c.accepts(b'{"p999":"","p3":"x"}')


@pytest.mark.parametrize("n", [2_000, 5_000])
def test_front_end_is_linear_in_properties(n):
    from deepinfer.constraints.json_schema import schema_to_grammar

    limits = Limits(max_properties=10**6)
    schema = {**wide_optional(n), "required": [f"p{i}" for i in range(0, n, 2)]}
    t0 = time.monotonic()
    g = schema_to_grammar(schema, limits=limits)
    took = time.monotonic() - t0
    assert took < 0.002 * n, took  # (was quadratic: 4.5 s at 2,000, 42 s at 5,000)
    assert ir.count_nodes(g.rules.values(), 10**9) < 60 * n


def test_chained_member_tails_keep_the_language(compiler, monkeypatch):
    """Past FLAT_TAIL_ITEMS the optional members' tails are chained: same texts as flat."""
    schema = {**wide_optional(80, "boolean"), "required": ["p70"], "additionalProperties": False}
    flat = compiler.json_schema(schema, whitespace="compact")
    monkeypatch.setattr(objects, "FLAT_TAIL_ITEMS", 0)
    chained = compiler.json_schema({**schema, "title": "chained"}, whitespace="compact")
    rng = random.Random(0)
    for _ in range(300):
        keys = sorted(rng.sample(range(80), rng.randint(0, 12)) + [70] * (rng.random() < 0.8))
        if rng.random() < 0.2 and len(keys) > 1:
            rng.shuffle(keys)
        text = json.dumps({f"p{k}": True for k in keys}, separators=(",", ":"))
        assert flat.accepts(text) == chained.accepts(text), text


# ------------------------------------------------ class 3: whole outputs in linear time


def test_accepts_judges_whole_outputs(compiler):
    c = compiler.json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
            "required": ["a"],
        },
        whitespace="compact",
    )
    assert c.accepts(b'{"a":[1,2,3]}') and c.accepts('{"a":[]}')
    assert not c.accepts(b'{"a":[1,2,3]') and not c.accepts(b'{"a":[1,"x"]}') and not c.accepts(b"")
    u = compiler.json_schema(
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True}, whitespace="compact"
    )
    assert u.check is not None and u.accepts(b'["a","b"]') and not u.accepts(b'["a","a"]')
    g = compiler.grammar('start: "[" (start ("," start)*)? "]"')
    assert g.accepts(b"[[],[[]]]") and not g.accepts(b"[[]")


def test_accepts_is_linear_where_re_backtracks(compiler):
    c = compiler.regex("(a|aa)*c")
    text = b"a" * 100_000 + b"b"  # re.fullmatch needs exponential time here
    t0 = time.monotonic()
    assert not c.accepts(text) and c.accepts(b"a" * 100_000 + b"c")
    assert time.monotonic() - t0 < 1.0
    j = compiler.json_schema({"type": "array", "items": {"type": "string"}}, whitespace="compact")
    big = json.dumps(["x" * 50] * 20_000, separators=(",", ":"))
    t0 = time.monotonic()
    assert j.accepts(big)
    assert time.monotonic() - t0 < 2.0


def _safe_regex(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice(["a", "b", "ab", "[ab]", "[^a]", ".", "\\d", "é", "c?"])
    if r < 0.55:
        return _safe_regex(rng, depth + 1) + _safe_regex(rng, depth + 1)
    if r < 0.7:
        return f"(?:{_safe_regex(rng, depth + 1)}|{_safe_regex(rng, depth + 1)})"
    lo = rng.randint(0, 2)
    return f"({_safe_regex(rng, depth + 1)})" + rng.choice(
        ["*", "+", "?", f"{{{lo},{lo + rng.randint(0, 2)}}}"]
    )


def test_accepts_equals_re_fullmatch_on_random_regexes(compiler):
    rng = random.Random(7)
    alphabet = ["a", "b", "c", "1", "é", "\n"]
    for _ in range(60):
        pattern = _safe_regex(rng)
        c = compiler.regex(pattern)
        m = Matcher(c)
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
            assert c.accepts(text) == bool(re.fullmatch(pattern, text)), (pattern, text)
        assert m.num_accepted() == 0
