"""Counted repetitions: ``item{lo,hi}`` with a counter instead of ``hi`` copies.

A repetition whose unrolled automaton would be large (``maxLength: 65535``) and whose item
is *countable* compiles to one copy of the item plus a counter in the configuration. An
item is countable when it is Ref-free, non-empty, its minimal DFA's start state has no
edges in, and where an item may end, the bytes that continue it and those that start a new
one are disjoint (a prefix-free item, like a JSON string character, continues nowhere):
then every string has one parse into items, read off byte by byte.

1. :func:`extract_counted` makes each such repetition a rule of its own (a called rule),
   and so an intersection of a Ref-free language with one (``pattern`` and ``maxLength``:
   the product of the two, the repetition's count kept outside it, see :func:`and_region`);
   :class:`Region` is that rule's automaton: the item's DFA where every state an item may
   end in also starts the next one (those transitions *tick*: count += 1);
2. :func:`inline_regions` takes the finished automaton's call edges ``s --rule--> t`` and
   gives each a private copy of the rule's states: transitions into ``s`` enter the copy's
   start instead (count := 0); the states an item may end in take over ``t``'s transitions
   (exits: allowed once count >= lo) and its accepting flag (likewise). A transition into a
   region state ``x`` with count ``c`` after it is allowed iff ``c + need[x] <= hi``
   (``need``: the fewest further items from ``x`` to an end; 0 for a plain repetition).

The count is the number of items started. A configuration is the int ``state + n_states *
count`` (``count`` is 0 outside regions, so other configurations are plain states).
A token of ``W`` bytes starts at most ``W`` items, so the allowed tokens depend on the count
only through ``min(hi - count, W + 1 + max need)`` and ``min(max(lo - count, 0), W + 1)``,
and near a bound only through which of the tokens' own margins it passes: the compiled
constraint memoises rows under those (see :meth:`~.compiled.CompiledConstraint.mask_row`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..errors import ConstraintTooComplex
from ..ir import LONG_REPEAT, And, Expr, Items, Ref, Repeat, collect_masks
from .nfa import NFA, Alphabet, FragmentBuilder, Limits, RawDFA, minimal_dfa, with_calls

# transition actions (bits of Counters.act)
TICK = 2  # starts an item: count += 1
EXIT = 4  # leaves the region: needs count >= lo
ENTER = 8  # enters a region's start: count := 0
UNBOUNDED = 1 << 62  # hi of item{lo,}

COUNT_MIN_STATES = 16_384  # count a repetition whose unrolled item DFAs would exceed this
MAX_ITEM_SIZE = 4_000  # IR nodes of an item checked for countability
MAX_BODY_SIZE = 50_000  # IR nodes of the language a counted repetition is intersected with
MAX_REGION_STATES = 4_096  # states of a product region
MAX_NEED_LEVELS = 4_096  # item counts searched for the ``need`` of a product region
_ITEM_DFAS: OrderedDict = OrderedDict()  # item -> its minimal DFA, or None (not countable)
_ITEM_LOCK = threading.Lock()
REGION_PREFIX = "\x00count"


@dataclass(frozen=True)
class Counters:
    """The counter semantics of an automaton's regions (immutable)."""

    act: np.ndarray  # int8 [n_states, n_classes]: TICK | EXIT | ENTER bits
    region: np.ndarray  # int32 [n_states]: the region of each state, -1 outside
    need: np.ndarray  # int64 [n_states]: fewest further items to an end (0 outside)
    lo: np.ndarray  # int64 [n_regions]
    hi: np.ndarray  # int64 [n_regions] (UNBOUNDED: no bound)


@dataclass(frozen=True)
class Region:
    """A counted repetition's automaton over its own byte classes ``cls`` (state 0: the
    start, no edge enters it)."""

    expr: Expr  # what the region matches (its byte sets join the compilation's classes)
    cls: np.ndarray  # int32 [256]
    table: np.ndarray  # int32 [n, n_own_classes], -1 dead
    tick: np.ndarray  # bool [n, n_own_classes]: the transition starts an item
    ends: np.ndarray  # bool [n]: the region may be left here (once count >= lo)
    need: np.ndarray  # int64 [n]
    lo: int
    hi: int


# ------------------------------------------------------------------------ front


def _item_dfa(item: Expr, limits: Limits, deadline: float, alphabet: Alphabet | None = None) -> RawDFA:
    """The minimal DFA of a Ref-free ``item`` over its own byte classes (``_cls`` kept on it)."""

    if alphabet is None:
        alphabet = Alphabet(collect_masks({"item": item}, ["item"], set()))
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
    """Does the minimal DFA of an item language parse its repetitions uniquely, byte by
    byte? Non-empty, without the empty string, no edge into the start, and in every
    accepting state the bytes that continue an item are not bytes that start one."""
    n = len(d.accepting)
    if n < 2 or d.accepting[0] or (d.table == 0).any():
        return False
    starts = d.table[0] >= 0
    return not (d.table[d.accepting] >= 0)[:, starts].any()


def _loop(d: RawDFA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table, tick, ends) of item* from a countable item's DFA: every accepting state also
    starts the next item (those transitions tick, as do the start's own)."""
    table = d.table.copy()
    starts = table[0] >= 0
    tick = np.zeros(table.shape, dtype=bool)
    tick[0, starts] = True
    for f in np.flatnonzero(d.accepting).tolist():
        table[f, starts] = table[0, starts]
        tick[f, starts] = True
    ends = d.accepting.copy()
    ends[0] = True
    return table, tick, ends


def loop_region(rep: Repeat, d: RawDFA) -> Region:
    """The region of ``item{lo,hi}`` (``d``: the item's countable DFA)."""
    table, tick, ends = _loop(d)
    hi = UNBOUNDED if rep.max is None else rep.max
    return Region(rep, d._cls, table, tick, ends, np.zeros(len(ends), dtype=np.int64), rep.min, hi)


def _back_closure(v: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``v`` and every state with a path of edges (src -> dst) into it."""
    v = v.copy()
    while True:
        add = src[v[dst] & ~v[src]]
        if not len(add):
            return v
        v[add] = True


def _needs(table: np.ndarray, tick: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
    """Per state, the fewest further items to an end state (-1: none). A configuration
    (x, count) can then still end iff ``count + need[x] <= hi`` when ``lo == 0``; with a
    lower bound only if every state that can end after ``m`` more items can also end after
    any number from ``m`` to ``hi`` (checked; else None)."""
    src, k = np.nonzero(table >= 0)
    dst = table[src, k]
    t = tick[src, k]
    plain_src, plain_dst, tick_src, tick_dst = src[~t], dst[~t], src[t], dst[t]
    ok = _back_closure(ends, plain_src, plain_dst)  # can end after exactly j more items (j = 0)
    need = np.where(ok, 0, -1).astype(np.int64)
    ever = ok.copy()
    j = 0
    while True:  # shortest tick distances: grow ``ever`` until it stops
        j += 1
        pre = np.zeros(len(ends), dtype=bool)
        pre[tick_src[ever[tick_dst]]] = True
        new = _back_closure(pre | ever, plain_src, plain_dst)
        if (new == ever).all():
            break
        need[new & ~ever] = j
        ever = new
    if lo == 0:
        return need
    seen = ok.copy()  # states that can end after some number of items, up to this one
    for _ in range(min(hi, MAX_NEED_LEVELS)):
        pre = np.zeros(len(ends), dtype=bool)
        pre[tick_src[ok[tick_dst]]] = True
        new = _back_closure(pre, plain_src, plain_dst)  # after exactly j
        if (seen & ~new).any():
            return None  # some state can end after fewer items but not after j
        seen |= new
        if (new == ok).all():
            return need  # the same for every larger j
        ok = new
    return need if hi <= MAX_NEED_LEVELS else None


def and_region(e: And, rep: Repeat, limits: Limits, deadline: float) -> Region | None:
    """The region of ``body & item{lo,hi}`` (``e``; ``body``: its other operands): the
    product of the body's DFA and the item loop, trimmed to states that can still end.
    None when the item is not countable, the product is large, or the count decides more
    than ``count + need <= hi`` (see :func:`_needs`)."""

    rules = {"e": e}
    alphabet = Alphabet(collect_masks(rules, ["e"], set()))
    others = [i for i in e.items if i is not rep]
    body = others[0] if len(others) == 1 else And(tuple(others))
    if body._refs or body._size > MAX_BODY_SIZE or rep.item._refs or rep.item._size > MAX_ITEM_SIZE:
        return None
    u = _item_dfa(rep.item, limits, deadline, alphabet)
    if not countable(u):
        return None
    p = _item_dfa(body, limits, deadline, alphabet)
    if not len(p.accepting):
        return None
    ut, utick, uends = _loop(u)
    pt = p.table
    n_cls = pt.shape[1]
    index = {(0, 0): 0}
    pairs = [(0, 0)]
    rows: list[list[int]] = []
    ticks: list[list[bool]] = []
    i = 0
    while i < len(pairs):
        a, b = pairs[i]
        i += 1
        if not i & 255 and time.monotonic() > deadline:
            raise ConstraintTooComplex("constraint took too long to compile (counted repetition)")
        row, trow = [-1] * n_cls, [False] * n_cls
        for c in range(n_cls):
            x, y = int(pt[a, c]), int(ut[b, c])
            if x >= 0 and y >= 0:
                j = index.get((x, y))
                if j is None:
                    if len(pairs) >= MAX_REGION_STATES:
                        return None
                    j = index[(x, y)] = len(pairs)
                    pairs.append((x, y))
                row[c] = j
                trow[c] = bool(utick[b, c])
        rows.append(row)
        ticks.append(trow)
    table = np.array(rows, dtype=np.int32)
    tick = np.array(ticks, dtype=bool)
    pa = np.array(pairs, dtype=np.int64)
    ends = p.accepting[pa[:, 0]] & uends[pa[:, 1]]
    hi = UNBOUNDED if rep.max is None else rep.max
    need = _needs(table, tick, ends, rep.min, hi)
    if need is None or need[0] < 0 or need[0] > hi:
        return None
    # trim: states that cannot end within hi items are dead (start stays 0)
    live = need >= 0
    lut = np.full(len(live) + 1, -1, dtype=np.int32)
    lut[np.flatnonzero(live)] = np.arange(int(live.sum()), dtype=np.int32)
    table = lut[table[live]]
    tick = tick[live] & (table >= 0)
    return Region(e, alphabet.cls, np.ascontiguousarray(table), tick, ends[live], need[live], rep.min, hi)


def _long_operand(e: And) -> Repeat | None:
    reps = [i for i in e.items if type(i) is Repeat and max(i.min, i.max or 0) > LONG_REPEAT]
    return reps[0] if len(reps) == 1 else None


def extract_counted(
    rules: dict[str, Expr],
    limits: Limits,
    deadline: float,
    count_above: int = COUNT_MIN_STATES,
    skipped: list[int] | None = None,
) -> dict[str, Region]:
    """Rewrite ``rules`` in place: every long (over :data:`~..ir.LONG_REPEAT` copies),
    countable repetition outside ``And`` / ``Diff``, or intersection with one (``And``),
    whose copies would have more than ``count_above`` states becomes ``Ref`` to a new rule
    holding it. Returns the new rules' regions by name; appends to ``skipped`` one entry
    per countable repetition left to copy (fewer states)."""
    regions: dict[str, Region] = {}
    by_expr: dict[Expr, str] = {}
    memo: dict[int, tuple[Expr, Expr]] = {}

    def region_of(e: Expr) -> Region | None:
        if type(e) is Repeat:
            copies = max(e.min, e.max or 0)
            if copies <= LONG_REPEAT:
                return None
            d = item_dfa(e.item, limits, deadline)
            if d is None:
                return None
            if copies * len(d.accepting) <= count_above:
                if skipped is not None:
                    skipped.append(1)
                return None
            return loop_region(e, d)
        rep = _long_operand(e)
        if rep is None or any(i._refs for i in e.items):
            return None
        d = item_dfa(rep.item, limits, deadline)
        if d is None:
            return None
        if max(rep.min, rep.max or 0) * len(d.accepting) <= count_above:
            if skipped is not None:
                skipped.append(1)
            return None
        return and_region(e, rep, limits, deadline)

    def walk(e: Expr) -> Expr:
        if not e._long:
            return e
        hit = memo.get(id(e))
        if hit is not None:
            return hit[1]
        t = type(e)
        out = e
        if t is Repeat or t is And:
            name = by_expr.get(e)
            if name is None:
                r = region_of(e)
                if r is not None:
                    name = by_expr[e] = f"{REGION_PREFIX}{len(regions)}"
                    regions[name] = r
            if name is not None:
                out = Ref(name)
            elif t is Repeat:
                item = walk(e.item)
                if item is not e.item:
                    out = Repeat(item, e.min, e.max)
        elif isinstance(e, Items):
            items = tuple([walk(i) for i in e.items])
            if any(a is not b for a, b in zip(items, e.items)):
                out = t(items)
        memo[id(e)] = (e, out)
        return out

    try:
        for name in list(rules):
            rules[name] = walk(rules[name])
    finally:
        walk = None  # (a nested function that calls itself is a reference cycle: freed here)
    for name, r in regions.items():
        rules[name] = r.expr
    return regions


def region_dfa(r: Region, alphabet: Alphabet) -> RawDFA:
    """The region rule's DFA over ``alphabet``'s classes (which refine the region's own:
    a class's column is that of its first byte); its tick table is kept on it (``_tick``)."""
    cols = r.cls[alphabet.rep_arr]
    e = np.zeros(0, dtype=np.int64)
    d = with_calls(np.ascontiguousarray(r.table[:, cols]), r.ends.copy(), e, e, e)
    d._tick = np.ascontiguousarray(r.tick[:, cols])
    return d


# ------------------------------------------------------------------------- back


class NotCounted(ConstraintTooComplex):
    """A counted repetition that cannot be inlined exactly (the caller unrolls it instead)."""


def inline_regions(
    table: np.ndarray,
    accepting: np.ndarray,
    calls: list,
    start: int,
    regions: dict[int, tuple[RawDFA, Region]],
    start_end: int,
):
    """Replace every call edge to a region of an assembled automaton by a private copy of
    the region (``regions``: the callee's start state -> (its DFA as assembled, the
    region)); other calls stay (a pushdown automaton).

    Returns ``(table, accepting, calls, start, counters)``. Raises :class:`NotCounted`
    where a call cannot be inlined exactly: a call site in another rule than the start
    rule (states ``start..start_end - 1``) whose region may end its rule (a count lives in
    the top frame of a stack, so a region must not return), or with other edges (the
    count would be ambiguous)."""
    n0, n_cls = table.shape
    sites = []
    for s, cs in enumerate(calls):
        for callee, t in cs:
            if callee not in regions:
                continue
            if not start <= s < start_end and accepting[t]:
                # (a count lives in the top frame: a region must not return to its caller)
                raise NotCounted("a counted repetition at the end of a called rule")
            if len(cs) > 1 or accepting[s] or (table[s] >= 0).any() or calls[t]:
                raise NotCounted(
                    "a counted repetition (a long maxLength, maxItems, ...) shares its position with"
                    " other alternatives: it cannot be counted exactly"
                )
            sites.append((s, callee, t))
    total = n0 + sum(len(regions[callee][0].accepting) for _, callee, _ in sites)
    out = np.full((total, n_cls), -1, dtype=np.int32)
    out[:n0] = table
    act = np.zeros((total, n_cls), dtype=np.int8)
    acc = np.zeros(total, dtype=bool)
    acc[:n0] = accepting
    region = np.full(total, -1, dtype=np.int32)
    need = np.zeros(total, dtype=np.int64)
    los, his = [], []
    entry = np.arange(total + 1, dtype=np.int32)  # state -> where a transition into it goes
    entry[total] = -1
    base = n0
    for k, (s, callee, t) in enumerate(sites):
        d, r = regions[callee]
        n = len(d.accepting)
        local = np.where(table[callee : callee + n] >= 0, table[callee : callee + n] - callee, -1)
        out[base : base + n] = np.where(local >= 0, local + base, -1)
        act[base : base + n] = np.where(d._tick & (local >= 0), TICK, 0)
        exits = table[t] >= 0
        for e in np.flatnonzero(d.accepting).tolist():
            if (exits & (local[e] >= 0)).any():
                raise NotCounted(
                    "a counted repetition is followed by what may continue its items:"
                    " it cannot be counted exactly"
                )
            out[base + e][exits] = table[t][exits]
            act[base + e][exits] = EXIT
            acc[base + e] = accepting[t]
        region[base : base + n] = k
        need[base : base + n] = r.need
        los.append(r.lo)
        his.append(r.hi)
        entry[s] = base
        base += n
    into = np.zeros(total + 1, dtype=bool)
    into[[s for s, _, _ in sites]] = True
    entering = into[out]  # out == -1 reads into[-1] (False)
    act[entering] |= ENTER
    out = entry[out]
    entry_list = entry.tolist()
    new_calls = [
        tuple((callee, entry_list[ret]) for callee, ret in cs if callee not in regions) for cs in calls
    ]
    new_calls += [()] * (total - n0)
    start = entry_list[start]
    counters = Counters(act, region, need, np.array(los, dtype=np.int64), np.array(his, dtype=np.int64))
    return out, acc, new_calls, start, counters


def step_counted(automaton, config: int, data: bytes) -> int | None:
    """Advance a configuration (``state + n_states * count``) over ``data``; None if dead."""
    n = automaton.n_states
    s, c = config % n, config // n
    cls, tg, acts, w = automaton.cls_list, automaton.targets, automaton.acts, automaton.width
    region, need, lo, hi = (
        automaton._region_list,
        automaton._need_list,
        automaton._lo_list,
        automaton._hi_list,
    )
    for b in data:
        i = s * w + cls[b]
        t = tg[i]
        if t < 0:
            return None
        a = acts[i]
        if a:
            if a & EXIT and c < lo[region[s]]:
                return None
            if a & (EXIT | ENTER):
                c = 0
            if a & TICK:
                c += 1
        rt = region[t]
        if rt >= 0 and c + need[t] > hi[rt]:
            return None
        s = t
    return s + n * c


def live_classes(automaton, config: int) -> list[bool]:
    """Per byte class: does a byte of it keep the configuration alive?"""
    n = automaton.n_states
    s, c = config % n, config // n
    w = automaton.width
    ar = automaton.acts[s * w : s * w + w]
    region, need, lo, hi = (
        automaton._region_list,
        automaton._need_list,
        automaton._lo_list,
        automaton._hi_list,
    )
    out = []
    for t, a in zip(automaton.row(s), ar):
        ok = t >= 0
        if ok:
            c2 = c
            if a:
                if a & EXIT and c < lo[region[s]]:
                    ok = False
                c2 = 0 if a & (EXIT | ENTER) else c
                c2 += 1 if a & TICK else 0
            rt = region[t]
            if ok and rt >= 0 and c2 + need[t] > hi[rt]:
                ok = False
        out.append(ok)
    return out


__all__ = [
    "COUNT_MIN_STATES",
    "Counters",
    "NotCounted",
    "Region",
    "and_region",
    "countable",
    "extract_counted",
    "inline_regions",
    "live_classes",
    "loop_region",
    "region_dfa",
    "step_counted",
]
