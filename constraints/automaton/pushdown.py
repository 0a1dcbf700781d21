"""Grammar → byte-level pushdown automaton.

Each rule that must stay a rule (recursive, or large and shared) becomes a minimal DFA
over byte classes and *call* edges; every other rule is inlined into its callers, so a
non-recursive constraint (most JSON Schemas, every regex) is a single DFA and its
configurations are plain ints.

A configuration of a recursive grammar is a set of stacks (nondeterminism is rare and
bounded); a stack is a tuple of global DFA states, bottom first: every frame below the
top is the state to return to once the frame above it accepts. Stacks in a
configuration always have byte edges out of their top state (epsilon moves — calls and
returns — are taken eagerly by :meth:`Automaton.closure`).

Direct left recursion (``a: a x | y``) is rewritten to ``a: y x*``; other left recursion
is a compile error naming the rules involved.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .. import ir
from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import Alt, Expr, Grammar, Ref, Seq
from . import counted as ct
from .hoist import hoist_repeated
from .nfa import (
    NFA,
    SHARED_DFAS,
    Alphabet,
    DFAMemo,
    FragmentBuilder,
    Limits,
    RawDFA,
    call_edge_arrays,
    determinize,
    live_states,
    minimal_dfa,
    minimize,
)
from .tables import flags, flat, ints

MAX_STACK_DEPTH = 4_000
MAX_STACKS = 512


# A configuration of a recursive grammar: (stacks, can_end), its live stacks (each a tuple of
# states, the top last) in sorted order and whether the grammar may end here. Plain tuples of
# ints and a bool: Python's collector stops tracking them after its first passes, and in a
# full pass it stops tracking the dicts that hold only such values (the step memos). A server
# keeps tens of thousands of configurations in its cached constraints' step memos and row
# caches.
Config = tuple


def make_config(stacks, can_end: bool) -> Config:
    """The configuration of ``stacks`` (an iterable of stacks: equal sets of stacks make equal
    configurations)."""
    return (tuple(sorted(stacks)), can_end)


def closed_config(stacks: set, can_end: bool) -> Config:
    """:func:`make_config` of a closure's ``stacks``, past :data:`MAX_STACKS` of them a
    ConstraintTooComplex."""
    if len(stacks) > MAX_STACKS:
        raise ConstraintTooComplex(f"grammar is too ambiguous: more than {MAX_STACKS} parse stacks")
    return make_config(stacks, can_end)


def union_config(cfgs) -> Config:
    """The configuration of every stack of the configurations ``cfgs`` (may end where one
    may). A closure is what its stacks reach, so the closure of several sets of stacks is
    the union of their closures."""
    stacks: set = set()
    can_end = False
    for cfg in cfgs:
        stacks.update(cfg[0])
        can_end = can_end or cfg[1]
    return closed_config(stacks, can_end)


class Automaton:
    """The compiled byte-level automaton of a grammar (immutable, shareable)."""

    def __init__(
        self,
        table: np.ndarray,
        cls: np.ndarray,
        accepting: np.ndarray,
        calls: list[tuple[tuple[int, int], ...]] | dict[int, tuple[tuple[int, int], ...]],
        start: int,
        rule_names: list[str],
        counters: ct.Counters | None = None,
    ) -> None:
        self.table = table  # int32 [N, n_classes], -1 dead
        self.cls = cls  # int32 [256] byte -> class
        self.accepting = accepting  # bool [N]
        # per state that calls a rule: ((callee start state, return state), ...); a state
        # without calls is absent. Per-state tables are bytes and int arrays (flags, ints), and
        # this dict holds only the few states with calls: the collector walks neither a
        # per-state tuple's items in the first young collection after a compile (often inside a
        # mask) nor, had they been lists, in every full collection
        per = calls.items() if isinstance(calls, dict) else enumerate(calls)
        self.calls: dict[int, tuple[tuple[int, int], ...]] = {s: tuple(c) for s, c in per if c}
        self.has_calls = np.zeros(len(accepting), dtype=bool)
        self.has_calls[list(self.calls)] = True
        self._call_flags = flags(self.has_calls)
        self.has_bytes = (table >= 0).any(axis=1) if len(table) else np.zeros(0, bool)
        self.start = start
        self.rule_names = rule_names
        self.is_regular = not self.has_calls.any()
        self.n_states = len(accepting)
        self.cls_list = tuple(cls.tolist())
        self.width = table.shape[1]  # byte classes: a state's row in .targets
        self.targets = flat(table)  # target of (s, class c) at s * width + c, -1 dead
        self._acc_list = flags(accepting)  # (flags: bytes, not tuples of bools)
        self._has_bytes_list = flags(self.has_bytes)
        # counted repetitions (see .counted): a configuration, or in a pushdown automaton the
        # top frame of a stack (a region has no calls), is state + n_states * count
        self.counters = counters
        if counters is not None:
            self.acts = flat(counters.act)  # its counter actions, as .targets
            self._region_list = ints(counters.region)  # (per state: ints, not tuples)
            self._need_list = ints(counters.need)
            self._lo_list = tuple(counters.lo.tolist())
            self._hi_list = tuple(counters.hi.tolist())
        self.initial = self.start if self.is_regular else self.closure([(self.start,)])

    # ----------------------------------------------------------------- single steps

    def _bottom(self, v: int) -> tuple[int, bool]:
        """A frame of a pushdown automaton with counters: (state, may end or return here)."""
        n = self.n_states
        s = v % n
        r = self._region_list[s]
        return s, bool(self._acc_list[s]) and (r < 0 or v // n >= self._lo_list[r])

    def row(self, s: int) -> memoryview:
        """State ``s``'s row of the table (its target per byte class, -1 dead), a view of
        :attr:`targets`; the loops of a step read ``targets[s * width + c]`` directly."""
        w = self.width
        return self.targets[s * w : s * w + w]

    def closure(self, stacks) -> Config | None:
        """Take every call and return; keep stacks whose top can read a byte."""
        return self.closure_reads(stacks)[0]

    def closure_reads(self, stacks) -> tuple[Config | None, int, int]:
        """:meth:`closure`, and the lengths of the shortest and the longest stack whose top
        it read. Below the shortest, no frame is read, so any frames may stand there; what
        the closure does then depends on the lengths only through the nesting bound, which
        the longest tells whether it met."""
        out: set[tuple[int, ...]] = set()
        seen: set[tuple[int, ...]] = set()
        work = list(stacks)
        can_end = False
        acc, hb, hc, calls = self._acc_list, self._has_bytes_list, self._call_flags, self.calls
        counted = self.counters is not None
        lowest = MAX_STACK_DEPTH + 1
        highest = 0
        while work:
            st = work.pop()
            if st in seen:
                continue
            seen.add(st)
            if len(st) < lowest:
                lowest = len(st)
            if len(st) > highest:
                highest = len(st)
            top = st[-1]
            ends = None
            if counted:  # a frame in a region is a top frame: state + n_states * count
                top, ends = self._bottom(top)
            if hb[top]:
                out.add(st)
            if hc[top]:  # (never in a region: a bottom frame with a call holds its state)
                if len(st) >= MAX_STACK_DEPTH:
                    continue  # nesting bound: deeper structure is not generated
                base = st[:-1]
                for callee, ret in calls[top]:
                    work.append(base + (ret, callee))
            if acc[top] if ends is None else ends:
                if len(st) == 1:
                    can_end = True
                else:
                    work.append(st[:-1])
            if len(seen) > 64 * MAX_STACKS:
                raise ConstraintTooComplex("grammar is too ambiguous: too many parse stacks")
        if not out and not can_end:
            return None, lowest, highest
        return closed_config(out, can_end), lowest, highest

    def step_byte(self, config, b: int):
        """Advance a configuration (int state or Config) by one byte; None if dead."""
        c = self.cls_list[b]
        counted = self.counters is not None
        if self.is_regular:
            if counted:
                return ct.step_counted(self, config, bytes((b,)))
            t = self.targets[config * self.width + c]
            return t if t >= 0 else None
        moved = []
        for st in config[0]:
            if counted:
                t = ct.step_counted(self, st[-1], bytes((b,)))
                if t is not None:
                    moved.append(st[:-1] + (t,))
                continue
            t = self.targets[st[-1] * self.width + c]
            if t >= 0:
                moved.append(st[:-1] + (t,))
        if not moved:
            return None
        return self.closure(moved)

    def step_bytes(self, config, data: bytes):
        if self.counters is not None and self.is_regular:
            return ct.step_counted(self, config, data)
        if self.is_regular:
            s = config
            cls, tg, w = self.cls_list, self.targets, self.width
            for b in data:
                s = tg[s * w + cls[b]]
                if s < 0:
                    return None
            return s
        if self.counters is not None:  # (a top frame may hold a count: one byte at a time)
            for b in data:
                config = self.step_byte(config, b)
                if config is None:
                    return None
            return config
        # a pushdown automaton: runs of bytes that move one stack's top state and need no
        # closure (no call, no return, no end) step its DFA directly, linear in the bytes
        cls, tg, w, hc = self.cls_list, self.targets, self.width, self._call_flags
        acc, hb = self._acc_list, self._has_bytes_list
        i, n = 0, len(data)
        while i < n:
            if len(config[0]) == 1:
                ((st,), _) = config
                s = st[-1]
                j = i
                while j < n:
                    t = tg[s * w + cls[data[j]]]
                    if t < 0:
                        return None
                    if hc[t] or acc[t] or not hb[t]:
                        break  # (a call, a return or the end: the closure decides)
                    s = t
                    j += 1
                if j > i:
                    config = ((st[:-1] + (s,),), False)
                    i = j
                    if i == n:
                        break
            config = self.step_byte(config, data[i])
            if config is None:
                return None
            i += 1
        return config

    def can_end(self, config) -> bool:
        if self.counters is not None and self.is_regular:
            n = self.n_states
            s = config % n
            r = self._region_list[s]
            return bool(self._acc_list[s]) and (r < 0 or config // n >= self._lo_list[r])
        if self.is_regular:
            return bool(self._acc_list[config])
        return config[1]

    def next_bytes(self, config) -> list[int]:
        """Bytes that can come next (in increasing order): the classes alive from any top
        state, each spelled out by its bytes (``jump-forward`` asks this for every forced
        byte, so it does not test 256 bytes against every stack)."""
        if self.counters is not None:
            if self.is_regular:
                lives = [ct.live_classes(self, config)]
            else:
                lives = [ct.live_classes(self, st[-1]) for st in config[0]]
            live = {c for ok in lives for c, x in enumerate(ok) if x}
        else:
            rows = [self.row(config)] if self.is_regular else [self.row(st[-1]) for st in config[0]]
            live = {c for r in rows for c, t in enumerate(r) if t >= 0}
        if not live:
            return []
        by_class = self._by_class()
        if len(live) == 1:
            return list(by_class[next(iter(live))])
        return sorted(b for c in live for b in by_class[c])

    def forced_byte(self, config) -> int | None:
        """The one byte that can come next, or None where none or several can: ``next_bytes``
        when it lists one byte, without spelling out the live classes. A state's one live class
        is found once and remembered, so a configuration with several choices (every character
        of a string) costs a dict lookup per top state. Jump-forward and DSpark's forced drafts
        ask it at every configuration they meet."""
        if self.counters is not None:  # (a count may close or open a state's classes)
            nb = self.next_bytes(config)
            return nb[0] if len(nb) == 1 else None
        only = self.__dict__.get("_only")
        if only is None:
            only = self._only = {}  # state -> its one live class; -1: none, -2: several
        c = -1
        for s in (config,) if self.is_regular else [st[-1] for st in config[0]]:
            k = only.get(s)
            if k is None:
                live = np.flatnonzero(self.table[s] >= 0)
                k = only[s] = int(live[0]) if len(live) == 1 else -1 if not len(live) else -2
            if k == -2 or (k >= 0 and c >= 0 and k != c):
                return None
            if k >= 0:
                c = k
        if c < 0:
            return None
        spelled = self._by_class()[c]
        return spelled[0] if len(spelled) == 1 else None

    def _by_class(self) -> tuple[tuple[int, ...], ...]:
        """The bytes of each class, in increasing order."""
        by_class = self.__dict__.get("_class_bytes")
        if by_class is None:
            groups: list[list[int]] = [[] for _ in range(self.table.shape[1])]
            for b, c in enumerate(self.cls_list):
                groups[c].append(b)
            by_class = self._class_bytes = tuple(map(tuple, groups))
        return by_class

    # ------------------------------------------------------------------ whole inputs

    def accepts(self, data: bytes) -> bool:
        """Does ``data`` match the whole grammar? One walk, linear in ``data`` (a pushdown
        automaton's steps cost at most its stacks' depth, bounded by :data:`MAX_STACK_DEPTH`)."""
        cfg = self.step_bytes(self.initial, data) if self.initial is not None else None
        return cfg is not None and self.can_end(cfg)

    def is_prefix(self, data: bytes) -> bool:
        """Can ``data`` be extended to a match?"""
        return self.initial is not None and self.step_bytes(self.initial, data) is not None


# --------------------------------------------------------------------- compilation


def _rewrite_direct_left_recursion(name: str, body: Expr) -> Expr:
    items = body.items if isinstance(body, Alt) else (body,)
    bases: list[Expr] = []
    rests: list[Expr] = []
    for it in items:
        if it == Ref(name):
            continue  # a: a — adds nothing
        if isinstance(it, Seq) and it.items and it.items[0] == Ref(name):
            rests.append(ir.seq(*it.items[1:]))
        else:
            bases.append(it)
    if not rests:
        return body
    return ir.seq(ir.alt(*bases), ir.star(ir.alt(*rests)))


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def compile_grammar(
    grammar: Grammar, limits: Limits | None = None, *, count: bool = True, deadline: float | None = None
) -> Automaton:
    """Compile a grammar to an :class:`Automaton` (raises ConstraintError).

    Rules are inlined into their callers where that keeps the automaton small. When the
    inlined automaton is too large (alternatives of big objects interleave in the subset
    construction), it is compiled again keeping every sizeable rule a rule: smaller DFAs,
    and the nondeterminism moves into the pushdown configurations (sets of stacks).
    Before that, a grammar with long repetitions is compiled counting every countable one
    (the first attempt counts only those whose copies would be large: see :mod:`.counted`).
    ``count=False``: count nothing, every repetition is unrolled (every byte of a text is a
    plain transition of the table, for transforms of the table that rely on it).
    ``deadline``: the ``time.monotonic()`` to be done by (default ``limits.max_seconds`` from
    now); the attempts share the time left.
    """
    limits = limits or Limits()
    start = time.monotonic()
    end = start + limits.max_seconds if deadline is None else deadline
    span = max(0.0, end - start)
    if span <= 0:
        raise ConstraintTooComplex(
            f"constraint took too long to compile: past the compile time bound of {limits.max_seconds:g} s "
            "(Limits.max_seconds) before its automaton",
            bound="max_seconds",
        )
    skipped: list[int] = []  # repetitions the first attempt could have counted but copied
    none = None if count else -1  # count_above of the attempts that count the large ones
    try:  # half the time budget for the first attempt, the rest for the others
        return _compile(grammar, limits, None, start + span / 2, skipped=skipped, count_above=none)
    except ConstraintTooComplex as first:
        if skipped:
            try:
                # (a short slice: where counting helps, this attempt is quick)
                retry_end = min(start + 0.65 * span, time.monotonic() + 0.15 * span)
                return _compile(grammar, limits, None, retry_end, count_above=0)
            except ConstraintTooComplex:
                pass
        if time.monotonic() < end and hoist_repeated(
            dict(grammar.rules), grammar.start, limits.max_inline_size, start + 0.8 * span
        ):
            try:  # big items of repetitions as called rules: one copy each, not one per repetition
                hoist_end = min(start + 0.8 * span, time.monotonic() + 0.15 * span)
                return _compile(
                    grammar, limits, None, hoist_end, hoist=True, count_above=0 if skipped else none
                )
            except ConstraintTooComplex:
                pass
        if len(grammar.rules) < 2 or time.monotonic() >= end:
            raise
        try:
            return _compile(grammar, limits, CALL_ABOVE, end, count_above=none)
        except ConstraintTooComplex:
            raise first from None


CALL_ABOVE = 64  # IR nodes: on the second attempt, rules larger than this stay rules
# a rule that calls none is minimised as it is determinised (one kernel call); False: the
# reference path (determinize, live_states, minimize), for the tests
PREMINIMIZE = True


def _rule_key(name: str, body: Expr, rule_index: dict[str, int]) -> tuple | None:
    """What a rule's DFA depends on when none of its references is inlined: its body and
    the call numbering of the rules it refers to (None if it inlines some rule)."""
    refs = body._refs
    if any(r not in rule_index for r in refs):
        return None
    return ("rule", body, tuple(sorted((r, rule_index[r]) for r in refs)))


def _compile(
    grammar: Grammar,
    limits: Limits,
    call_above: int | None,
    deadline: float,
    memo: DFAMemo | None = SHARED_DFAS,
    count_above: int | None = None,
    skipped: list[int] | None = None,
    hoist: bool = False,
) -> Automaton:
    """One attempt of :func:`compile_grammar`. ``count_above``: count repetitions whose
    copies would exceed this many states (None: :data:`~.counted.COUNT_MIN_STATES`;
    negative: none); ``skipped`` gets the number of countable ones left to copy; ``hoist``:
    big repeated items become called rules (:func:`~.hoist.hoist_repeated`)."""
    rules = dict(grammar.rules)
    if grammar.start not in rules:
        raise ConstraintError(f"start rule {grammar.start!r} is not defined")
    hoisted = hoist_repeated(rules, grammar.start, limits.max_inline_size, deadline) if hoist else []
    regions: dict[str, ct.Region] = {}
    if (count_above is None or count_above >= 0) and any(b._long for b in rules.values()):
        # long repetitions of countable items: counters
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 20_000))
        try:
            regions = ct.extract_counted(
                rules, limits, deadline, ct.COUNT_MIN_STATES if count_above is None else count_above, skipped
            )
        except RecursionError:
            raise ConstraintTooComplex("constraint is nested too deeply to compile") from None
        finally:
            sys.setrecursionlimit(old_limit)
    graph = {name: ir.refs(body) for name, body in rules.items()}
    for name, deps in graph.items():
        for d in deps:
            if d not in rules:
                raise ConstraintError(f"rule {name!r} refers to undefined rule {d!r}")
    # Rules reachable from start only.
    reach, work = {grammar.start}, [grammar.start]
    while work:
        for d in graph[work.pop()]:
            if d not in reach:
                reach.add(d)
                work.append(d)
    graph = {n: graph[n] for n in rules if n in reach}
    rules = {n: rules[n] for n in graph}

    recursive: set[str] = set()
    for comp in _strongly_connected(graph):
        if len(comp) > 1 or comp[0] in graph[comp[0]]:
            recursive.update(comp)
    for name in recursive:
        rules[name] = _rewrite_direct_left_recursion(name, rules[name])
    graph = {name: ir.refs(body) for name, body in rules.items()}
    recursive = set()
    for comp in _strongly_connected(graph):
        if len(comp) > 1 or comp[0] in graph[comp[0]]:
            recursive.update(comp)
    # Large rules referenced more than once stay rules too (inlining would copy them).
    ref_count: dict[str, int] = {}
    for deps in graph.values():
        for d in deps:
            ref_count[d] = ref_count.get(d, 0) + 1
    # (a region or hoisted item of a rule the start does not reach is not compiled)
    called = set(recursive) | {grammar.start} | (set(regions) & reach) | (set(hoisted) & reach)
    for name, n in ref_count.items():
        if n > 1 and ir.size(rules[name]) > limits.max_inline_size:
            called.add(name)
        elif call_above is not None and ir.size(rules[name]) > call_above:
            called.add(name)
    if regions and grammar.start in recursive:
        # counters are kept in the bottom frame of a stack: the start rule's (repetitions unrolled)
        return _uncounted(grammar, limits, call_above, deadline, memo, count_above, hoist)
    order = [grammar.start] + sorted(called - {grammar.start})
    rule_index = {name: i for i, name in enumerate(order)}

    alphabet = Alphabet(ir.collect_masks(rules, order, called))
    cls, reps = alphabet.cls, alphabet.reps
    # the start rule is the constraint's own: only the rules it calls are worth sharing
    keys = [
        None if name == grammar.start or name in regions else _rule_key(name, rules[name], rule_index)
        for name in order
    ]
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 20_000))
    name = grammar.start
    try:
        raw = []
        pre: dict[int, RawDFA] = {}  # rules without calls: minimal DFAs already
        dfa_memo: dict = {}
        for name, key in zip(order, keys):
            if name in regions:
                raw.append(ct.region_dfa(regions[name], alphabet))
                continue
            shared = memo is not None and key is not None
            if shared and PREMINIMIZE:  # (a rule calling none is kept minimal: see below)
                d = memo.get(("call-free", key), alphabet, limits)
                if d is not None:
                    pre[len(raw)] = d
                    raw.append(d)
                    continue
            d = memo.get(key, alphabet, limits) if shared else None
            if d is None:
                nfa = NFA(limits, deadline, alphabet)
                builder = FragmentBuilder(nfa, rules, rule_index, dfa_memo, memo)
                s0 = nfa.new()
                end = builder.build(rules[name], s0)
                if not nfa.call and PREMINIMIZE:
                    # a rule calling none: its minimal DFA in one kernel call (the DFA that
                    # determinize, live_states and minimize below make of it), kept apart
                    # from the determinized DFAs of rules that call: a hit must be known
                    # to be minimal (the productive rules are read off it: an empty one
                    # has no state)
                    d = pre[len(raw)] = minimal_dfa(nfa, s0, end)
                    if shared:
                        memo.put(("call-free", key), cls, d, limits)
                    raw.append(d)
                    continue
                d = determinize(nfa, s0, end, cls, reps, limits)
                if shared:
                    memo.put(key, cls, d, limits)
            raw.append(d)
    except RecursionError:
        err = ConstraintTooComplex("constraint is nested too deeply to compile")
        err.rule = name
        raise err from None
    except ConstraintError as err:
        if err.rule is None:
            err.rule = name  # (the compiler turns the rule into a location)
        raise
    finally:
        sys.setrecursionlimit(old_limit)

    # Productive rules: those that derive at least one finite string.
    productive: set[int] = {i for i, d in pre.items() if len(d.accepting)}
    lives: dict[int, tuple[frozenset, np.ndarray]] = {}  # rule -> (its productive callees, live states)
    # callees before their callers: a rule's live states are then mostly found once, with
    # its callees' productivity settled, and kept for its minimisation below
    sequence = [i for i in _callees_first(raw) if i not in pre]
    changed = True
    while changed:
        changed = False
        for i in sequence:
            if i in productive:
                continue
            dfa = raw[i]
            live = live_states(dfa, productive)
            lives[i] = (_callees(dfa) & frozenset(productive), live)
            if live[0]:
                productive.add(i)
                changed = True
    if 0 not in productive:
        bad = [order[i] for i in range(len(order)) if i not in productive]
        raise ConstraintError(
            "the constraint matches no finite output (unsatisfiable, or recursion with no base case"
            f" in {', '.join(repr(b) for b in bad)})"
        )
    dfas = {i: pre[i] for i in productive if i in pre}
    for i in productive - set(dfas):
        if order[i] in regions:  # its states carry ticks (see .counted): as built
            dfas[i] = raw[i]
            continue
        key = (
            None
            if keys[i] is None or memo is None
            else ("minimal", keys[i], tuple(sorted(j for _, j in keys[i][2] if j in productive)))
        )
        d = memo.get(key, alphabet, limits) if key is not None else None
        if d is None:
            kept = lives.get(i)  # (live states depend only on which callees are productive)
            if kept is not None and kept[0] == _callees(raw[i]) & frozenset(productive):
                live = kept[1]
            else:
                live = live_states(raw[i], productive)
            d = minimize(raw[i], live, productive)
            if key is not None:
                memo.put(key, cls, d, limits)
        dfas[i] = d
    _check_left_recursion(dfas, order)

    offsets: dict[int, int] = {}
    total = 0
    for i in sorted(dfas):
        offsets[i] = total
        total += len(dfas[i].accepting)
    if total > limits.max_dfa_states:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states",
            bound="max_dfa_states",
        )
    n_classes = len(reps)
    table = np.full((total, n_classes), -1, dtype=np.int32)
    accepting = np.zeros(total, dtype=bool)
    calls: list[tuple[tuple[int, int], ...]] = []
    for i in sorted(dfas):
        d, off = dfas[i], offsets[i]
        n = len(d.accepting)
        table[off : off + n] = np.where(d.table >= 0, d.table + off, -1)
        accepting[off : off + n] = d.accepting
        src, rule, dst = call_edge_arrays(d)
        here = [()] * n
        for s, r, t in zip(src.tolist(), rule.tolist(), dst.tolist()):
            here[s] += ((offsets[r], t + off),)
        calls.extend(here)
    if not any(name in regions for name in order):
        return Automaton(table, cls, accepting, calls, offsets[0], order)
    spans = {offsets[i]: (dfas[i], regions[order[i]]) for i in dfas if order[i] in regions}
    try:
        table, accepting, calls, start_state, counters = ct.inline_regions(
            table, accepting, calls, offsets[0], spans, offsets[0] + len(dfas[0].accepting)
        )
    except ct.NotCounted:  # a repetition in a called rule, or one that cannot be counted exactly
        return _uncounted(grammar, limits, call_above, deadline, memo, count_above, hoist)
    if len(accepting) > limits.max_dfa_states:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states",
            bound="max_dfa_states",
        )
    return Automaton(table, cls, accepting, calls, start_state, order, counters)


def _callees(d) -> frozenset:
    """The rules a DFA calls."""
    return frozenset(call_edge_arrays(d)[1].tolist())


def _callees_first(raw: list) -> list[int]:
    """Rule indices of ``raw`` (DFAs with call edges), each after the rules it calls where
    the calls form no cycle: a depth-first post-order from rule 0, then the rules it does not
    reach, in index order."""
    out: list[int] = []
    seen = {0}
    stack = [(0, iter(sorted(_callees(raw[0]))))]
    while stack:
        i, rest = stack[-1]
        for j in rest:
            if j not in seen and j < len(raw):
                seen.add(j)
                stack.append((j, iter(sorted(_callees(raw[j])))))
                break
        else:
            stack.pop()
            out.append(i)
    out += [i for i in range(len(raw)) if i not in seen]
    return out


def _uncounted(
    grammar: Grammar,
    limits: Limits,
    call_above: int | None,
    deadline: float,
    memo: DFAMemo | None,
    count_above: int | None,
    hoist: bool = False,
) -> Automaton:
    """The attempt again with every repetition unrolled; on the retry that counts every
    countable repetition (``count_above == 0``), the first attempt did that already."""
    if count_above == 0 and call_above is None:
        raise ConstraintTooComplex("counted repetitions cannot be kept exactly here")
    return _compile(grammar, limits, call_above, deadline, memo, count_above=-1, hoist=hoist)


def _calls_by_state(d) -> tuple[np.ndarray, list[int], list[int]]:
    """A DFA's call edges as CSR: state s's are rule[ptr[s]:ptr[s + 1]], dst[...]."""
    src, rule, dst = call_edge_arrays(d)
    if len(src) > 1 and (src[1:] < src[:-1]).any():
        order = np.argsort(src, kind="stable")
        src, rule, dst = src[order], rule[order], dst[order]
    ptr = np.searchsorted(src, np.arange(len(d.accepting) + 1))
    return ptr, rule.tolist(), dst.tolist()


def _check_left_recursion(dfas: dict, order: list[str]) -> None:
    """Reject grammars where a rule can call itself before reading a byte."""
    by_state = {i: _calls_by_state(d) for i, d in dfas.items()}
    nullable: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, d in dfas.items():
            if i in nullable:
                continue
            ptr, rule, dst = by_state[i]
            seen, work = {0}, [0]
            while work:
                s = work.pop()
                if d.accepting[s]:
                    nullable.add(i)
                    changed = True
                    break
                for j in range(ptr[s], ptr[s + 1]):
                    r, t = rule[j], dst[j]
                    if r in nullable and t not in seen:
                        seen.add(t)
                        work.append(t)
    left: dict[int, set[int]] = {}
    for i in dfas:
        ptr, rule, dst = by_state[i]
        callees: set[int] = set()
        seen, work = {0}, [0]
        while work:
            s = work.pop()
            for j in range(ptr[s], ptr[s + 1]):
                r, t = rule[j], dst[j]
                callees.add(r)
                if r in nullable and t not in seen:
                    seen.add(t)
                    work.append(t)
        left[i] = callees
    names = {str(i): i for i in dfas}
    graph = {str(i): {str(j) for j in left[i] if j in dfas} for i in dfas}
    for comp in _strongly_connected(graph):
        if len(comp) > 1 or comp[0] in graph[comp[0]]:
            cyc = " -> ".join(order[names[c]] for c in comp)
            raise ConstraintError(
                f"left recursion is not supported (rules {cyc}); rewrite it with repetition"
            )
