"""Test helper: a grammar compiled with its uniqueItems check, as one automaton-like object.

``compile_checked(grammar)`` is ``compile_grammar`` for a grammar without uniqueItems
markers; with markers it is the automaton without them (:func:`compile_unique`) whose
``accepts`` / ``is_prefix`` apply the uniqueness check (the compiler's path: see
``deepinfer.constraints.unique_items``).
"""

from __future__ import annotations

from deepinfer.constraints.tag_check import accepts, is_prefix
from deepinfer.constraints.unique_items import compile_unique


class Checked:
    """An automaton with its uniqueItems tags: every attribute is the automaton's, but
    ``accepts`` and ``is_prefix`` check uniqueItems too."""

    def __init__(self, automaton, tags) -> None:
        self.automaton = automaton
        self.tags = tags

    def accepts(self, data: bytes) -> bool:
        return accepts(self.tags, data)

    def is_prefix(self, data: bytes) -> bool:
        return is_prefix(self.tags, data)

    def __getattr__(self, name):
        return getattr(self.automaton, name)


def compile_checked(grammar, limits=None):
    automaton, tags = compile_unique(grammar, limits)
    return automaton if tags is None else Checked(automaton, tags)
