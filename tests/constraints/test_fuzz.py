"""Property tests that look for the next hostile input (hypothesis; see test_hardening.py for
the ones found so far).

Random JSON values as schemas (biased toward schema keywords with values of random types),
random strings as regexes, random strings and mutated packaged grammars as Lark grammars.
The only outcomes allowed: the constraint compiles, and a few random walks of its matcher
work (each allowed token is accepted; where the walk may end, ``accepts`` agrees), or it
raises ConstraintError naming a location, not an internal error; either within a few
seconds. A tiny vocabulary and small sizes keep the file under a minute or two on 2 cores.
"""

from __future__ import annotations

import collections
import json
import random
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from deepinfer.constraints import Compiler, ConstraintError, Matcher, Vocabulary  # noqa: E402
from deepinfer.constraints.limits import Limits  # noqa: E402

MAX_SECONDS = 2.0  # the fuzz compiler's time bound
WALL = 3 * MAX_SECONDS + 1.0  # an outcome must come within this (the bound, retries, one walk)
GRAMMARS = Path(__file__).resolve().parents[2] / "grammars"
OUTCOMES: collections.Counter = collections.Counter()  # (kind, outcome) -> count (printed with -s)


def tiny_vocab() -> Vocabulary:
    """Every single byte, EOS, and a few JSON pieces: masks are cheap."""
    pieces: list[bytes | None] = [bytes([b]) for b in range(256)]
    pieces += [None, b'{"', b'":', b'",', b"true", b"null", b"12", b"ab"]
    return Vocabulary(pieces, eos_ids=[256])


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(tiny_vocab(), limits=Limits(max_seconds=MAX_SECONDS))


def walk(compiled, seed: int, walks: int = 3, steps: int = 24) -> None:
    """Random walks over the allowed tokens: each is accepted; where the walk may end, the
    text is a whole output (``accepts``)."""
    rng = random.Random(seed)
    eos = set(compiled.vocab.eos_ids)
    for _ in range(walks):
        m = Matcher(compiled)
        text = b""
        for _ in range(steps):
            allowed = [int(t) for t in m.allowed_tokens() if int(t) not in eos]
            if not allowed or m.is_terminated():
                break
            t = rng.choice(allowed)
            assert m.accept(t), f"allowed token {t} refused"
            text += compiled.vocab.token_bytes[t]
        if m.can_end():
            assert compiled.accepts(text), text


def outcome(kind: str, compile_, seed: int) -> None:
    t0 = time.monotonic()
    try:
        compiled = compile_()
    except ConstraintError as e:
        took = time.monotonic() - t0
        assert e.located, f"{type(e).__name__} names no location: {e}"
        assert "internal error" not in str(e), str(e)
        OUTCOMES[kind, type(e).__name__] += 1
    else:
        walk(compiled, seed)
        took = time.monotonic() - t0
        OUTCOMES[kind, "compiled"] += 1
    assert took < WALL, f"{kind}: {took:.1f} s"


# ------------------------------------------------------------------------ schemas

KEYWORDS = [
    "type", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems", "uniqueItems",
    "contains", "minContains", "maxContains", "enum", "const", "anyOf", "oneOf", "allOf", "not", "if",
    "then", "else", "$ref", "$defs", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "dependentRequired", "dependentSchemas",
    "unevaluatedProperties", "$schema", "$anchor", "title",
]  # fmt: skip
WORDS = [
    "null", "boolean", "object", "array", "string", "number", "integer", "a", "b", "", "^a+$", "(",
    "[a-", "\\d{2}", "date", "email", "uuid", "#", "#/$defs/a", "#/properties/a", "é", "a|b", "(a+)+$",
    "\ud800", "http://json-schema.org/draft-07/schema#",
]  # fmt: skip
NUMBERS = st.one_of(
    st.integers(-2, 70),
    st.sampled_from([0.5, 1e300, -1e300, 10**20, 4097, 65, 1e-320]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.sampled_from(WORDS), st.text(max_size=4))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYWORDS), st.text(max_size=3)), inner, max_size=3),
    ),
    max_leaves=8,
)
SCHEMAS = st.recursive(
    st.one_of(st.booleans(), st.fixed_dictionaries({"type": st.sampled_from(WORDS[:7])})),
    lambda inner: st.dictionaries(
        st.sampled_from(KEYWORDS),
        st.one_of(
            inner,
            st.lists(inner, min_size=1, max_size=3),
            st.dictionaries(st.sampled_from(["a", "b", "c", "^a", "\ud800"]), inner, max_size=3),
            JSON_VALUES,
            st.sampled_from(WORDS),
            NUMBERS,
        ),
        max_size=4,
    ),
    max_leaves=10,
)


def _valid_keywords(inner):
    """A strategy per keyword, of values of the type its metaschema wants (so that the
    lowering runs, not only the checks before it)."""
    names = st.sampled_from(["a", "b", "c", "é", "a b", ""])
    count = st.one_of(st.integers(0, 70), st.sampled_from([100, 1000, 4097, 10**6, 10**12]))
    number = st.one_of(
        st.integers(-100, 100), st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([1e300, -1e-300])
    )
    pattern = st.sampled_from(
        ["^a+$", "a", "^(a|b)*$", "[0-9]{2,4}", "\\d+", "^.{0,3}$", "(a+)+$", "^$", "é|b"]
    )
    schemas = st.lists(inner, min_size=1, max_size=3)
    types = st.sampled_from(WORDS[:7])
    return {
        "type": st.one_of(types, st.lists(types, min_size=1, max_size=3, unique=True)),
        "properties": st.dictionaries(names, inner, max_size=4),
        "patternProperties": st.dictionaries(pattern, inner, max_size=3),
        "additionalProperties": inner, "propertyNames": inner, "items": inner, "contains": inner,
        "not": inner, "if": inner, "then": inner, "else": inner, "unevaluatedProperties": inner,
        "required": st.lists(names, max_size=3, unique=True),
        "minProperties": count, "maxProperties": count, "minItems": count, "maxItems": count,
        "minLength": count, "maxLength": count, "minContains": count, "maxContains": count,
        "uniqueItems": st.booleans(),
        "prefixItems": schemas, "anyOf": schemas, "oneOf": schemas, "allOf": schemas,
        "enum": st.lists(JSON_VALUES, min_size=1, max_size=4), "const": JSON_VALUES,
        "$ref": st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/properties/a", "#/items"]),
        "$defs": st.fixed_dictionaries({"a": inner, "b": inner}),
        "pattern": pattern,
        "format": st.sampled_from(["date", "email", "uuid", "ipv4", "date-time", "uri", "x"]),
        "minimum": number, "maximum": number, "exclusiveMinimum": number, "exclusiveMaximum": number,
        "multipleOf": st.sampled_from([1, 2, 3, 7, 0.5, 0.01, 10, 97, 12345, 1e-300]),
        "dependentRequired": st.dictionaries(names, st.lists(names, max_size=2, unique=True), max_size=2),
        "dependentSchemas": st.dictionaries(names, inner, max_size=2),
    }  # fmt: skip


VALID_SCHEMAS = st.recursive(
    st.one_of(st.booleans(), st.fixed_dictionaries({"type": st.sampled_from(WORDS[:7])})),
    lambda inner: st.lists(
        st.sampled_from(sorted(_valid_keywords(inner))), min_size=1, max_size=5, unique=True
    ).flatmap(lambda keys: st.fixed_dictionaries({k: _valid_keywords(inner)[k] for k in keys})),
    max_leaves=10,
)


@given(schema=VALID_SCHEMAS, ws=st.sampled_from(["compact", "natural", "flexible"]), lenient=st.booleans(),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_random_metaschema_valid_schemas_compile_or_are_refused(compiler, schema, ws, lenient, seed):
    outcome("valid schema", lambda: compiler.json_schema(schema, whitespace=ws, lenient=lenient), seed)


@given(schema=SCHEMAS, as_text=st.booleans(), ws=st.sampled_from(["compact", "natural", "flexible"]),
       lenient=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_random_schemas_compile_or_are_refused(compiler, schema, as_text, ws, lenient, seed):
    spec = schema
    if as_text:
        try:
            spec = json.dumps(schema)
        except (ValueError, TypeError, UnicodeError):
            pass
    outcome("schema", lambda: compiler.json_schema(spec, whitespace=ws, lenient=lenient), seed)


@given(value=JSON_VALUES, seed=st.integers(0, 2**16))
def test_random_json_values_as_schemas(compiler, value, seed):
    outcome("json value", lambda: compiler.json_schema(value), seed)


# ------------------------------------------------------------------------ regexes

REGEX_PIECES = list("ab()|*+?[]{}^$\\.d0123,-:=!<>PkwsSbBx#é ") + [
    "\ud800", "(?:", "(?P<n>", "(?=", "(?<!", "\\1", "{2,3}", "[^", "(?i)", "(?x)", "{99999}", "\\Z",
    "\\A", "\\b", "\\u00e9", "\\p", "*+", "(?>",
]  # fmt: skip


@given(pieces=st.lists(st.sampled_from(REGEX_PIECES), max_size=14), flags=st.sampled_from([0, 2, 8, 16, 256]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_random_regexes_compile_or_are_refused(compiler, pieces, flags, seed):
    outcome("regex", lambda: compiler.regex("".join(pieces), flags=flags), seed)


@given(text=st.text(max_size=16), seed=st.integers(0, 2**16))
def test_random_text_as_regex(compiler, text, seed):
    outcome("regex", lambda: compiler.regex(text), seed)


# ----------------------------------------------------------------------- grammars

PACKAGED = sorted(p.read_text() for p in GRAMMARS.glob("*.lark"))
GRAMMAR_PIECES = [
    "(", ")", "[", "]", "{", "}", '"', "/", "|", "*", "+", "?", "~", ".", ":", "%", "\n", " ", "a", "_",
    "0", '"a"', "/a+/", " x ", "%ignore WS", "start: ", "~ 3..5", "\ud800", "%import common.WS", "->",
    "start", "//", "/(?=a)/", '"b"i', "x: x", "*)",
]  # fmt: skip
MUTATIONS = st.lists(
    st.tuples(
        st.floats(0, 1), st.sampled_from(["insert", "delete", "replace"]), st.sampled_from(GRAMMAR_PIECES)
    ),
    min_size=1,
    max_size=5,
)


def mutate(text: str, mutations) -> str:
    for where, op, piece in mutations:
        i = int(where * len(text))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + len(piece) :]
        else:
            text = text[:i] + piece + text[i + len(piece) :]
    return text


@given(base=st.sampled_from(PACKAGED), mutations=MUTATIONS, seed=st.integers(0, 2**16))
def test_mutated_packaged_grammars_compile_or_are_refused(compiler, base, mutations, seed):
    outcome("grammar", lambda: compiler.grammar(mutate(base, mutations)), seed)


@given(pieces=st.lists(st.sampled_from(GRAMMAR_PIECES), max_size=16), seed=st.integers(0, 2**16))
def test_random_strings_as_grammars(compiler, pieces, seed):
    outcome("grammar", lambda: compiler.grammar("start: " + "".join(pieces)), seed)


@given(text=st.text(max_size=24), seed=st.integers(0, 2**16))
def test_random_text_as_grammar(compiler, text, seed):
    outcome("grammar", lambda: compiler.grammar(text), seed)


def test_report_outcomes():
    """(Runs last in this file: the tally of the tests above, printed with ``-s``.)"""
    for (kind, what), n in sorted(OUTCOMES.items()):
        print(f"fuzz {kind:10s} {what:22s} {n}")
