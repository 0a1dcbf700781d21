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
