"""Per-state tables that Python's collector does not walk, item by item or object by object.

A tuple is tracked by the cyclic collector until a collection finds it holds only atomic
items, so each tuple a table is made of is walked, item by item, by the first young
collection after it is made: tens of thousands of items for a large automaton, a pause of
up to a millisecond inside whatever runs then, most often a mask. ``bytes`` hold no
references and are never tracked. An ``array`` or a ``memoryview`` is one tracked object
whose only referents are its type or its buffer, never its items; a full collection still
visits each such object, so a table is one of them, not one per state (:func:`flat`).
"""

from __future__ import annotations

from array import array

import numpy as np


def flags(a: np.ndarray) -> bytes:
    """A per-state table of flags as ``bytes`` (an item is 1 or 0)."""
    return np.asarray(a, dtype=bool).tobytes()  # (a numpy bool is the byte 0 or 1)


def ints(a: np.ndarray) -> array:
    """A per-state table of ints (or one state's row of a table) as an ``array`` of int64."""
    return array("q", np.asarray(a, dtype=np.int64).tobytes())


def flat(a: np.ndarray) -> memoryview:
    """A 2-D table's items row after row, read as Python ints: item ``[s, c]`` is
    ``view[s * a.shape[1] + c]``. One object over the table's own buffer (no copy when it
    is C-contiguous), where a row per state made one object each: a schema's automaton
    meets thousands of states, and a process's cached constraints tens of thousands, every
    one of them visited by each full collection, which lands on whatever mask runs then."""
    if a.size == 0:
        return memoryview(b"").cast(a.dtype.char)
    return memoryview(np.ascontiguousarray(a)).cast("B").cast(a.dtype.char)


__all__ = ["flags", "flat", "ints"]
