"""Memos the front end keeps across compilations, bounded by the IR nodes they hold.

Expressions recur across schemas (a JSON string, number or value, a format, a regex
character class), so the front end keeps what it computed for them. Whatever a memo holds
stays alive, and Python's collector walks every object of it in each full collection: a
memo bounded by its number of entries let a few thousand keys hold tens of thousands of IR
nodes, and a full collection of a long-running process took tens of milliseconds, landing
on whatever step allocated at that moment. A :class:`NodeMemo` is an LRU bounded by the
IR nodes its entries hold (each entry's weight is given by the caller, at most an
expression's ``_size``). Cross-compilation hits come mostly from a few dozen popular
entries, which stay.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class NodeMemo:
    """A bounded LRU: ``get(key)`` (None when absent) and ``put(key, value, nodes)``.
    Thread-safe: compilations may run in several threads."""

    def __init__(self, max_nodes: int) -> None:
        self._d: OrderedDict = OrderedDict()
        self._nodes = 0
        self.max_nodes = max_nodes
        self._lock = threading.Lock()

    def get(self, key):
        hit = self._d.get(key)
        if hit is None:
            return None
        try:
            self._d.move_to_end(key)
        except KeyError:  # (evicted by another thread meanwhile: still a valid answer)
            pass
        return hit[0]

    def put(self, key, value, nodes: int):
        """Keep ``value`` under ``key`` (not if ``nodes`` alone exceed an eighth of the
        bound); returns ``value``."""
        if nodes > self.max_nodes // 8:
            return value
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._nodes -= old[1]
            self._d[key] = (value, nodes)
            self._nodes += nodes
            while self._nodes > self.max_nodes:
                _, (_, gone) = self._d.popitem(last=False)
                self._nodes -= gone
        return value

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._nodes = 0

    def __len__(self) -> int:
        return len(self._d)

    @property
    def nodes(self) -> int:
        """The IR nodes the entries hold, by their weights."""
        return self._nodes
