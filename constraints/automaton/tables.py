"""Per-state tables that Python's collector does not walk.

A tuple is tracked by the cyclic collector until a collection finds it holds only atomic
items, so each tuple a table is made of is walked, item by item, by the first young
collection after it is made: tens of thousands of items for a large automaton, a pause of
up to a millisecond inside whatever runs then, most often a mask. ``bytes`` and ``array``
hold no references, and the collector never tracks them.
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


__all__ = ["flags", "ints"]
