"""What compiling leaves to Python's cyclic collector: nothing. Whatever a compilation leaves
in a reference cycle lives on until a pass of the collector, which then lands on a later
mask or step: an NFA held by a cycle kept its edge lists (tens of thousands of ints) alive,
and the young collection that freed it took milliseconds inside a mask row."""

from __future__ import annotations

import gc

import pytest

from deepinfer.constraints import Compiler

from .vocabs import small_vocab

STR = {"type": "string"}


def _schemas(i: int) -> dict:
    """Schemas whose compilation takes each path that used to leave a cycle (``i`` makes
    each distinct, past the compiler's cache)."""
    return {
        # optional members after each possible first one: shared tails
        # (FragmentBuilder._alt_suffixes)
        "optional members": {
            "type": "object",
            "properties": {f"{k}{i}": {"type": ["string", "integer"]} for k in "abcdefgh"},
            "additionalProperties": False,
        },
        # a member count that bites (ObjectMixin.members_body)
        "member count": {
            "type": "object",
            "properties": {f"{k}{i}": STR for k in "abcd"},
            "minProperties": 2,
            "additionalProperties": False,
        },
        # array segments (ArrayMixin.joined) and two contains (contains_two)
        "contains": {
            "type": "array",
            "items": {"type": "integer"},
            "allOf": [{"contains": {"const": i}}, {"contains": {"const": i + 1}}],
            "maxItems": 4,
        },
        # a long repetition counted (counted.extract_counted)
        "counted": {"type": "string", "pattern": f"^[a-z]{{0,{200 + i}}}$"},
        # enum values checked against anyOf branches (jsonschema errors with a context)
        "enum checked": {"anyOf": [{"type": "integer"}, {"type": "boolean"}], "enum": [i, True, "x", None]},
    }


def _cyclic_garbage(fn) -> list[str]:
    """The types of the objects left in reference cycles by ``fn()`` (collector off meanwhile)."""
    gc.collect()
    gc.disable()
    try:
        fn()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
        gc.enable()


@pytest.mark.parametrize("kind", list(_schemas(0)))
def test_compiling_leaves_nothing_in_reference_cycles(kind):
    comp = Compiler(small_vocab())
    comp.json_schema(_schemas(0)[kind], whitespace="compact")  # (first use: imports, shared rows)
    c = []
    left = _cyclic_garbage(lambda: c.append(comp.json_schema(_schemas(1)[kind], whitespace="compact")))
    assert c[0].automaton.n_states > 0
    assert not left, sorted(set(left))


def test_hoisting_leaves_nothing_in_reference_cycles():
    from deepinfer.constraints.automaton.hoist import hoist_repeated
    from deepinfer.constraints.limits import Limits

    from .test_json_schema_bounds import ARRAY, _grammar

    rules = dict(_grammar(ARRAY).rules)
    hoisted = []
    left = _cyclic_garbage(lambda: hoisted.extend(hoist_repeated(rules, "start", Limits().max_inline_size)))
    assert hoisted
    assert not left, sorted(set(left))


def test_per_state_tables_give_the_collector_nothing_to_walk():
    """An automaton's tables of a value per state (flags, counters' regions, calls) and a
    compiled constraint's are bytes, int arrays or a dict of the few states with calls: a
    tuple of one item per state would be walked item by item in the first young collection
    after the compile, which lands inside a mask (up to a millisecond at 30k states). The
    rows a matcher steps through are read from one view of the table, so stepping adds no
    object a state for every later full collection to visit."""
    from deepinfer.constraints import Matcher

    vocab = small_vocab()
    comp = Compiler(vocab)
    node = {
        "anyOf": [
            {"type": "integer"},
            {"type": "array", "items": {"$ref": "#/$defs/n"}},
            {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}, "s": {"type": "string"}}},
        ]
    }
    schema = {  # a pushdown automaton with a counted string in its bottom frame
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": 5000}, "kids": {"$ref": "#/$defs/n"}},
        "$defs": {"n": node},
    }
    gc.collect()
    gc.disable()  # (a collection meanwhile would untrack tuples of ints, hiding them)
    try:
        c = comp.json_schema(schema, whitespace="compact")
        a = c.automaton
        sizes = {name: len(v) for name, v in vars(a).items() if isinstance(v, dict)}
        m = Matcher(c)
        for b in b'{"s":"ab","kids":[{"s":"x':  # masks of frames in and near a region (ids 2..257: bytes)
            t = 2 + b
            assert vocab.token_bytes[t] == bytes([b])
            m.mask_row()
            assert m.accept(t)
        assert a.counters is not None and not a.is_regular
        n = a.n_states
        assert 0 < len(a.calls) == int(a.has_calls.sum()) < n
        walked = {
            f"{type(owner).__name__}.{name}": len(v)
            for owner in (a, c)
            for name, v in vars(owner).items()
            if gc.is_tracked(v) and isinstance(v, (tuple, list, dict)) and len(v) == n  # (one item a state)
        }
        assert not walked, walked
        # the rows stepped through: views of the whole table (targets, counter actions),
        # not an object per state met
        assert isinstance(a.targets, memoryview) and isinstance(a.acts, memoryview)
        assert a.targets.tolist() == a.table.ravel().tolist()
        assert a.acts.tolist() == a.counters.act.ravel().tolist()
        grown = {
            name: (sizes.get(name, 0), len(v))
            for name, v in vars(a).items()
            if isinstance(v, dict) and len(v) != sizes.get(name, 0)
        }
        assert not grown, grown
    finally:
        gc.enable()
