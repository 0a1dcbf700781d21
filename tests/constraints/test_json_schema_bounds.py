"""Schemas near the size bounds that compile exactly: counted repetitions inside called rules
(an array item holding a long string), big repeated items kept as called rules, and
alternatives with common tails (the optional members of an object) built once."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from deepinfer.constraints import Compiler, Matcher, ir
from deepinfer.constraints.automaton import compile_grammar, counted, nfa
from deepinfer.constraints.automaton.hoist import HOIST_PREFIX, hoist_repeated
from deepinfer.constraints.ir import Grammar, alt, byte_range, lit, rep, seq
from deepinfer.constraints.json_schema import formats as jf
from deepinfer.constraints.json_schema import schema_to_grammar

from .test_matcher_core import reference_allowed
from .vocabs import small_vocab

QUOTE = jf.QUOTE
LOWER = byte_range(0x61, 0x7A)


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(small_vocab())


def _grammar(schema: dict) -> Grammar:
    g = schema_to_grammar(schema)
    return g[0] if isinstance(g, tuple) else g


# ------------------------------------------------ a count in a called rule's top frame

# the string lies in ``v``, a recursive (so called) rule: its count lives in the top frame
CALLED = Grammar(
    {
        "start": seq(lit("["), ir.Ref("v"), ir.star(seq(lit(","), ir.Ref("v"))), lit("]")),
        "v": alt(lit("1"), seq(lit('{"s":"'), rep(jf.CHAR, 66, 70), lit('","k":'), ir.Ref("v"), lit("}"))),
    }
)


def test_called_rule_region_is_counted_and_exact(monkeypatch):
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    a = compile_grammar(CALLED)
    assert a.counters is not None and not a.is_regular
    for n, ok in [(65, False), (66, True), (70, True), (71, False)]:
        inner = b'{"s":"' + b"x" * n + b'","k":1}'
        assert a.accepts(b"[1," + inner + b"]") == ok, n
        assert a.accepts(b'[{"s":"' + b"y" * 68 + b'","k":' + inner + b"}]") == ok, (
            n
        )  # nested: one count each


def test_called_rule_region_masks_equal_unrolled(monkeypatch):
    """Random walks (long tokens preferred): the counted automaton allows the same tokens as
    the unrolled one at every step, and its row equals the token-by-token definition."""
    v = small_vocab()
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    cc = Compiler(v).from_ir(CALLED)
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 10**9)
    uc = Compiler(v).from_ir(CALLED)
    assert cc.automaton.counters is not None and uc.automaton.counters is None
    rng = random.Random(7)
    eos = set(v.eos_ids)
    lengths = [len(b or b"") for b in v.token_bytes]
    for walk in range(5):
        mc, mu = Matcher(cc), Matcher(uc)
        for step in range(160):
            got, want = mc.allowed_tokens(), mu.allowed_tokens()
            assert np.array_equal(got, want), (walk, step)
            if step % 11 == 0:
                assert np.array_equal(got, reference_allowed(cc, mc.state))
            choices = [int(t) for t in got if t not in eos]
            if not choices:
                break
            if rng.random() < 0.7:
                best = max(lengths[t] for t in choices)
                choices = [t for t in choices if lengths[t] >= best - 1]
            t = rng.choice(choices)
            assert mc.accept(t) and mu.accept(t)
            if rng.random() < 0.1:
                k = rng.randint(1, mc.num_accepted())
                mc.rollback(k)
                mu.rollback(k)


def test_region_that_may_end_a_called_rule_is_unrolled(monkeypatch):
    """A count cannot be returned with: a region at the end of a called rule is copied."""
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    g = Grammar(
        {
            "start": seq(lit("<"), ir.Ref("v"), lit(">")),
            "v": alt(lit("1"), seq(lit("("), ir.Ref("v"), lit(")")), seq(lit("="), rep(LOWER, 66, 70))),
        }
    )
    a = compile_grammar(g)
    assert a.counters is None
    assert a.accepts(b"<((=" + b"a" * 70 + b"))>") and not a.accepts(b"<(=" + b"a" * 71 + b")>")
    assert not a.accepts(b"<=" + b"a" * 65 + b">")


# ------------------------------------------------------------ repeated items as rules

# the item refers to a shared rule (not countable) and holds a format automaton: 300 copies
# would exceed the bounds; one copy called 300 times does not
ARRAY = {
    "type": "object",
    "required": ["list"],
    "additionalProperties": False,
    "$defs": {"s": {"type": "string", "minLength": 1, "maxLength": 200}},
    "properties": {
        "name": {"$ref": "#/$defs/s"},
        "list": {
            "type": "array",
            "maxItems": 300,
            "items": {
                "type": "object",
                "required": ["d", "k"],
                "additionalProperties": False,
                "properties": {
                    "d": {"type": "string", "maxLength": 5000},
                    "k": {"$ref": "#/$defs/s"},
                    "ip": {"type": "string", "format": "ipv6"},
                },
            },
        },
    },
}


def _array(n: int, d: int = 1, k: int = 1) -> bytes:
    items = [{"d": "x" * d, "k": "a" * k, "ip": "fe80::1"}] * n
    return json.dumps({"list": items}, separators=(",", ":")).encode()


def test_big_repeated_item_becomes_a_called_rule(compiler):
    rules = dict(_grammar(ARRAY).rules)
    assert hoist_repeated(rules, "start", nfa.Limits().max_inline_size)
    t = time.monotonic()
    c = compiler.json_schema(ARRAY)
    assert time.monotonic() - t < 2.0
    a = c.automaton
    assert not a.is_regular and a.counters is not None  # the item is called, its long string counted
    assert any(n.startswith(HOIST_PREFIX) for n in a.rule_names)
    assert a.accepts(_array(0)) and a.accepts(_array(300)) and not a.accepts(_array(301))
    assert a.accepts(_array(2, d=5000)) and not a.accepts(_array(2, d=5001))
    assert a.accepts(_array(1, k=200)) and not a.accepts(_array(1, k=201)) and not a.accepts(_array(1, k=0))
    assert not a.accepts(_array(1).replace(b"fe80::1", b"fe80:::1"))
    # masks at the string's bound inside the called item
    m = Matcher(c)
    assert m.accept_bytes(b'{"list":[{"d":"x","k":"a"},{"d":"' + b"y" * 4997)
    for n in range(4997, 5001):
        assert np.array_equal(m.allowed_tokens(), reference_allowed(c, m.state)), n
        assert m.copy().accept_bytes(b"z") == (n < 5000)
        if n < 5000:
            assert m.accept_bytes(b"z")
    assert m.accept_bytes(b'","k":"a"}')
    assert np.array_equal(m.allowed_tokens(), reference_allowed(c, m.state))


def test_small_repeated_item_stays_inlined(compiler):
    """Hoisting is a fallback: an array that fits inlined stays one DFA."""
    small = {"type": "array", "maxItems": 300, "items": {"type": "integer", "minimum": 0, "maximum": 9}}
    rules = dict(_grammar(small).rules)
    assert not hoist_repeated(rules, "start", nfa.Limits().max_inline_size)  # a counted item
    assert compiler.json_schema(small).automaton.is_regular


# ------------------------------------------------------- alternatives with common tails


def _members(n: int) -> dict:
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 80 + i % 3} for i in range(n)},
    }


def test_many_optional_members_stay_small(compiler):
    schema = _members(90)
    t = time.monotonic()
    a = compiler.json_schema(schema).automaton
    assert time.monotonic() - t < 2.0
    enc = lambda d: json.dumps(d, separators=(",", ":")).encode()  # noqa: E731
    assert a.accepts(b"{}") and a.accepts(enc({"p89": "x"})) and a.accepts(enc({"p0": "", "p89": "y"}))
    assert a.accepts(enc({f"p{i}": "z" * 80 for i in range(0, 90, 7)}))
    assert not a.accepts(enc({"p3": "x" * 81}))  # p3: maxLength 80
    assert not a.accepts(b'{"p5":"a","p2":"b"}')  # declared members in schema order
    assert not a.accepts(b'{"p1":"a",,"p2":"b"}') and not a.accepts(b'{,"p1":"a"}')


def _random_alt(rng: random.Random) -> ir.Expr:
    """Branches that share tails of random sub-expressions (refs to a rule among them)."""
    atoms = [
        lit("a"),
        lit("bc"),
        ir.opt(lit("x")),
        ir.star(lit("y")),
        alt(lit("a"), lit("ab")),
        ir.Ref("r"),
        ir.plus(byte_range(0x30, 0x39)),
    ]
    tail = [rng.choice(atoms) for _ in range(rng.randint(2, 6))]
    branches = []
    for _ in range(rng.randint(4, 9)):
        head = [rng.choice(atoms) for _ in range(rng.randint(0, 2))]
        branches.append(seq(*head, *tail[rng.randint(0, len(tail) - 2) :]))
    if rng.random() < 0.5:
        branches.append(lit("q"))
    return alt(*branches)


def _strings(rng: random.Random) -> list[bytes]:
    return [bytes(rng.choice(b"abcxyq0129") for _ in range(rng.randint(0, 9))) for _ in range(300)]


@pytest.mark.parametrize("seed", range(40))
def test_shared_tails_build_the_same_automaton(seed, monkeypatch):
    """The tail-sharing build (a fast path) against the plain one (kept as the reference):
    the same minimal DFA, and the same answers on random inputs."""
    rng = random.Random(seed)
    e = _random_alt(rng)
    g = Grammar({"start": seq(lit("<"), e, lit(">")), "r": alt(lit("r"), lit("rr"))})
    monkeypatch.setattr(nfa, "SUFFIX_MIN_BRANCHES", 2)
    nfa.SHARED_DFAS.clear()
    fast = compile_grammar(g)
    monkeypatch.setattr(nfa, "SUFFIX_MIN_BRANCHES", 10**9)
    nfa.SHARED_DFAS.clear()
    ref = compile_grammar(g)
    assert np.array_equal(fast.table, ref.table) and np.array_equal(fast.accepting, ref.accepting)
    for s in _strings(rng):
        assert fast.accepts(b"<" + s + b">") == ref.accepts(b"<" + s + b">"), s


# ---------------------------------------------------- start anchors inside a group

ANCHOR_PATTERNS = [r"^$|(^(?:\S+\s+){0,2}\S+$)", r"(^a|^b)c", r"\Aab", r"x|(^ab)", r"(?:(?:^a))b$", r"(^a)?b"]
ANCHOR_TEXTS = [
    "",
    "a",
    "a b c",
    "a b c d",
    " a",
    "a ",
    "ac",
    "bc",
    "xac",
    "ab",
    "xab",
    "abx",
    "zx",
    "b",
    "xb",
]


@pytest.mark.parametrize("pattern", ANCHOR_PATTERNS)
def test_start_anchor_inside_a_group_anchors_the_search(pattern):
    """``pattern`` is a search (ECMA), so a branch with no leading ^ may start anywhere, but
    one whose every alternative opens with ^ (or \\A) inside groups starts at the start."""
    import re

    a = compile_grammar(_grammar({"type": "string", "pattern": pattern}))
    for s in ANCHOR_TEXTS:
        assert a.accepts(json.dumps(s).encode()) == (re.search(pattern, s) is not None), (pattern, s)


def test_start_anchor_on_some_alternatives_is_refused():
    from deepinfer.constraints.errors import ConstraintError

    with pytest.raises(ConstraintError, match="anchor \\^ starts some alternatives"):
        _grammar({"type": "string", "pattern": "(^a|b)c"})


# a word-limited text in arrays (many of them): the items are kept as called rules
WORDS = {"type": "string", "maxLength": 300, "pattern": r"^(?:\S+\s+){0,29}\S+$"}
LISTS = {
    "type": "object",
    "additionalProperties": False,
    "required": [f"l{i}" for i in range(4)],
    "properties": {
        **{f"l{i}": {"type": "array", "minItems": 1, "maxItems": 20, "items": WORDS} for i in range(4)},
        "t": {"type": "string", "pattern": r"^$|(^(?:\S+\s+){0,99}\S+$)"},
    },
}


def test_word_limited_lists_compile_exactly(compiler):
    t = time.monotonic()
    a = compiler.json_schema(LISTS).automaton
    assert time.monotonic() - t < 2.0

    def doc(words: int, items: int = 1, t_words: int = 0) -> bytes:
        d = {f"l{i}": [" ".join(["w"] * words)] * items for i in range(4)}
        if t_words:
            d["t"] = " ".join(["v"] * t_words)
        return json.dumps(d, separators=(",", ":")).encode()

    assert a.accepts(doc(1)) and a.accepts(doc(30)) and not a.accepts(doc(31))
    assert a.accepts(doc(2, 20)) and not a.accepts(doc(2, 21)) and not a.accepts(doc(2, 0))
    assert a.accepts(doc(1, t_words=100)) and not a.accepts(doc(1, t_words=101))
    assert not a.accepts(doc(1).replace(b'["w"]', b'[" w"]', 1))  # no leading space
    long_word = json.dumps({f"l{i}": ["x" * 300] for i in range(4)}, separators=(",", ":")).encode()
    assert a.accepts(long_word) and not a.accepts(long_word.replace(b"x" * 300, b"x" * 301, 1))


# ----------------------------------------------------------------- multipleOf


@pytest.mark.parametrize("m", [3, 7, 9, 11, 13])
def test_remainder_dfa_equals_the_state_elimination_reference(m):
    """The remainder automaton as an IR leaf (the fast path) against the regular expression
    of the same automaton by state elimination (kept as the reference; 9 states at most
    before): one minimal DFA, and random digit strings read alike (value mod m)."""
    from deepinfer.constraints.json_schema.numbers import _dfa_regex, remainder_dfa

    leaf = compile_grammar(Grammar({"start": remainder_dfa(m)}))
    rng = random.Random(m)
    if m <= 9:
        ref = compile_grammar(Grammar({"start": _dfa_regex(m, lambda r, d: (10 * r + d) % m)}))
        assert np.array_equal(leaf.table, ref.table) and np.array_equal(leaf.accepting, ref.accepting)
    for _ in range(300):
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 25)))
        assert leaf.accepts(s.encode()) == (s == "" or int(s) % m == 0), s


@pytest.mark.parametrize("m, extra", [(11, {}), (11, {"minimum": 100}), (97, {"maximum": -3}), (9973, {})])
def test_integer_multiple_of_a_large_divisor_is_exact(compiler, m, extra):
    t = time.monotonic()
    a = compiler.json_schema({"type": "integer", "multipleOf": m, **extra}).automaton
    assert time.monotonic() - t < 2.0
    lo, hi = extra.get("minimum", -(10**12)), extra.get("maximum", 10**12)
    rng = random.Random(m)
    vals = [k * m + d for k in (-13, -1, 0, 1, 9, 10, 12345) for d in (-1, 0, 1)] + [
        rng.randint(-(10**9), 10**9) for _ in range(200)
    ]
    for v in vals:
        assert a.accepts(str(v).encode()) == (v % m == 0 and lo <= v <= hi), v


NOT_MULT = {"type": "number", "minimum": -50, "not": {"multipleOf": 11}}


def test_number_not_multiple_of_an_integer(compiler):
    """Over all numbers: the integers that are not multiples, and every non-integral number."""
    a = compiler.json_schema(NOT_MULT).automaton
    for t, ok in [
        ("12", True),
        ("0", False),
        ("-44", False),
        ("-45", True),
        ("-55", False),
        ("0.5", True),
        ("22.5", True),
        ("-49.5", True),
        ("-50.5", False),
        ("110", False),
        ("111", True),
        ("22.0", False),
    ]:
        assert a.accepts(t.encode()) == ok, t


def test_contains_blocks_merged_at_one_pointer_keep_their_own_rules(compiler):
    """Several contains merged with items that $ref: each block (items with some of the
    contains) is its own rule, though all are compiled at the same pointer."""
    defs = {"a": {"type": "array", "items": {"type": "integer"}}, "b": {"type": "array", "maxItems": 1}}
    s = {
        "type": "array",
        "definitions": defs,
        "allOf": [
            {"items": {"$ref": "#/definitions/a"}},
            {"contains": {"$ref": "#/definitions/b"}},
            {"contains": {"not": {"$ref": "#/definitions/b"}}},
        ],
    }
    a = compiler.json_schema(s).automaton
    for inst, ok in [
        ([[]], False),
        ([[1]], False),
        ([[], [1, 2]], True),
        ([[1, 2], [3]], True),
        ([[1, 2]], False),
    ]:
        assert a.accepts(json.dumps(inst, separators=(",", ":")).encode()) == ok, inst
