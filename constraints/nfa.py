"""IR expression → byte NFA (Thompson) → minimal DFA.

The alphabet is bytes (grouped into equivalence classes) plus *call* symbols: a ``Ref``
to a rule that stays a rule of its own (recursive or large) is an edge labelled with
that rule; the pushdown matcher in :mod:`automaton` follows it. Everything else is
inlined, so a non-recursive constraint becomes one DFA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import chain

import numpy as np

from .dfa_kernels import determinize_kernel, hopcroft
from .errors import ConstraintError, ConstraintTooComplex
from .ir import Alt, And, ByteSet, Diff, Expr, Ref, Repeat, Seq


@dataclass
class Limits:
    """Bounds that keep untrusted constraints from eating the machine."""

    max_nfa_states: int = 400_000
    max_dfa_states: int = 60_000
    max_seconds: float = 10.0
    max_inline_size: int = 4_000  # IR nodes of a shared rule above which it is not inlined


class NFA:
    """A Thompson NFA. ``eps[s]``: epsilon targets; ``byte_edges[s]``: (mask, target);
    ``call_edges[s]``: (rule index, target)."""

    def __init__(self, limits: Limits, deadline: float) -> None:
        self.eps: list[list[int]] = []
        self.byte_edges: list[list[tuple[int, int]]] = []
        self.call_edges: list[list[tuple[int, int]]] = []
        self.limits = limits
        self.deadline = deadline

    def new(self) -> int:
        n = len(self.eps)
        if n >= self.limits.max_nfa_states:
            raise ConstraintTooComplex(
                f"constraint is too large: its automaton exceeds {self.limits.max_nfa_states:,} NFA states"
            )
        self.eps.append([])
        self.byte_edges.append([])
        self.call_edges.append([])
        return n


class _Spliced:
    """An item already determinised (built by splicing its DFA)."""

    __slots__ = ("dfa",)

    def __init__(self, dfa: RawDFA) -> None:
        self.dfa = dfa


SPLICE_MIN_SIZE = 300  # IR nodes: larger Ref-free sub-expressions are determinised once


class FragmentBuilder:
    """Builds NFA fragments for expressions; non-rule refs are inlined.

    A large Ref-free sub-expression is compiled once to a minimal DFA (memoised by the
    expression, which hashes in O(1)) and spliced in: repeated sub-expressions — a
    JSON string, a key complement, a Unicode class — cost their size once, and the
    subsets of the outer construction stay small.
    """

    def __init__(self, nfa: NFA, rules: dict[str, Expr], rule_index: dict[str, int],
                 cls: np.ndarray | None = None, reps: list[int] | None = None,
                 dfa_memo: dict | None = None) -> None:
        self.nfa = nfa
        self.rules = rules
        self.rule_index = rule_index  # rules that are called, not inlined
        self._inlining: list[str] = []
        self.cls = cls
        self.reps = reps
        self.dfa_memo = dfa_memo if dfa_memo is not None else {}
        self._ref_free: dict[int, bool] = {}
        if cls is not None and reps is not None:
            self.class_masks = [0] * len(reps)
            for b in range(256):
                self.class_masks[int(cls[b])] |= 1 << b

    def ref_free(self, e: Expr) -> bool:
        hit = self._ref_free.get(id(e))
        if hit is None:
            if isinstance(e, Ref):
                hit = False
            elif isinstance(e, (Seq, Alt, And, Diff)):
                hit = all(self.ref_free(i) for i in e.items)
            elif isinstance(e, Repeat):
                hit = self.ref_free(e.item)
            else:
                hit = True
            self._ref_free[id(e)] = hit
        return hit

    def build(self, e: Expr, start: int, splice: bool = True) -> int:
        """Add ``e`` starting at ``start``; return its end state."""
        nfa = self.nfa
        if isinstance(e, (And, Diff)):
            if self.cls is None or not self.ref_free(e):
                raise ConstraintError("intersection and difference apply to regular parts only (no rule references)")
            return self._splice(self._sub_dfa(e), start)
        if (splice and self.cls is not None and e._size >= SPLICE_MIN_SIZE
                and not isinstance(e, (Ref, ByteSet)) and self.ref_free(e)):
            return self._splice(self._sub_dfa(e), start)
        if isinstance(e, ByteSet):
            end = nfa.new()
            if e.mask:
                nfa.byte_edges[start].append((e.mask, end))
            return end
        if isinstance(e, Seq):
            cur = start
            for it in e.items:
                cur = self.build(it, cur)
            return cur
        if isinstance(e, Alt):
            end = nfa.new()
            for it in e.items:
                s = nfa.new()
                nfa.eps[start].append(s)
                nfa.eps[self.build(it, s)].append(end)
            return end
        if isinstance(e, Repeat):
            return self._repeat(e, start)
        if isinstance(e, Ref):
            if e.name in self.rule_index:
                end = nfa.new()
                nfa.call_edges[start].append((self.rule_index[e.name], end))
                return end
            if e.name not in self.rules:
                raise ConstraintError(f"reference to undefined rule {e.name!r}")
            if e.name in self._inlining:  # cannot happen for a correct rule_index
                raise ConstraintError(f"rule {e.name!r} refers to itself")
            if time.monotonic() > nfa.deadline:
                raise ConstraintTooComplex("constraint took too long to compile")
            self._inlining.append(e.name)
            try:
                return self.build(self.rules[e.name], start)
            finally:
                self._inlining.pop()
        raise TypeError(f"not an IR expression: {e!r}")

    def _sub_dfa(self, e: Expr) -> RawDFA:
        d = self.dfa_memo.get(e)
        if d is None and isinstance(e, (And, Diff)):
            parts = [self._sub_dfa(i) for i in e.items]
            d = parts[0]
            for other in parts[1:]:
                d = product(d, other, "diff" if isinstance(e, Diff) else "and", self.nfa.limits,
                            self.nfa.deadline)
            self.dfa_memo[e] = d
        if d is None:
            sub = NFA(self.nfa.limits, self.nfa.deadline)
            fb = FragmentBuilder(sub, self.rules, self.rule_index, self.cls, self.reps, self.dfa_memo)
            fb._ref_free = self._ref_free
            s0 = sub.new()
            end = fb.build(e, s0, splice=False)
            raw = determinize(sub, s0, end, self.cls, self.reps, self.nfa.limits)
            d = minimize(raw, live_states(raw, set()), set(), self.nfa.deadline)
            self.dfa_memo[e] = d
        return d

    def _splice(self, d: RawDFA, start: int) -> int:
        nfa = self.nfa
        end = nfa.new()
        n = len(d.accepting)
        if n == 0:
            return end  # empty language: nothing reaches end
        base0 = len(nfa.eps)
        for _ in range(n):
            nfa.new()
        nfa.eps[start].append(base0)
        for q, edges in enumerate(self._edge_lists(d)):
            nfa.byte_edges[base0 + q].extend((m, base0 + t) for m, t in edges)
            if d.accepting[q]:
                nfa.eps[base0 + q].append(end)
        return end

    def _edge_lists(self, d: RawDFA) -> list[list[tuple[int, int]]]:
        """Per DFA state, (byte mask, target) pairs: computed once per spliced DFA."""
        hit = getattr(d, "_edges", None)
        if hit is None:
            cm = self.class_masks
            hit = []
            for row in d.table.tolist():
                by_target: dict[int, int] = {}
                for c, t in enumerate(row):
                    if t >= 0:
                        by_target[t] = by_target.get(t, 0) | cm[c]
                hit.append([(m, t) for t, m in by_target.items()])
            d._edges = hit
        return hit

    def _repeat(self, e: Repeat, start: int) -> int:
        nfa = self.nfa
        cur = start
        copies = max(e.min, e.max or 0)
        if (copies >= 4 and self.cls is not None and not isinstance(e.item, ByteSet)
                and self.ref_free(e.item)):
            # many copies: determinise the item once and splice its (small) DFA per copy
            d = self._sub_dfa(e.item)
            item = _Spliced(d)
        else:
            item = e.item
        if e.max is None and e.min >= 1:
            # x{m,} = x{m-1} x+, with x+ one copy of x looping back to its own start
            for _ in range(e.min - 1):
                cur = self._build_item(item, cur)
            loop = nfa.new()
            nfa.eps[cur].append(loop)
            body_end = self._build_item(item, loop)
            nfa.eps[body_end].append(loop)
            return body_end
        for _ in range(e.min):
            cur = self._build_item(item, cur)
        if e.max is None:
            loop = nfa.new()
            nfa.eps[cur].append(loop)
            body_end = self._build_item(item, loop)
            nfa.eps[body_end].append(loop)
            return loop
        end = nfa.new()
        for _ in range(e.max - e.min):
            nfa.eps[cur].append(end)
            cur = self._build_item(item, cur)
        nfa.eps[cur].append(end)
        return end


    def _build_item(self, item, start: int) -> int:
        if isinstance(item, _Spliced):
            return self._splice(item.dfa, start)
        return self.build(item, start)


def byte_classes(masks: set[int]) -> tuple[np.ndarray, list[int]]:
    """Partition 0..255 by membership in every mask.

    Returns ``cls`` (byte → class id, uint16 [256]) and, per mask in ``masks`` order of
    the returned list, nothing else; use :func:`mask_classes` to map masks to class sets.
    """
    sig: dict[int, list[int]] = {}
    mask_list = sorted(masks)
    keys = [0] * 256
    for k, m in enumerate(mask_list):
        bit = 1 << k
        b = 0
        mm = m
        while mm:
            if mm & 1:
                keys[b] |= bit
            mm >>= 1
            b += 1
    cls = np.zeros(256, dtype=np.int32)
    reps: list[int] = []
    for b in range(256):
        key = keys[b]
        if key not in sig:
            sig[key] = [len(reps)]
            reps.append(b)
        cls[b] = sig[key][0]
    return cls, reps


def mask_classes(mask: int, cls: np.ndarray, reps: list[int]) -> list[int]:
    """The class ids a byte mask covers (every byte of a class behaves alike)."""
    return [c for c, b in enumerate(reps) if (mask >> b) & 1]


@dataclass
class RawDFA:
    """A DFA over byte classes with call edges; state 0 is the start; -1 is dead."""

    table: np.ndarray  # int32 [n, n_classes]
    accepting: np.ndarray  # bool [n]
    calls: list[list[tuple[int, int]]]  # per state: (rule index, target state)


def determinize(
    nfa: NFA, start: int, accept: int, cls: np.ndarray, reps: list[int], limits: Limits
) -> RawDFA:
    """Subset construction over byte classes and call symbols (numba kernel,
    :func:`~.dfa_kernels.determinize_kernel`; :func:`_determinize_reference` says the same
    in Python)."""
    n_classes = len(reps)
    n = len(nfa.eps)
    eps_ptr, eps_idx = _csr(nfa.eps)
    edges = list(chain.from_iterable(nfa.byte_edges))
    masks = [m for m, _ in edges]
    mask_ids = {m: i for i, m in enumerate(dict.fromkeys(masks))}
    class_lists = [mask_classes(m, cls, reps) for m in mask_ids]
    m_ptr = np.zeros(len(class_lists) + 1, dtype=np.int64)
    m_ptr[1:] = np.cumsum([len(c) for c in class_lists])
    m_cls = np.fromiter(chain.from_iterable(class_lists), np.int64, int(m_ptr[-1]))
    e_ptr = np.zeros(n + 1, dtype=np.int64)
    e_ptr[1:] = np.cumsum([len(x) for x in nfa.byte_edges])
    e_mask = np.fromiter(map(mask_ids.__getitem__, masks), np.int64, len(edges))
    e_dst = np.fromiter((t for _, t in edges), np.int64, len(edges))
    calls = list(chain.from_iterable(nfa.call_edges))
    c_ptr = np.zeros(n + 1, dtype=np.int64)
    c_ptr[1:] = np.cumsum([len(x) for x in nfa.call_edges])
    c_rule = np.fromiter((r for r, _ in calls), np.int64, len(calls))
    c_dst = np.fromiter((t for _, t in calls), np.int64, len(calls))
    important = (np.diff(e_ptr) > 0) | (np.diff(c_ptr) > 0)
    important[accept] = True
    left = nfa.deadline - time.monotonic()
    if left <= 0:
        raise ConstraintTooComplex("constraint took too long to compile (DFA construction)")
    status, table, accepting, call_src, call_rule, call_dst = determinize_kernel(
        eps_ptr, eps_idx, important, e_ptr, e_mask, e_dst, m_ptr, m_cls, c_ptr, c_rule, c_dst,
        start, accept, n_classes, limits.max_dfa_states, int(min(left, 1e6) * WORK_PER_SECOND))
    if status == 1:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states"
        )
    if status == 2:
        raise ConstraintTooComplex("constraint took too long to compile (DFA construction)")
    out_calls: list[list[tuple[int, int]]] = [[] for _ in range(len(accepting))]
    for s, r, t in zip(call_src.tolist(), call_rule.tolist(), call_dst.tolist()):
        out_calls[s].append((r, t))
    return RawDFA(np.ascontiguousarray(table), accepting.copy(), out_calls)


WORK_PER_SECOND = 50_000_000  # (symbol, target) pairs the kernel examines per second, about


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    return ptr, np.fromiter(chain.from_iterable(lists), np.int64, int(ptr[-1]))


def _determinize_reference(
    nfa: NFA, start: int, accept: int, cls: np.ndarray, reps: list[int], limits: Limits
) -> RawDFA:
    """Subset construction in Python: the reference :func:`determinize` is tested against."""
    n_classes = len(reps)
    mask_cache: dict[int, list[int]] = {}

    eps = nfa.eps
    important = [bool(nfa.byte_edges[s] or nfa.call_edges[s]) for s in range(len(eps))]
    important[accept] = True
    single: dict[int, frozenset[int]] = {}

    def closure_of(s0: int) -> frozenset[int]:
        """Important states reachable from ``s0`` by epsilon moves (memoised)."""
        hit = single.get(s0)
        if hit is not None:
            return hit
        seen = {s0}
        work = [s0]
        while work:
            s = work.pop()
            for t in eps[s]:
                if t not in seen:
                    seen.add(t)
                    work.append(t)
        hit = frozenset(s for s in seen if important[s])
        single[s0] = hit
        return hit

    def closure(states) -> frozenset[int]:
        if len(states) == 1:
            for s in states:
                return closure_of(s)
        out: set[int] = set()
        for s in states:
            out |= closure_of(s)
        return frozenset(out)

    start_set = closure({start})
    index: dict[frozenset[int], int] = {start_set: 0}
    sets = [start_set]

    def intern(key: frozenset[int]) -> int:
        """The DFA state of an NFA subset (a new one if unseen, within the bound)."""
        j = index.get(key)
        if j is None:
            j = len(sets)
            if j >= limits.max_dfa_states:
                raise ConstraintTooComplex(
                    f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states"
                )
            index[key] = j
            sets.append(key)
        return j

    def classes_of(m: int) -> list[int]:
        cs = mask_cache.get(m)
        if cs is None:
            cs = mask_classes(m, cls, reps)
            mask_cache[m] = cs
        return cs
    rows: list[list[int]] = []
    accepting: list[bool] = []
    calls: list[list[tuple[int, int]]] = []
    i = 0
    deadline = nfa.deadline
    while i < len(sets):
        if (i & 255) == 0 and time.monotonic() > deadline:
            raise ConstraintTooComplex("constraint took too long to compile (DFA construction)")
        cur = sets[i]
        by_class: dict[int, set[int]] = {}
        by_call: dict[int, set[int]] = {}
        if len(cur) == 1:
            # one NFA state (the common case inside spliced DFAs): its edges have
            # disjoint masks only if it came from a DFA; check, then fill the row per edge
            (s_only,) = cur
            edges = nfa.byte_edges[s_only]
            union = 0
            disjoint = True
            for m, _ in edges:
                if union & m:
                    disjoint = False
                    break
                union |= m
            if disjoint and not nfa.call_edges[s_only]:
                row = [-1] * n_classes
                for m, t in edges:
                    j = intern(closure_of(t))
                    for c in classes_of(m):
                        row[c] = j
                rows.append(row)
                accepting.append(accept in cur)
                calls.append([])
                i += 1
                continue
        for s in cur:
            for m, t in nfa.byte_edges[s]:
                for c in classes_of(m):
                    tgt = by_class.get(c)
                    if tgt is None:
                        by_class[c] = {t}
                    else:
                        tgt.add(t)
            for r, t in nfa.call_edges[s]:
                by_call.setdefault(r, set()).add(t)
        row = [-1] * n_classes
        for c, tgt in by_class.items():
            row[c] = intern(closure(tgt))
        call_row = []
        for r, tgt in sorted(by_call.items()):
            j = intern(closure(tgt))
            call_row.append((r, j))
        rows.append(row)
        accepting.append(accept in cur)
        calls.append(call_row)
        i += 1
    table = np.array(rows, dtype=np.int32).reshape(len(rows), n_classes)
    return RawDFA(table, np.array(accepting, dtype=bool), calls)


def live_states(dfa: RawDFA, productive_rules: set[int]) -> np.ndarray:
    """States from which an accepting state is reachable (calls only to productive rules)."""
    n = len(dfa.accepting)
    if n == 0:
        return dfa.accepting.copy()
    n_classes = dfa.table.shape[1]
    src = np.repeat(np.arange(n, dtype=np.int64), n_classes)
    dst = dfa.table.reshape(-1).astype(np.int64)
    extra = [(s, t) for s in range(n) for r, t in dfa.calls[s] if r in productive_rules]
    if extra:
        e = np.array(extra, dtype=np.int64)
        src, dst = np.concatenate([src, e[:, 0]]), np.concatenate([dst, e[:, 1]])
    keep = dst >= 0
    pairs = np.unique(dst[keep] * n + src[keep])  # reverse edges, grouped by target
    rt, rs = pairs // n, pairs % n
    ptr = np.searchsorted(rt, np.arange(n + 1)).tolist()
    preds = rs.tolist()
    live = dfa.accepting.copy()
    work = np.nonzero(live)[0].tolist()
    lv = live.tolist()
    while work:
        t = work.pop()
        for k in range(ptr[t], ptr[t + 1]):
            s = preds[k]
            if not lv[s]:
                lv[s] = True
                work.append(s)
    return np.array(lv, dtype=bool)


def minimize(dfa: RawDFA, live: np.ndarray, productive_rules: set[int], deadline: float | None = None) -> RawDFA:
    """Merge equivalent states (Hopcroft, :func:`equivalent_blocks`); drop dead states.
    Start stays state 0.

    Returns a DFA whose states are all live (dead transitions are -1). If the start
    state is dead the result has zero states.
    """
    n, n_classes = dfa.table.shape
    if not live[0]:
        return RawDFA(np.zeros((0, n_classes), np.int32), np.zeros(0, bool), [])
    dead = n
    table = np.where(dfa.table < 0, dead, dfa.table)
    table = np.where(np.append(live, False)[table], table, dead)
    table = np.vstack([table, np.full((1, n_classes), dead, dtype=table.dtype)])
    calls = [[(r, t) for r, t in dfa.calls[s] if r in productive_rules and live[t]] for s in range(n)]
    calls.append([])
    acc = np.append(dfa.accepting & live, False)
    block = acc.astype(np.int64)
    block[:n][~live] = -1  # dead states in their own block with the sink
    block[dead] = -1
    _, block = np.unique(block, return_inverse=True)  # labels 0..k-1 (dead included)
    block = block.reshape(-1).astype(np.int64)
    block = equivalent_blocks(table, calls, block, dead)
    block[:n][~live] = block[dead]  # never reached from a live state: with the dead sink
    n_blocks = int(block.max()) + 1
    # renumber: blocks reachable from the start, in BFS order (start first)
    dead_block = int(block[dead])
    live_blocks, first = np.unique(block[:n], return_index=True)
    rep_of = np.full(n_blocks, -1, dtype=np.int64)
    rep_of[live_blocks] = first
    bt = block[table[np.maximum(rep_of, 0)]]  # [n_blocks, C] block graph
    src = np.repeat(np.arange(n_blocks, dtype=np.int64), n_classes)
    dst = bt.reshape(-1)
    cext = [(int(block[s_]), int(block[t])) for s_ in range(n) for _, t in calls[s_]]
    if cext:
        e = np.array(cext, dtype=np.int64)
        src, dst = np.concatenate([src, e[:, 0]]), np.concatenate([dst, e[:, 1]])
    keep = (dst != dead_block) & (rep_of[src] >= 0)
    pairs = np.unique(src[keep] * n_blocks + dst[keep])
    es, et = pairs // n_blocks, pairs % n_blocks
    ptr = np.searchsorted(es, np.arange(n_blocks + 1)).tolist()
    succ = et.tolist()
    start_block = int(block[0])
    order: dict[int, int] = {start_block: 0}
    queue = [start_block]
    k = 0
    while k < len(queue):
        b = queue[k]
        k += 1
        for j in range(ptr[b], ptr[b + 1]):
            c = succ[j]
            if c not in order:
                order[c] = len(queue)
                queue.append(c)
    reps = [int(rep_of[b]) for b in queue]
    block_to_new = np.full(n_blocks, -1, dtype=np.int32)
    for b, i in order.items():
        block_to_new[b] = i
    rep_arr = np.array(reps, dtype=np.int64)
    new_table = block_to_new[block[table[rep_arr]]].astype(np.int32)
    new_acc = acc[rep_arr].copy()
    new_calls = [sorted({(r, int(block_to_new[block[t]])) for r, t in calls[s]}) for s in reps]
    return RawDFA(new_table, new_acc, new_calls)


def _moore_blocks(table: np.ndarray, acc: np.ndarray, calls: list, block: np.ndarray) -> np.ndarray:
    """Reference equivalence: Moore partition refinement over the whole DFA (rounds grow
    with the longest chain of states, so slow for counted repetitions)."""
    n1, n_classes = table.shape
    n_blocks = int(block.max()) + 1
    coef = np.random.default_rng(12345).integers(1, 2**61, size=(2, n_classes + 2), dtype=np.int64) | 1
    while True:
        call_sig = np.zeros(n1, dtype=np.int64)
        for s in range(n1):
            if calls[s]:
                call_sig[s] = hash(tuple(sorted((r, int(block[t])) for r, t in calls[s]))) & 0x7FFFFFFFFFFF
        new_block = _partition(np.column_stack([block, call_sig, block[table]]), coef)
        count = int(new_block.max()) + 1
        if count == n_blocks:
            return block
        block, n_blocks = new_block, count




def equivalent_blocks(table: np.ndarray, calls: list, init: np.ndarray, dead: int) -> np.ndarray:
    """Block of each state of a complete DFA (``table`` int [n, C], a dead sink included)
    whose call edges ``calls[s]`` = [(rule, target)] act as extra symbols (missing: ``dead``),
    refining the labels ``init``: states share a block iff they are equivalent (:func:`~.dfa_kernels.hopcroft`)."""
    n = table.shape[0]
    _, init = np.unique(init, return_inverse=True)
    rules = sorted({r for cs in calls for r, _ in cs})
    ext = table.astype(np.int64)
    if rules:
        col = {r: j for j, r in enumerate(rules)}
        extra = np.full((n, len(rules)), dead, dtype=np.int64)
        for s, cs in enumerate(calls):
            for r, t in cs:
                extra[s, col[r]] = t
        ext = np.hstack([ext, extra])
    return hopcroft(np.ascontiguousarray(ext), init.reshape(-1).astype(np.int64))


def _partition(sig: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Block ids of equal rows of ``sig``: two 64-bit row hashes, then an exact check
    (falls back to sorting whole rows in the astronomically rare collision)."""
    h = np.stack([(sig * c).sum(axis=1) for c in coef], axis=1)  # wrapping int64 arithmetic
    _, first, inv = np.unique(h[:, 0] ^ (h[:, 1] * np.int64(0x9E3779B97F4A7C15 - 2**64)),
                              return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if (sig == sig[first[inv]]).all():
        return inv.astype(np.int64)
    _, inv = np.unique(sig, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def product(d1: RawDFA, d2: RawDFA, mode: str, limits: Limits, deadline: float) -> RawDFA:
    """Product of two call-free DFAs over the same classes: ``"and"`` (both accept) or
    ``"diff"`` (``d1`` accepts, ``d2`` does not). Returns it minimised."""
    n_classes = d1.table.shape[1]
    if len(d1.accepting) == 0:
        return d1
    t1 = d1.table.tolist()
    t2 = d2.table.tolist() if len(d2.accepting) else []
    index = {(0, 0 if t2 else -1): 0}
    pairs = [(0, 0 if t2 else -1)]
    rows: list[list[int]] = []
    acc: list[bool] = []
    i = 0
    while i < len(pairs):
        if (i & 255) == 0 and time.monotonic() > deadline:
            raise ConstraintTooComplex("constraint took too long to compile (intersection)")
        p, q = pairs[i]
        i += 1
        row = [-1] * n_classes
        rp = t1[p]
        rq = t2[q] if q >= 0 else None
        for c in range(n_classes):
            p2 = rp[c]
            if p2 < 0:
                continue
            q2 = rq[c] if rq is not None else -1
            if q2 < 0 and mode == "and":
                continue
            key = (p2, q2)
            j = index.get(key)
            if j is None:
                j = len(pairs)
                if j >= limits.max_dfa_states:
                    raise ConstraintTooComplex(
                        f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states"
                    )
                index[key] = j
                pairs.append(key)
            row[c] = j
        rows.append(row)
        a1 = bool(d1.accepting[p])
        a2 = q >= 0 and bool(d2.accepting[q])
        acc.append(a1 and a2 if mode == "and" else a1 and not a2)
    raw = RawDFA(np.array(rows, dtype=np.int32).reshape(len(rows), n_classes), np.array(acc, dtype=bool),
                 [[] for _ in rows])
    return minimize(raw, live_states(raw, set()), set(), deadline)
