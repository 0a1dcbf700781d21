"""Big repeated items as rules of their own (a fallback of :func:`~.pushdown.compile_grammar`).

An array of objects, each holding long strings and arrays of its own (``maxItems: 256``),
copies its item's states once per repetition when the item is inlined: past the NFA bound.
Kept a called rule, the item costs its states once and each copy one call edge; counted
repetitions inside it keep their count in the top frame of the stack (see :mod:`.counted`).
"""

from __future__ import annotations

import time

from .. import ir
from ..ir import Alt, Expr, Ref
from ..limits import check_deadline
from . import counted as ct
from .nfa import Limits

HOIST_PREFIX = "\x00item"


def _soon(deadline: float | None) -> float:
    """A second from now, or the deadline if sooner."""
    t = time.monotonic() + 1.0
    return t if deadline is None else min(t, deadline)


_BIG = 1 << 40


def hoist_repeated(
    rules: dict[str, Expr], start: str, limit: int, deadline: float | None = None
) -> list[str]:
    """Rewrite ``rules`` in place: the item of every repetition whose copies would expand
    to more than ``limit`` IR nodes (rules it refers to inlined; an array of objects with
    long strings, ``maxItems: 256``) becomes a rule of its own, to be called: each copy is
    then one call edge instead of a copy of the item's states. Items a counter may take
    (Ref-free and countable, over :data:`~..ir.LONG_REPEAT` copies: see :mod:`.counted`)
    stay. Returns the new rules' names. Past ``deadline`` (a ``time.monotonic()``): stops
    with :class:`~..errors.ConstraintTooComplex`."""
    expanded: dict[str, int] = {}
    visited = [0]
    on_path: set[str] = set()

    def cost(e: Expr, memo: dict[int, int]) -> int:
        """IR nodes of ``e`` with repetitions unrolled and (non-recursive) rules inlined."""
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        t = type(e)
        if t is Ref:
            name = e.name
            if name in on_path or name not in rules:
                n = 1
            elif name in expanded:
                n = expanded[name]
            else:
                on_path.add(name)
                n = expanded[name] = cost(rules[name], {})
                on_path.discard(name)
        elif t is ir.Repeat:
            copies = max(1, e.min if e.max is None else e.max)
            n = min(_BIG, 1 + copies * cost(e.item, memo))
        elif isinstance(e, ir.Items):
            n = min(_BIG, 1 + sum(cost(i, memo) for i in e.items))
        else:
            n = 1
        memo[id(e)] = n
        return n

    hoisted: dict[Expr, str] = {}

    def walk(e: Expr, memo: dict[int, Expr]) -> Expr:
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        visited[0] += 1
        if not visited[0] & 4095:
            check_deadline(deadline, "automaton (repeated items)")
        t = type(e)
        out = e
        if t is ir.Repeat:
            item = walk(e.item, memo)
            copies = max(e.min, e.max or 0)
            if (
                copies > 1
                and type(item) is not Ref
                and copies * cost(item, {}) > limit
                and not (copies > ct.LONG_REPEAT and ct.item_dfa(item, Limits(), _soon(deadline)))
            ):
                name = hoisted.get(item)
                if name is None:
                    name = hoisted[item] = f"{HOIST_PREFIX}{len(hoisted)}"
                out = ir.Repeat(Ref(name), e.min, e.max)
            elif item is not e.item:
                out = ir.Repeat(item, e.min, e.max)
        elif t is ir.Seq or t is Alt:
            items = tuple([walk(i, memo) for i in e.items])
            if any(a is not b for a, b in zip(items, e.items)):
                out = t(items)
        memo[id(e)] = out
        return out

    try:
        for name in list(rules):
            rules[name] = walk(rules[name], {})
    finally:
        cost = walk = None  # (nested functions that call themselves are reference cycles: freed here)
    for item, name in hoisted.items():
        rules[name] = item
    return list(hoisted.values())


__all__ = ["HOIST_PREFIX", "hoist_repeated"]
