"""Counted repetitions: ``item{lo,hi}`` with a counter instead of ``hi`` copies.

A repetition whose unrolled automaton would be large (``maxLength: 65535``) and whose item
is *countable* — Ref-free, non-empty and prefix-free (no item is a proper prefix of
another, as for a JSON string character), so its minimal DFA has one accepting state with
no edges out and a start state with no edges in — compiles to one copy of the item that
loops back to its start, the *loop state*, plus a counter in the configuration:

1. :func:`extract_counted` makes each such repetition a rule of its own (a called rule);
   :func:`loop_dfa` is that rule's DFA: the item's, its accepting state merged into the
   start (so every return to the start completes exactly one item);
2. :func:`inline_regions` takes the finished automaton's call edges ``s --rule--> t`` and
   gives each a private copy of the rule's states (a *region*): transitions into ``s``
   enter the region's loop state instead (count := 0); the loop state takes over ``t``'s
   transitions (exits: allowed once count >= lo) and its accepting flag (likewise);
   starting an item needs count < hi; a transition into the loop state counts one item.

The automaton stays regular: a configuration is the int ``state + n_states * count``
(``count`` is 0 outside regions, so other configurations are plain states).
:class:`Counters` says what each transition does to the counter. A token of ``W`` bytes
completes at most ``W`` items, so the allowed tokens depend on the count only through
``min(hi - count, W + 1)`` and ``min(max(lo - count, 0), W + 1)``: the compiled constraint
memoises rows under those (see :meth:`~.compiled.CompiledConstraint.mask_row`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .errors import ConstraintTooComplex
from .ir import LONG_REPEAT, And, Expr, Ref, Repeat, _Items
from .nfa import NFA, Alphabet, FragmentBuilder, Limits, RawDFA, _with_calls, minimal_dfa

# transition actions (bits of Counters.act)
START = 1  # leaves the loop state into an item: needs count < hi
TICK = 2  # completes an item (enters the loop state from inside the region): count += 1
EXIT = 4  # leaves the region from its loop state: needs count >= lo
ENTER = 8  # enters a region's loop state from outside: count := 0
UNBOUNDED = 1 << 62  # hi of item{lo,}

COUNT_MIN_STATES = 16_384  # count a repetition whose unrolled item DFAs would exceed this
MAX_ITEM_SIZE = 4_000  # IR nodes of an item checked for countability
_ITEM_DFAS: OrderedDict = OrderedDict()  # item -> its minimal DFA, or None (not countable)
_ITEM_LOCK = threading.Lock()
REGION_PREFIX = "\x00count"


@dataclass(frozen=True)
class Counters:
    """The counter semantics of an automaton's regions (immutable)."""

    act: np.ndarray  # int8 [n_states, n_classes]: START | TICK | EXIT | ENTER bits
    region: np.ndarray  # int32 [n_states]: the region of each state, -1 outside
    lo: np.ndarray  # int64 [n_regions]
    hi: np.ndarray  # int64 [n_regions] (UNBOUNDED: no bound)


# ------------------------------------------------------------------------ front


def _item_dfa(item: Expr, limits: Limits, deadline: float) -> RawDFA:
    """The minimal DFA of a Ref-free ``item`` over its own byte classes (``_cls`` kept on it)."""
    from .automaton import _collect_masks

    alphabet = Alphabet(_collect_masks({"item": item}, ["item"], set()))
    nfa = NFA(limits, deadline, alphabet)
    s0 = nfa.new()
    end = FragmentBuilder(nfa, {}, {}).build(item, s0)
    d = minimal_dfa(nfa, s0, end)
    d._cls = alphabet.cls
    return d


def item_dfa(item: Expr, limits: Limits, deadline: float) -> RawDFA | None:
    """The item's minimal DFA when a repetition of it can be counted (:func:`countable`),
    else None; memoised (bounded) across compilations."""
    if item._refs or item._size > MAX_ITEM_SIZE:
        return None
    with _ITEM_LOCK:
        if item in _ITEM_DFAS:
            _ITEM_DFAS.move_to_end(item)
            return _ITEM_DFAS[item]
    d = _item_dfa(item, limits, deadline)
    d = d if countable(d) else None
    with _ITEM_LOCK:
        _ITEM_DFAS[item] = d
        if len(_ITEM_DFAS) > 1024:
            _ITEM_DFAS.popitem(last=False)
    return d


def countable(d: RawDFA) -> bool:
    """Is the DFA's language non-empty, without the empty string and prefix-free, with a
    start state no edge enters? (Then a return to the start is one item.)"""
    n = len(d.accepting)
    if n < 2 or d.accepting[0] or int(d.accepting.sum()) != 1:
        return False
    f = int(np.flatnonzero(d.accepting)[0])
    return not (d.table[f] >= 0).any() and not (d.table == 0).any()


def extract_counted(rules: dict[str, Expr], limits: Limits, deadline: float,
                    count_above: int = COUNT_MIN_STATES) -> dict[str, tuple[Expr, int, int]]:
    """Rewrite ``rules`` in place: every long (over :data:`~.ir.LONG_REPEAT` copies),
    countable repetition outside ``And`` / ``Diff`` whose copies would have more than
    ``count_above`` states becomes ``Ref`` to a new rule holding it. Returns the new
    rules: name -> (item, lo, hi) (``hi``: :data:`UNBOUNDED` for ``item{lo,}``)."""
    regions: dict[str, tuple[Expr, int, int]] = {}
    by_repeat: dict[Repeat, str] = {}
    memo: dict[int, tuple[Expr, Expr]] = {}

    def counts(e: Repeat) -> bool:
        copies = max(e.min, e.max or 0)
        if copies <= LONG_REPEAT:
            return False
        d = item_dfa(e.item, limits, deadline)
        return d is not None and copies * len(d.accepting) > count_above

    def walk(e: Expr) -> Expr:
        if not e._long:
            return e
        hit = memo.get(id(e))
        if hit is not None:
            return hit[1]
        t = type(e)
        out = e
        if t is Repeat:
            if counts(e):
                name = by_repeat.get(e)
                if name is None:
                    name = by_repeat[e] = f"{REGION_PREFIX}{len(regions)}"
                    regions[name] = (e.item, e.min, UNBOUNDED if e.max is None else e.max)
                out = Ref(name)
            else:
                item = walk(e.item)
                if item is not e.item:
                    out = Repeat(item, e.min, e.max)
        elif isinstance(e, _Items) and t is not And:
            items = tuple([walk(i) for i in e.items])
            if any(a is not b for a, b in zip(items, e.items)):
                out = t(items)
        memo[id(e)] = (e, out)
        return out

    for name in list(rules):
        rules[name] = walk(rules[name])
    for name, (item, lo, hi) in regions.items():
        rules[name] = Repeat(item, lo, None if hi == UNBOUNDED else hi)
    return regions


def loop_dfa(item: Expr, alphabet: Alphabet, limits: Limits, deadline: float) -> RawDFA:
    """The region rule's DFA over ``alphabet``'s classes: the item's DFA with its accepting
    state merged into the start (state 0, the loop state, accepting)."""
    d = item_dfa(item, limits, deadline)
    table = d.table[:, d._cls[alphabet.rep_arr]]  # the item's classes -> this compilation's
    f = int(np.flatnonzero(d.accepting)[0])
    keep = np.array([q for q in range(len(d.accepting)) if q != f], dtype=np.int64)
    lut = np.full(len(d.accepting) + 1, -1, dtype=np.int32)  # [-1] -> -1 (dead)
    lut[keep] = np.arange(len(keep), dtype=np.int32)
    lut[f] = 0
    out = np.ascontiguousarray(lut[table[keep]])
    acc = np.zeros(len(keep), dtype=bool)
    acc[0] = True
    e = np.zeros(0, dtype=np.int64)
    return _with_calls(out, acc, e, e, e)


# ------------------------------------------------------------------------- back


def inline_regions(table: np.ndarray, accepting: np.ndarray, calls: list, start: int,
                   regions: dict[int, tuple[int, int, int]]):
    """Replace every call edge of an assembled automaton by a private copy of the called
    region (``regions``: the callee's start state -> (its number of states, lo, hi)).

    Returns ``(table, accepting, start, counters)``. Raises ConstraintTooComplex where a
    call cannot be inlined exactly: a call to a rule that is not a region (a recursive
    grammar), or a call site with other edges (the count would be ambiguous)."""
    n0, n_cls = table.shape
    sites = []
    for s, cs in enumerate(calls):
        for callee, t in cs:
            if callee not in regions:
                raise ConstraintTooComplex("a counted repetition (a long maxLength, maxItems, ...) is supported"
                                           " only where the rest of the grammar needs no rule calls")
            if len(cs) > 1 or accepting[s] or (table[s] >= 0).any() or calls[t]:
                raise ConstraintTooComplex("a counted repetition (a long maxLength, maxItems, ...) shares its"
                                           " position with other alternatives: it cannot be counted exactly")
            sites.append((s, callee, t))
    total = n0 + sum(regions[callee][0] for _, callee, _ in sites)
    out = np.full((total, n_cls), -1, dtype=np.int32)
    out[:n0] = table
    act = np.zeros((total, n_cls), dtype=np.int8)
    acc = np.zeros(total, dtype=bool)
    acc[:n0] = accepting
    region = np.full(total, -1, dtype=np.int32)
    los, his = [], []
    entry = np.arange(total + 1, dtype=np.int32)  # state -> where a transition into it goes
    entry[total] = -1
    base = n0
    for k, (s, callee, t) in enumerate(sites):
        n, lo, hi = regions[callee]
        proto = table[callee : callee + n]
        local = np.where(proto >= 0, proto - callee, -1)
        out[base : base + n] = np.where(local >= 0, local + base, -1)
        act[base : base + n][local >= 0] = np.where(local[local >= 0] == 0, TICK, 0)
        act[base][local[0] >= 0] |= START
        exits = table[t] >= 0
        if (exits & (local[0] >= 0)).any():
            raise ConstraintTooComplex("a counted repetition is followed by what may continue its item:"
                                       " it cannot be counted exactly")
        out[base][exits] = table[t][exits]
        act[base][exits] = EXIT
        acc[base] = accepting[t]
        region[base : base + n] = k
        los.append(lo)
        his.append(hi)
        entry[s] = base
        base += n
    into = np.zeros(total + 1, dtype=bool)
    into[[s for s, _, _ in sites]] = True
    entering = into[out]  # out == -1 reads into[-1] (False)
    act[entering] |= ENTER
    out = entry[out]
    start = int(entry[start])
    counters = Counters(act, region, np.array(los, dtype=np.int64), np.array(his, dtype=np.int64))
    return out, acc, start, counters


def step_counted(automaton, config: int, data: bytes) -> int | None:
    """Advance a configuration (``state + n_states * count``) over ``data``; None if dead."""
    n = automaton.n_states
    s, c = config % n, config // n
    cls, rows, acts = automaton._cls_list, automaton._rows, automaton._act_rows
    region, lo, hi = automaton._region_list, automaton._lo_list, automaton._hi_list
    for b in data:
        r = rows[s]
        if r is None:
            r = automaton.row(s)
        k = cls[b]
        t = r[k]
        if t < 0:
            return None
        ar = acts[s]
        if ar is None:
            ar = acts[s] = automaton.counters.act[s].tolist()
        a = ar[k]
        if a:
            if a & START and c >= hi[region[s]]:
                return None
            if a & EXIT and c < lo[region[s]]:
                return None
            if a & (EXIT | ENTER):
                c = 0
            if a & TICK:
                c += 1
        s = t
    return s + n * c


def live_classes(automaton, config: int) -> list[bool]:
    """Per byte class: does a byte of it keep the configuration alive?"""
    n = automaton.n_states
    s, c = config % n, config // n
    ar = automaton._act_rows[s]
    if ar is None:
        ar = automaton._act_rows[s] = automaton.counters.act[s].tolist()
    r = automaton._region_list[s]
    out = []
    for t, a in zip(automaton.row(s), ar):
        ok = t >= 0
        if ok and a:
            if a & START and c >= automaton._hi_list[r] or a & EXIT and c < automaton._lo_list[r]:
                ok = False
        out.append(ok)
    return out


__all__ = ["COUNT_MIN_STATES", "Counters", "countable", "extract_counted", "inline_regions", "live_classes",
           "loop_dfa", "step_counted"]
