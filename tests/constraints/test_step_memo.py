"""A compiled constraint's step memo: a dict of tokens per configuration, equal pushdown
configurations kept as one object (shared by the memo, the matchers' histories and the row
cache's keys), bounded in steps, and the steps exactly the automaton's."""

from __future__ import annotations

import gc
import random

import pytest

from deepinfer.constraints import Compiler, Matcher, compiled
from deepinfer.constraints.automaton.pushdown import Config

from .vocabs import small_vocab

# recursive (a pushdown automaton): nested lists of small objects
SCHEMA = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["a"],
        }
    },
    "$ref": "#/$defs/node",
}


def _value(rnd: random.Random, depth: int = 0) -> str:
    kids = [_value(rnd, depth + 1) for _ in range(rnd.randrange(3))] if depth < 3 else []
    out = '{"a":' + str(rnd.randrange(-99, 999))
    return out + (',"kids":[' + ",".join(kids) + "]" if kids or rnd.random() < 0.5 else "") + "}"


def _tokens(vocab, text: str, rnd: random.Random) -> list[int]:
    """Some tokenisation of ``text`` (longest pieces first, at random)."""
    by = {}
    for i, b in enumerate(vocab.token_bytes):
        if b:
            by.setdefault(b, i)
    data, out, i = text.encode(), [], 0
    while i < len(data):
        ends = [j for j in range(min(len(data), i + 6), i, -1) if data[i:j] in by]
        j = ends[0] if rnd.random() < 0.7 else rnd.choice(ends)
        out.append(by[data[i:j]])
        i = j
    return out


@pytest.fixture(scope="module")
def constraint():
    return Compiler(small_vocab()).json_schema(SCHEMA, whitespace="compact")


def _force(c, toks: list[int]) -> Matcher:
    m = Matcher(c)
    for t in toks:
        m.mask_row()
        assert m.accept(t)
    return m


def test_equal_configurations_are_one_object(constraint):
    c = constraint
    assert not c.automaton.is_regular
    rnd = random.Random(3)
    vocab = small_vocab()
    seqs = [_tokens(vocab, _value(rnd), rnd) for _ in range(12)]
    ms = [_force(c, toks) for toks in seqs + seqs]  # (every sequence twice: the memo answers)
    kept = list(c.step_memo)
    for row in c.step_memo.values():
        kept += [v for v in row.values() if v is not None]
    kept += [cfg for m in ms for cfg in m._hist[1:]]  # (a history's steps come from the memo)
    assert all(type(x) is Config for x in kept)
    assert len({id(x) for x in kept}) == len(set(kept))  # one object per value
    # no (configuration, token) tuple per step: the memo holds a dict per configuration
    assert sum(len(r) for r in c.step_memo.values()) == c._step_entries > len(c.step_memo)
    assert all(type(k[1]) is bool for k in c.step_memo)  # (keys are configurations, not steps)
    # what a full collection walks for it: nothing, once it has passed (configurations are
    # tuples of ints, and the collector stops tracking them and the dicts that hold only them)
    for _ in range(3):  # (a pass untracks a tuple once what it holds is: three levels)
        gc.collect()
    assert not any(gc.is_tracked(x) for x in kept)
    assert not any(gc.is_tracked(r) for r in c.step_memo.values())


def test_a_small_bound_keeps_steps_exact(monkeypatch):
    """With the memo starting afresh every few steps, every accept and every mask is the one
    a constraint with a roomy memo gives."""
    vocab = small_vocab()
    roomy = Compiler(vocab).json_schema(SCHEMA, whitespace="compact")
    monkeypatch.setattr(compiled, "STEP_MEMO_SIZE", 7)
    tight = Compiler(vocab).json_schema(SCHEMA, whitespace="compact")
    rnd = random.Random(5)
    for _ in range(10):
        toks = _tokens(vocab, _value(rnd), rnd)
        a, b = Matcher(roomy), Matcher(tight)
        for i, t in enumerate(toks):
            assert (a.mask_row() == b.mask_row()).all()
            bad = rnd.randrange(vocab.vocab_size)  # a random token: refused or taken by both alike
            assert a.copy().accept(bad) == b.copy().accept(bad)
            assert a.accept(t) and b.accept(t), i
            assert tight._step_entries <= 7
        assert (a.mask_row() == b.mask_row()).all() and a.can_end() and b.can_end()
