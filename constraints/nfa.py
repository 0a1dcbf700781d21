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

from .dfa_kernels import determinize_kernel, hopcroft, live_kernel, minimize_kernel, product_kernel
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
    """A Thompson NFA as flat edge lists: epsilon edges ``eps_src[i] -> eps_dst[i]``, byte
    edges ``byte_src[i] --byte_mask[i]--> byte_dst[i]``, call edges ``call_src[i]
    --call_rule[i]--> call_dst[i]``, and spliced DFAs' edges in ``chunks``: arrays (src,
    byte class, dst), one class per edge."""

    def __init__(self, limits: Limits, deadline: float) -> None:
        self.n = 0
        self.eps_src: list[int] = []
        self.eps_dst: list[int] = []
        self.byte_src: list[int] = []
        self.byte_mask: list[int] = []
        self.byte_dst: list[int] = []
        self.call_src: list[int] = []
        self.call_rule: list[int] = []
        self.call_dst: list[int] = []
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.limits = limits
        self.deadline = deadline

    def new(self, count: int = 1) -> int:
        """Add ``count`` states; return the first."""
        n = self.n
        if n + count > self.limits.max_nfa_states:
            raise ConstraintTooComplex(
                f"constraint is too large: its automaton exceeds {self.limits.max_nfa_states:,} NFA states"
            )
        self.n = n + count
        return n

    def add_eps(self, s: int, t: int) -> None:
        self.eps_src.append(s)
        self.eps_dst.append(t)

    def add_bytes(self, s: int, mask: int, t: int) -> None:
        self.byte_src.append(s)
        self.byte_mask.append(mask)
        self.byte_dst.append(t)

    def add_call(self, s: int, rule: int, t: int) -> None:
        self.call_src.append(s)
        self.call_rule.append(rule)
        self.call_dst.append(t)

    def lists(self, class_masks: list[int]) -> tuple[list, list, list]:
        """Per state: epsilon targets, (byte mask, target) and (rule, target) lists."""
        eps: list[list[int]] = [[] for _ in range(self.n)]
        byte_edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        call_edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        for s, d in zip(self.eps_src, self.eps_dst):
            eps[s].append(d)
        for s, m, d in zip(self.byte_src, self.byte_mask, self.byte_dst):
            byte_edges[s].append((m, d))
        for src, c, dst in self.chunks:
            for s, k, d in zip(src.tolist(), c.tolist(), dst.tolist()):
                byte_edges[s].append((class_masks[k], d))
        for s, r, d in zip(self.call_src, self.call_rule, self.call_dst):
            call_edges[s].append((r, d))
        return eps, byte_edges, call_edges


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
        self.class_memo: dict[int, list[int]] = {}

    def ref_free(self, e: Expr) -> bool:
        return not e._refs

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
                nfa.add_bytes(start, e.mask, end)
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
                nfa.add_eps(start, s)
                nfa.add_eps(self.build(it, s), end)
            return end
        if isinstance(e, Repeat):
            return self._repeat(e, start)
        if isinstance(e, Ref):
            if e.name in self.rule_index:
                end = nfa.new()
                nfa.add_call(start, self.rule_index[e.name], end)
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
                d = product(d, other, "diff" if isinstance(e, Diff) else "and", self.nfa.limits)
            self.dfa_memo[e] = d
        if d is None:
            sub = NFA(self.nfa.limits, self.nfa.deadline)
            fb = FragmentBuilder(sub, self.rules, self.rule_index, self.cls, self.reps, self.dfa_memo)
            fb.class_memo = self.class_memo
            s0 = sub.new()
            end = fb.build(e, s0, splice=False)
            raw = determinize(sub, s0, end, self.cls, self.reps, self.nfa.limits, self.class_memo)
            d = minimize(raw, live_states(raw, set()), set())
            self.dfa_memo[e] = d
        return d

    def _splice(self, d: RawDFA, start: int) -> int:
        nfa = self.nfa
        end = nfa.new()
        n = len(d.accepting)
        if n == 0:
            return end  # empty language: nothing reaches end
        base = nfa.new(n)
        nfa.add_eps(start, base)
        src, c, dst, acc = _class_edges(d)
        nfa.chunks.append((src + base, c, dst + base))
        for q in acc:
            nfa.add_eps(base + q, end)
        return end

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
            nfa.add_eps(cur, loop)
            body_end = self._build_item(item, loop)
            nfa.add_eps(body_end, loop)
            return body_end
        for _ in range(e.min):
            cur = self._build_item(item, cur)
        if e.max is None:
            loop = nfa.new()
            nfa.add_eps(cur, loop)
            body_end = self._build_item(item, loop)
            nfa.add_eps(body_end, loop)
            return loop
        end = nfa.new()
        for _ in range(e.max - e.min):
            nfa.add_eps(cur, end)
            cur = self._build_item(item, cur)
        nfa.add_eps(cur, end)
        return end


    def _build_item(self, item, start: int) -> int:
        if isinstance(item, _Spliced):
            return self._splice(item.dfa, start)
        return self.build(item, start)


def byte_classes(masks: set[int]) -> tuple[np.ndarray, list[int]]:
    """Partition 0..255 by membership in every mask.

    Returns ``cls`` (byte → class id, int32 [256]; classes numbered by their first byte)
    and ``reps`` (each class's first byte); :func:`mask_classes` maps a mask to its classes.
    """
    mask_list = sorted(masks)
    if not mask_list:
        return np.zeros(256, dtype=np.int32), [0]
    raw = np.frombuffer(b"".join(m.to_bytes(32, "little") for m in mask_list), dtype=np.uint8)
    member = np.unpackbits(raw.reshape(len(mask_list), 32), axis=1, bitorder="little")  # [k, 256]
    sig = np.packbits(member.T, axis=1)  # [256, ceil(k/8)]: each byte's membership
    _, first, inv = np.unique(sig, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # classes by first byte
    rank = np.empty(len(first), dtype=np.int32)
    rank[order] = np.arange(len(first), dtype=np.int32)
    return rank[inv.reshape(-1)], np.sort(first).tolist()


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
    nfa: NFA, start: int, accept: int, cls: np.ndarray, reps: list[int], limits: Limits,
    class_memo: dict | None = None,
) -> RawDFA:
    """Subset construction over byte classes and call symbols (numba kernel,
    :func:`~.dfa_kernels.determinize_kernel`; :func:`_determinize_reference` says the same
    in Python). ``class_memo``: mask -> class list, shared by the calls of one compile."""
    n_classes = len(reps)
    if class_memo is None:
        class_memo = {}
    n = nfa.n
    eps_ptr, eps_idx = _csr(n, np.array(nfa.eps_src, np.int64), np.array(nfa.eps_dst, np.int64))
    # byte edges: single masks (ids 0..k-1, class lists) and spliced class edges (id k + class)
    mask_ids = {m: i for i, m in enumerate(dict.fromkeys(nfa.byte_mask))}
    class_lists = []
    for m in mask_ids:
        cs = class_memo.get(m)
        if cs is None:
            cs = class_memo[m] = mask_classes(m, cls, reps)
        class_lists.append(cs)
    class_lists += [[c] for c in range(n_classes)]
    m_ptr = np.zeros(len(class_lists) + 1, dtype=np.int64)
    m_ptr[1:] = np.cumsum([len(c) for c in class_lists])
    m_cls = np.fromiter(chain.from_iterable(class_lists), np.int64, int(m_ptr[-1]))
    srcs = [np.array(nfa.byte_src, np.int64)] + [ch[0] for ch in nfa.chunks]
    ids = [np.fromiter(map(mask_ids.__getitem__, nfa.byte_mask), np.int64, len(nfa.byte_mask))]
    ids += [ch[1] + len(mask_ids) for ch in nfa.chunks]
    dsts = [np.array(nfa.byte_dst, np.int64)] + [ch[2] for ch in nfa.chunks]
    e_src = np.concatenate(srcs)
    order = np.argsort(e_src, kind="stable")
    e_ptr = _ptr(n, e_src[order])
    e_mask = np.concatenate(ids)[order]
    e_dst = np.concatenate(dsts)[order]
    c_src = np.array(nfa.call_src, np.int64)
    order = np.argsort(c_src, kind="stable")
    c_ptr = _ptr(n, c_src[order])
    c_rule = np.array(nfa.call_rule, np.int64)[order]
    c_dst = np.array(nfa.call_dst, np.int64)[order]
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


def _ptr(n: int, sorted_src: np.ndarray) -> np.ndarray:
    """CSR row pointers of ``n`` rows for edges sorted by source."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(sorted_src, minlength=n), out=ptr[1:])
    return ptr


def _csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    return _ptr(n, src[order]), dst[order]


def _class_edges(d: RawDFA) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """A DFA's transitions as (src, class, dst) arrays and its accepting states (once per
    DFA, kept on it: spliced DFAs are memoised)."""
    hit = getattr(d, "_class_edges", None)
    if hit is None:
        s, c = np.nonzero(d.table >= 0)
        hit = (s.astype(np.int64), c.astype(np.int64), d.table[s, c].astype(np.int64),
               np.flatnonzero(d.accepting).tolist())
        d._class_edges = hit
    return hit


def _determinize_reference(
    nfa: NFA, start: int, accept: int, cls: np.ndarray, reps: list[int], limits: Limits
) -> RawDFA:
    """Subset construction in Python: the reference :func:`determinize` is tested against."""
    n_classes = len(reps)
    mask_cache: dict[int, list[int]] = {}

    class_masks = [0] * n_classes
    for b in range(256):
        class_masks[int(cls[b])] |= 1 << b
    eps, byte_edges, call_edges = nfa.lists(class_masks)
    important = [bool(byte_edges[s] or call_edges[s]) for s in range(len(eps))]
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
            edges = byte_edges[s_only]
            union = 0
            disjoint = True
            for m, _ in edges:
                if union & m:
                    disjoint = False
                    break
                union |= m
            if disjoint and not call_edges[s_only]:
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
            for m, t in byte_edges[s]:
                for c in classes_of(m):
                    tgt = by_class.get(c)
                    if tgt is None:
                        by_class[c] = {t}
                    else:
                        tgt.add(t)
            for r, t in call_edges[s]:
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
    pairs = [(s, t) for s, cs in enumerate(dfa.calls) for r, t in cs if r in productive_rules]
    src = np.array([s for s, _ in pairs], dtype=np.int64)
    dst = np.array([t for _, t in pairs], dtype=np.int64)
    return live_kernel(np.ascontiguousarray(dfa.table), dfa.accepting.astype(bool), src, dst)


def minimize(dfa: RawDFA, live: np.ndarray, productive_rules: set[int]) -> RawDFA:
    """The minimal DFA of the live part (:func:`~.dfa_kernels.minimize_kernel`: Hopcroft,
    then breadth-first numbering; calls to unproductive rules dropped). Start stays
    state 0. Returns a DFA whose states are all live (dead transitions are -1); if the
    start state is dead, one with zero states.
    """
    n, n_classes = dfa.table.shape
    if not live[0]:
        return RawDFA(np.zeros((0, n_classes), np.int32), np.zeros(0, bool), [])
    rules = sorted({r for cs in dfa.calls for r, _ in cs if r in productive_rules})
    col = {r: j for j, r in enumerate(rules)}
    calls = np.full((n, len(rules)), -1, dtype=np.int64)
    for s, cs in enumerate(dfa.calls):
        for r, t in cs:
            if r in col:
                calls[s, col[r]] = t
    table, acc, out_calls = minimize_kernel(np.ascontiguousarray(dfa.table), dfa.accepting.astype(bool),
                                            np.asarray(live, dtype=bool), calls)
    new_calls: list[list[tuple[int, int]]] = [[] for _ in range(len(acc))]
    if rules:
        for s, j in zip(*np.nonzero(out_calls >= 0)):
            new_calls[int(s)].append((rules[int(j)], int(out_calls[s, j])))
    return RawDFA(table, acc, new_calls)


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


def product(d1: RawDFA, d2: RawDFA, mode: str, limits: Limits) -> RawDFA:
    """Product of two call-free DFAs over the same classes: ``"and"`` (both accept) or
    ``"diff"`` (``d1`` accepts, ``d2`` does not). Returns it minimised."""
    if len(d1.accepting) == 0:
        return d1
    t2 = d2.table if len(d2.accepting) else np.zeros((0, d1.table.shape[1]), np.int32)
    status, table, acc = product_kernel(np.ascontiguousarray(d1.table), d1.accepting.astype(bool),
                                        np.ascontiguousarray(t2), d2.accepting.astype(bool), mode == "diff",
                                        limits.max_dfa_states)
    if status:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states"
        )
    raw = RawDFA(table, acc, [[] for _ in range(len(acc))])
    return minimize(raw, live_states(raw, set()), set())
