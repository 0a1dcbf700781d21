"""What compiling leaves to Python's cyclic collector. Whatever a compilation leaves in a
reference cycle lives on until a pass of the collector, which then lands on a later mask or
step: an NFA held by a cycle kept its edge lists (tens of thousands of ints) alive, and the
young collection that freed it took milliseconds inside a mask row."""

from __future__ import annotations

import gc

from deepinfer.constraints import Compiler

from .vocabs import small_vocab

# optional members after each possible first one: an alternation built by shared tails
# (FragmentBuilder._alt_suffixes)
SCHEMA = {
    "type": "object",
    "properties": {k: {"type": ["string", "integer"]} for k in "abcdefgh"},
    "additionalProperties": False,
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


def test_compiling_leaves_no_cycle_holding_the_automaton_build():
    comp = Compiler(small_vocab())
    comp.json_schema({"type": "object"})  # (the front end's first use: its imports)
    c = []
    kinds = _cyclic_garbage(lambda: c.append(comp.json_schema(SCHEMA, whitespace="compact")))
    assert c[0].automaton.n_states > 0
    assert not {"NFA", "FragmentBuilder", "RawDFA"} & set(kinds), sorted(set(kinds))
