"""Grammar IR → byte-level automaton.

- :mod:`.nfa`: IR expressions → Thompson NFA → minimal DFA (byte classes, shared DFAs);
- :mod:`.pushdown`: rules → the pushdown automaton (:func:`compile_grammar`,
  :class:`Automaton`, its configurations ``Config``);
- :mod:`.counted`: long repetitions kept as a counter; :mod:`.hoist`: big repeated items
  as rules of their own;
- numba kernels: :mod:`.nfa_kernels` (NFA layout, byte classes), :mod:`.subset` (subset
  construction), :mod:`.minimize` (minimisation), :mod:`.dfa_kernels` (Hopcroft, live
  states, products).
"""

from .nfa import Limits
from .pushdown import Automaton, Config, compile_grammar

__all__ = ["Automaton", "Config", "Limits", "compile_grammar"]
