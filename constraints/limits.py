"""The compiler's bounds (:class:`Limits`): what keeps an untrusted constraint from eating
the machine, with the helpers that apply them (the compile deadline, recursion headroom).
Imports only :mod:`.errors` (the schema loader reads it without loading the automaton);
:mod:`.automaton.nfa` re-exports :class:`Limits`."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import ConstraintTooComplex

RECURSION_HEADROOM = 2_500  # Python frames allowed above the caller's, for recursion of bounded depth


@dataclass
class Limits:
    """Bounds that keep untrusted constraints from eating the machine.

    A constraint past one raises :class:`~.errors.ConstraintTooComplex` naming the bound
    (its ``bound`` attribute is the field's name) and where. ``max_seconds`` covers the
    whole compilation in :class:`~.compiler.Compiler`: front end (schema checks and
    lowering, grammar and regex reading) and automaton. The size bounds are checked before
    the work they bound, so a constraint past one is refused at once.
    """

    max_nfa_states: int = 400_000
    max_dfa_states: int = 60_000
    max_seconds: float = 10.0
    max_inline_size: int = 4_000  # IR nodes of a shared rule above which it is not inlined
    # front ends (see docs/constraint-compiler.md, "Limits and errors")
    max_schema_chars: int = 2_000_000  # characters of a JSON Schema's JSON text
    max_schema_nodes: int = 100_000  # JSON values (objects, arrays, scalars) in a schema
    max_schema_nesting: int = 128  # nested JSON arrays / objects in a schema
    max_properties: int = 1_000  # entries of one "properties" object
    max_regex_chars: int = 20_000  # characters of a regex
    max_regex_nesting: int = 100  # nested groups in a regex
    max_grammar_chars: int = 200_000  # characters of a Lark grammar
    max_grammar_nesting: int = 64  # nested ( ) and [ ] in a Lark grammar
    max_ir_nodes: int = 1_000_000  # distinct grammar IR nodes a front end produces


def past_deadline(deadline: float | None) -> bool:
    """Has the compile deadline (a ``time.monotonic()``; None: none) passed?"""
    return deadline is not None and time.monotonic() > deadline


def out_of_time(stage: str, limits: Limits | None = None, **where) -> ConstraintTooComplex:
    """The refusal of a constraint whose compilation ran past its deadline in ``stage``."""
    seconds = (limits or Limits()).max_seconds
    return ConstraintTooComplex(
        f"constraint took too long to compile: past the compile time bound of {seconds:g} s "
        f"(Limits.max_seconds) in the {stage}",
        bound="max_seconds",
        **where,
    )


def check_deadline(deadline: float | None, stage: str, limits: Limits | None = None, **where) -> None:
    """Raise :func:`out_of_time` once the deadline has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise out_of_time(stage, limits, **where)


@contextmanager
def headroom(frames: int = RECURSION_HEADROOM):
    """Allow ``frames`` more Python frames than the current depth (pure-Python recursion of
    bounded depth: jsonschema, the lowering); the limit is restored after."""
    old = sys.getrecursionlimit()
    depth = _depth()
    want = depth + frames
    if want > old:
        sys.setrecursionlimit(want)
    try:
        yield
    finally:
        if want > old and sys.getrecursionlimit() == want:
            sys.setrecursionlimit(old)


def _depth() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        n += 1
        f = f.f_back
    return n
