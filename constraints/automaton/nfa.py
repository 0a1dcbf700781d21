"""IR expression → byte NFA (Thompson) → minimal DFA.

The alphabet is bytes (grouped into equivalence classes) plus *call* symbols: a ``Ref``
to a rule that stays a rule of its own (recursive or large) is an edge labelled with
that rule; the pushdown matcher in :mod:`automaton` follows it. Everything else is
inlined, so a non-recursive constraint becomes one DFA.

The builder appends edges to flat lists; the kernels of :mod:`.nfa_kernels` take them as
arrays (layout, subset construction, minimisation in one call). Minimal DFAs of Ref-free
sub-expressions are shared by compilations through a :class:`DFAMemo`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import Alt, And, ByteSet, Dfa, Diff, Expr, Ref, Repeat, Seq
from ..limits import Limits
from .dfa_kernels import hopcroft, live_kernel, product_kernel
from .minimize import minimize_sparse_kernel
from .nfa_kernels import byte_classes_kernel, det_min_flat_kernel, determinize_flat_kernel
from .subset import clock_rate, now

# ----------------------------------------------------------------------------- alphabet


def _mask_bytes(masks: list[int]) -> np.ndarray:
    """uint8 [k, 32]: each mask's 256 bits, little-endian."""
    return np.frombuffer(b"".join(m.to_bytes(32, "little") for m in masks), dtype=np.uint8).reshape(
        len(masks), 32
    )


class Alphabet:
    """The byte classes of one compilation and the classes each byte mask covers.

    Symbol ids of the kernels: ``0..C-1`` are the classes themselves (the edges of
    spliced DFAs), ``C + i`` the i-th mask; :meth:`csr` lists each symbol's classes.
    Built from masks (``Alphabet(masks)``: bytes are grouped by membership in every mask,
    classes numbered by their first byte) or over given classes (``cls``, ``reps``).
    """

    def __init__(
        self, masks: Iterable[int] = (), cls: np.ndarray | None = None, reps: list[int] | None = None
    ) -> None:
        self.masks = list(dict.fromkeys(masks))
        self.exact = cls is None  # every mask is a union of classes
        if cls is None:
            cls, rep_arr, m_ptr, m_cls = byte_classes_kernel(_mask_bytes(self.masks))
            self._csr: tuple[np.ndarray, np.ndarray] | None = (m_ptr, m_cls)
        else:
            rep_arr = np.asarray(reps, dtype=np.int64)
            self._csr = None
        self.cls = cls
        self.rep_arr = rep_arr
        self.reps: list[int] = rep_arr.tolist()
        self.n_classes = c = len(self.reps)
        self.ids = {m: c + i for i, m in enumerate(self.masks)}

    def id(self, mask: int) -> int:
        """The symbol id of a byte mask (added if new)."""
        i = self.ids.get(mask)
        if i is None:
            if self.exact and not _is_union(mask, self.cls):
                raise ConstraintError(
                    "internal error: a byte set was missed when the byte classes were built"
                )
            i = self.ids[mask] = self.n_classes + len(self.masks)
            self.masks.append(mask)
            self._csr = None
        return i

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(m_ptr, m_cls): symbol j's classes are ``m_cls[m_ptr[j]:m_ptr[j + 1]]``."""
        if self._csr is None:
            c, k = self.n_classes, len(self.masks)
            if k:
                bits = np.unpackbits(_mask_bytes(self.masks), axis=1, bitorder="little")[:, self.rep_arr]
                _, rows, cols = cells(bits != 0)
            else:
                rows = cols = np.zeros(0, dtype=np.int64)
            m_ptr = np.empty(c + k + 1, dtype=np.int64)
            m_ptr[: c + 1] = np.arange(c + 1)
            m_ptr[c + 1 :] = c + np.cumsum(np.bincount(rows, minlength=k))
            self._csr = (m_ptr, np.concatenate([np.arange(c, dtype=np.int64), cols.astype(np.int64)]))
        return self._csr


def _is_union(mask: int, cls: np.ndarray) -> bool:
    bits = np.unpackbits(_mask_bytes([mask])[0], bitorder="little").astype(bool)
    inside = np.zeros(int(cls.max()) + 1, dtype=bool)
    inside[cls[bits]] = True
    return bool((inside[cls] == bits).all())


# ---------------------------------------------------------------------------------- NFA


class NFA:
    """A Thompson NFA as flat edge lists: epsilon edges ``eps`` (src, dst, src, dst, …),
    byte edges ``byt`` (src, symbol, dst triples; the symbol is the byte mask, or its id
    in ``alphabet`` when the NFA has one), call edges ``call`` (src, rule, dst triples),
    and spliced DFAs' edges in ``chunks``: arrays (src, byte class, dst)."""

    def __init__(self, limits: Limits, deadline: float, alphabet: Alphabet | None = None) -> None:
        self.n = 0
        self.eps: list[int] = []
        self.byt: list[int] = []
        self.call: list[int] = []
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.limits = limits
        self.deadline = deadline
        self.alphabet = alphabet

    def new(self, count: int = 1) -> int:
        """Add ``count`` states; return the first."""
        n = self.n
        if n + count > self.limits.max_nfa_states:
            raise ConstraintTooComplex(
                f"constraint is too large: its automaton exceeds {self.limits.max_nfa_states:,} NFA states",
                bound="max_nfa_states",
            )
        self.n = n + count
        if (n ^ self.n) >> 14 and time.monotonic() > self.deadline:  # (every 16k states)
            raise ConstraintTooComplex(
                "constraint took too long to compile (NFA construction)", bound="max_seconds"
            )
        return n

    def add_eps(self, s: int, t: int) -> None:
        self.eps += (s, t)

    def add_bytes(self, s: int, mask: int, t: int) -> None:
        self.byt += (s, mask if self.alphabet is None else self.alphabet.id(mask), t)

    def add_call(self, s: int, rule: int, t: int) -> None:
        self.call += (s, rule, t)

    def lists(self, class_masks: list[int]) -> tuple[list, list, list]:
        """Per state: epsilon targets, (byte mask, target) and (rule, target) lists."""
        eps: list[list[int]] = [[] for _ in range(self.n)]
        byte_edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        call_edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        a = self.alphabet
        for i in range(0, len(self.eps), 2):
            eps[self.eps[i]].append(self.eps[i + 1])
        for i in range(0, len(self.byt), 3):
            m = self.byt[i + 1]
            if a is not None:
                m = class_masks[m] if m < a.n_classes else a.masks[m - a.n_classes]
            byte_edges[self.byt[i]].append((m, self.byt[i + 2]))
        for src, c, dst in self.chunks:
            for s, k, d in zip(src.tolist(), c.tolist(), dst.tolist()):
                byte_edges[s].append((class_masks[k], d))
        for i in range(0, len(self.call), 3):
            call_edges[self.call[i]].append((self.call[i + 1], self.call[i + 2]))
        return eps, byte_edges, call_edges

    def flat(self, alphabet: Alphabet) -> tuple[np.ndarray, ...]:
        """The kernels' arrays: eps, byt (symbol ids of ``alphabet``), chunk src / class /
        dst, call."""
        byt = self.byt
        if self.alphabet is None:
            byt = byt[:]
            byt[1::3] = [alphabet.id(m) for m in byt[1::3]]
        if self.chunks:
            ch = [np.concatenate([c[j] for c in self.chunks]) for j in range(3)]
        else:
            ch = [_EMPTY] * 3
        return (
            np.array(self.eps, dtype=np.int64),
            np.array(byt, dtype=np.int64),
            *ch,
            np.array(self.call, dtype=np.int64),
        )


_EMPTY = np.zeros(0, dtype=np.int64)  # never written to


class _Spliced:
    """An item already determinised (built by splicing its DFA)."""

    __slots__ = ("dfa",)

    def __init__(self, dfa: RawDFA) -> None:
        self.dfa = dfa


SPLICE_MIN_SIZE = 48  # IR nodes: larger Ref-free sub-expressions are determinised once (a JSON string: 250)


SUFFIX_MIN_BRANCHES = 4  # an Alt whose branches share a tail this often is built from the end


def _shared_suffixes(e: Alt) -> bool:
    """Do at least :data:`SUFFIX_MIN_BRANCHES` branches of ``e`` end in the same two
    elements (not bytes)?"""
    seen: dict[tuple[Expr, Expr], int] = {}
    for it in e.items:
        if type(it) is Seq and len(it.items) >= 2 and type(it.items[-1]) is not ByteSet:
            key = (it.items[-2], it.items[-1])
            k = seen[key] = seen.get(key, 0) + 1
            if k >= SUFFIX_MIN_BRANCHES:
                return True
    return False


class FragmentBuilder:
    """Builds NFA fragments for expressions; non-rule refs are inlined.

    A large Ref-free sub-expression is compiled once to a minimal DFA (memoised by the
    expression, which hashes in O(1): per compilation in ``dfa_memo``, across them in
    ``shared``) and spliced in: repeated sub-expressions — a JSON string, a key
    complement, a Unicode class — cost their size once, and the subsets of the outer
    construction stay small. Splicing needs the NFA's ``alphabet``.
    """

    def __init__(
        self,
        nfa: NFA,
        rules: dict[str, Expr],
        rule_index: dict[str, int],
        dfa_memo: dict | None = None,
        shared: DFAMemo | None = None,
    ) -> None:
        self.nfa = nfa
        self.rules = rules
        self.rule_index = rule_index  # rules that are called, not inlined
        self._inlining: list[str] = []
        self.alphabet = nfa.alphabet
        self.dfa_memo = dfa_memo if dfa_memo is not None else {}
        self.shared = shared

    def _sym(self, mask: int) -> int:
        a = self.alphabet
        if a is None:
            return mask
        i = a.ids.get(mask)
        return a.id(mask) if i is None else i

    def build(self, e: Expr, start: int, splice: bool = True) -> int:
        """Add ``e`` starting at ``start``; return its end state."""
        nfa = self.nfa
        t = type(e)
        if t is ByteSet:
            end = nfa.new()
            if e.mask:
                nfa.byt += (start, self._sym(e.mask), end)
            return end
        if t is And or t is Diff:
            if self.alphabet is None or e._refs:
                raise ConstraintError(
                    "intersection and difference apply to regular parts only (no rule references)"
                )
            return self._splice(self._sub_dfa(e), start)
        if (
            splice
            and e._size >= SPLICE_MIN_SIZE
            and t is not Ref
            and not e._refs
            and self.alphabet is not None
        ):
            return self._splice(self._sub_dfa(e), start)
        if t is Seq:
            cur = start
            byt = nfa.byt
            for it in e.items:
                if type(it) is ByteSet:  # the common item, inline
                    end = nfa.new()
                    if it.mask:
                        byt += (cur, self._sym(it.mask), end)
                    cur = end
                else:
                    cur = self.build(it, cur)
            return cur
        if t is Alt:
            if _shared_suffixes(e):
                return self._alt_suffixes(e, start)
            end = nfa.new()
            eps = nfa.eps
            for it in e.items:
                s = nfa.new()
                eps += (start, s)
                eps += (self.build(it, s), end)
            return end
        if t is Repeat:
            return self._repeat(e, start)
        if t is Dfa:
            base = nfa.new(e.n)
            nfa.eps += (start, base)
            sym = self._sym
            for s, mask, d in e.edges:
                nfa.byt += (base + s, sym(mask), base + d)
            end = nfa.new()
            for q in e.accept:
                nfa.eps += (base + q, end)
            return end
        if t is Ref:
            if e.name in self.rule_index:
                end = nfa.new()
                nfa.call += (start, self.rule_index[e.name], end)
                return end
            if e.name not in self.rules:
                raise ConstraintError(f"reference to undefined rule {e.name!r}")
            if e.name in self._inlining:  # cannot happen for a correct rule_index
                raise ConstraintError(f"rule {e.name!r} refers to itself")
            if time.monotonic() > nfa.deadline:
                raise ConstraintTooComplex("constraint took too long to compile", bound="max_seconds")
            self._inlining.append(e.name)
            try:
                return self.build(self.rules[e.name], start)
            finally:
                self._inlining.pop()
        raise TypeError(f"not an IR expression: {e!r}")

    def _alt_suffixes(self, e: Alt, start: int) -> int:
        """An alternation of sequences with common tails (the optional members of an object
        after each possible first one) built from the end, one fragment per distinct tail:
        linear in the members where copies would be quadratic. Exact: every branch ends in
        the same state, so a tail built once serves every branch it ends."""
        nfa = self.nfa
        end = nfa.new()
        eps = nfa.eps
        before: dict[tuple[Expr, int], int] = {}  # (element, state after it) -> state before it
        for it in e.items:
            eps += (start, self._tail(before, it.items if type(it) is Seq else (it,), end))
        return end

    def _tail(self, before: dict, items: tuple[Expr, ...], cur: int) -> int:
        """The state before ``items`` (ending in ``cur``), sharing every element already built
        before the same state (``before``: (element, state after it) -> state before it). A
        method, not a closure that calls itself: such a closure is a reference cycle, which
        would keep the NFA and its edge lists alive until a pass of Python's collector."""
        nfa = self.nfa
        for x in reversed(items):
            key = (x, cur)
            s = before.get(key)
            if s is None:
                if type(x) is Repeat and x.min == 1 and x.max == 1 and type(x.item) is Seq:
                    # a chained tail (one copy of a sequence, see
                    # json_schema.objects.declared_members): its elements are shared too
                    s = self._tail(before, x.item.items, cur)
                else:
                    s = nfa.new()
                    if type(x) is ByteSet:
                        if x.mask:
                            nfa.byt += (s, self._sym(x.mask), cur)
                    else:
                        nfa.eps += (self.build(x, s), cur)
                before[key] = s
            cur = s
        return cur

    def _sub_dfa(self, e: Expr) -> RawDFA:
        d = self.dfa_memo.get(e)
        if d is not None:
            return d
        alphabet = self.alphabet
        if self.shared is not None:
            d = self.shared.get(e, alphabet, self.nfa.limits)
        if d is None:
            if isinstance(e, (And, Diff)):
                parts = [self._sub_dfa(i) for i in e.items]
                d = parts[0]
                for other in parts[1:]:
                    d = product(d, other, "diff" if isinstance(e, Diff) else "and", self.nfa.limits)
            else:
                sub = NFA(self.nfa.limits, self.nfa.deadline, alphabet)
                fb = FragmentBuilder(sub, self.rules, self.rule_index, self.dfa_memo, self.shared)
                s0 = sub.new()
                end = fb.build(e, s0, splice=False)
                d = minimal_dfa(sub, s0, end)
            if self.shared is not None:
                self.shared.put(e, alphabet.cls, d, self.nfa.limits)
        self.dfa_memo[e] = d
        return d

    def _splice(self, d: RawDFA, start: int) -> int:
        nfa = self.nfa
        end = nfa.new()
        n = len(d.accepting)
        if n == 0:
            return end  # empty language: nothing reaches end
        base = nfa.new(n)
        eps = nfa.eps
        eps += (start, base)
        src, c, dst, acc = _class_edges(d)
        nfa.chunks.append((src + base, c, dst + base))
        for q in acc:
            eps += (base + q, end)
        return end

    def _repeat(self, e: Repeat, start: int) -> int:
        if type(e.item) is ByteSet and e.max is not None:
            return self._byte_chain(e.item.mask, e.min, e.max, start)
        return self._repeat_built(e, start)

    def _byte_chain(self, mask: int, lo: int, hi: int, start: int) -> int:
        """``[mask]{lo,hi}`` as :meth:`_repeat_built` builds it (the same states, numbered
        alike, and the same edges in the same order), without building each copy through
        :meth:`build`: the bounded runs of whitespace around every JSON token are such
        repeats, twenty copies each."""
        nfa = self.nfa
        sym = self._sym(mask) if mask else None
        byt, eps = nfa.byt, nfa.eps
        cur = start
        if lo:
            first = nfa.new(lo)
            for nxt in range(first, first + lo):
                if sym is not None:
                    byt += (cur, sym, nxt)
                cur = nxt
        end = nfa.new()
        if hi > lo:
            first = nfa.new(hi - lo)
            for nxt in range(first, first + hi - lo):
                eps += (cur, end)
                if sym is not None:
                    byt += (cur, sym, nxt)
                cur = nxt
        eps += (cur, end)
        return end

    def _repeat_built(self, e: Repeat, start: int) -> int:
        """A repeat, each copy built (the reference of :meth:`_byte_chain`)."""
        nfa = self.nfa
        cur = start
        copies = max(e.min, e.max or 0)
        if copies >= 4 and self.alphabet is not None and not isinstance(e.item, ByteSet) and not e.item._refs:
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


# ---------------------------------------------------------------------------------- DFAs


class RawDFA:
    """A DFA over byte classes with call edges; state 0 is the start; -1 is dead.

    ``calls``: per state, its (rule index, target state) pairs. The kernels give call
    edges as arrays (src, rule, dst), and most steps read them so: the per-state lists
    are only built when read (:func:`call_edge_arrays` goes the other way)."""

    def __init__(
        self,
        table: np.ndarray,
        accepting: np.ndarray,
        calls: list | None = None,
        call_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.table = table  # int32 [n, n_classes]
        self.accepting = accepting  # bool [n]
        self._calls = calls
        self._carr = call_arrays
        if calls is None and call_arrays is None:
            self._carr = _NO_CALLS

    @property
    def calls(self) -> list:
        if self._calls is None:
            n = len(self.accepting)
            src, rule, dst = self._carr
            if len(src) == 0:
                self._calls = [()] * n
            else:
                calls: list = [[] for _ in range(n)]
                for s, r, t in zip(src.tolist(), rule.tolist(), dst.tolist()):
                    calls[s].append((r, t))
                self._calls = calls
        return self._calls


_NO_CALLS = (_EMPTY, _EMPTY, _EMPTY)


def with_calls(
    table: np.ndarray, accepting: np.ndarray, src: np.ndarray, rule: np.ndarray, dst: np.ndarray
) -> RawDFA:
    """A RawDFA from call edge arrays (its per-state lists are built if read)."""
    return RawDFA(table, accepting, None, _NO_CALLS if len(src) == 0 else (src, rule, dst))


def call_edge_arrays(d: RawDFA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hit = d._carr
    if hit is None:
        triples = [(s, r, t) for s, cs in enumerate(d.calls) for r, t in cs]
        hit = (
            tuple(np.array([x[j] for x in triples], dtype=np.int64) for j in range(3))
            if triples
            else _NO_CALLS
        )
        d._carr = hit
    return hit


# where the kernels have no clock: work units (symbol-target pairs, closure states, union and
# sort steps) the subset construction does per second, 15-500 million by how it uses memory
WORK_PER_SECOND = 50_000_000


def _work_left(nfa: NFA) -> int:
    """The subset construction's bound: the deadline in the ticks of its clock, negated,
    where it has one (:func:`~.subset.clock_rate`: then the bound is the time left, whatever
    the work costs); else the work it may do in the time left."""
    left = nfa.deadline - time.monotonic()
    if left <= 0:
        raise ConstraintTooComplex(
            "constraint took too long to compile (DFA construction)", bound="max_seconds"
        )
    rate = clock_rate()
    if rate and left < 1e6:
        return -(now() + int(left * rate) + 1)
    return int(min(left, 1e6) * WORK_PER_SECOND)


def _raise_status(status: int, limits: Limits) -> None:
    if status == 1:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states",
            bound="max_dfa_states",
        )
    if status == 2:
        raise ConstraintTooComplex(
            "constraint took too long to compile (DFA construction)", bound="max_seconds"
        )


def determinize(
    nfa: NFA,
    start: int,
    accept: int,
    cls: np.ndarray,
    reps: list[int],
    limits: Limits,
    class_memo: dict | None = None,
) -> RawDFA:
    """Subset construction over byte classes and call symbols (numba kernel,
    :func:`~.nfa_kernels.determinize_flat_kernel`; the tests' ``determinize_reference`` says the
    same in Python). Over the NFA's alphabet when it has one, else over ``cls``/``reps``
    (``class_memo`` is not used any more)."""
    alphabet = nfa.alphabet if nfa.alphabet is not None else Alphabet(cls=cls, reps=reps)
    flat = nfa.flat(alphabet)
    m_ptr, m_cls = alphabet.csr()
    status, table, accepting, call_src, call_rule, call_dst = determinize_flat_kernel(
        nfa.n, *flat, m_ptr, m_cls, start, accept, alphabet.n_classes, limits.max_dfa_states, _work_left(nfa)
    )
    _raise_status(status, limits)
    return with_calls(table, accepting, call_src, call_rule, call_dst)


def minimal_dfa(nfa: NFA, start: int, accept: int) -> RawDFA:
    """The minimal DFA of a call-free NFA with an alphabet: :func:`determinize`, then
    :func:`live_states` and :func:`minimize`, in one kernel call."""
    alphabet = nfa.alphabet
    eps, byt, ch_src, ch_sym, ch_dst, call = nfa.flat(alphabet)
    if len(call):
        raise ConstraintError("internal error: minimal_dfa of an NFA with calls")
    m_ptr, m_cls = alphabet.csr()
    status, table, accepting = det_min_flat_kernel(
        nfa.n,
        eps,
        byt,
        ch_src,
        ch_sym,
        ch_dst,
        m_ptr,
        m_cls,
        start,
        accept,
        alphabet.n_classes,
        nfa.limits.max_dfa_states,
        _work_left(nfa),
    )
    _raise_status(status, nfa.limits)
    return with_calls(table, accepting, _EMPTY, _EMPTY, _EMPTY)


def cells(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat indices, rows, columns) of the True cells of a 2-D bool array, row by row, as
    int64: ``np.nonzero``'s rows and columns, by the nonzero of its flat view (2 to 3 times
    faster on the DFA tables here: numpy's 2-D nonzero takes a slower path). The flat
    indices index the C-ordered ``ravel()`` of any array of the mask's shape."""
    at = mask.ravel().nonzero()[0]
    if not mask.shape[1]:
        return at, at, at.copy()
    rows, cols = np.divmod(at, mask.shape[1])
    return at, rows, cols


def _class_edges(d: RawDFA) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """A DFA's transitions as (src, class, dst) arrays and its accepting states (once per
    DFA, kept on it: spliced DFAs are memoised; a shared DFA met under another compilation's
    classes is a new one, so this runs for most splices)."""
    hit = getattr(d, "_class_edges", None)
    if hit is None:
        at, s, c = cells(d.table >= 0)
        hit = (s, c, d.table.ravel()[at].astype(np.int64), np.flatnonzero(d.accepting).tolist())
        d._class_edges = hit
    return hit


class DFAMemo:
    """DFAs shared by compilations (bounded LRU, thread-safe), keyed by what determines
    them: a Ref-free expression, or a rule with its call numbering. A DFA over one
    compilation's byte classes serves another whose classes refine the expression's
    byte sets (every compilation's classes refine all of its byte sets): the column of a
    new class is the old column of its first byte."""

    def __init__(self, max_cells: int = 4_000_000) -> None:
        self._d: OrderedDict = OrderedDict()
        self._cells = 0
        self.max_cells = max_cells  # table entries held, in all
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _key(key, limits: Limits) -> tuple:
        # compilations under other state bounds do not share: a DFA kept under looser
        # bounds must not spare a stricter compilation its ConstraintTooComplex
        return (key, limits.max_nfa_states, limits.max_dfa_states)

    def get(self, key, alphabet: Alphabet, limits: Limits) -> RawDFA | None:
        key = self._key(key, limits)
        with self._lock:
            hit = self._d.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
        cls, d = hit
        if cls is alphabet.cls:
            return d
        return RawDFA(
            np.ascontiguousarray(d.table[:, cls[alphabet.rep_arr]]), d.accepting, None, call_edge_arrays(d)
        )

    def put(self, key, cls: np.ndarray, d: RawDFA, limits: Limits) -> None:
        key = self._key(key, limits)
        cells = d.table.size + 1
        if cells > self.max_cells // 8:
            return
        call_edge_arrays(d)
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._cells -= old[1].table.size + 1
            self._d[key] = (cls, d)
            self._cells += cells
            while self._cells > self.max_cells:
                _, (_, gone) = self._d.popitem(last=False)
                self._cells -= gone.table.size + 1

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._cells = 0


SHARED_DFAS = DFAMemo()  # the process's shared DFAs (DFAs over bytes: vocabulary-independent)


def live_states(dfa: RawDFA, productive_rules: set[int]) -> np.ndarray:
    """States from which an accepting state is reachable (calls only to productive rules)."""
    src, rule, dst = call_edge_arrays(dfa)
    if len(src):
        keep = np.fromiter((r in productive_rules for r in rule.tolist()), dtype=bool, count=len(rule))
        src, dst = src[keep], dst[keep]
    return live_kernel(np.ascontiguousarray(dfa.table), np.asarray(dfa.accepting, dtype=bool), src, dst)


def minimize(dfa: RawDFA, live: np.ndarray, productive_rules: set[int]) -> RawDFA:
    """The minimal DFA of the live part (:func:`~.minimize.minimize_sparse_kernel`:
    Hopcroft, then breadth-first numbering; calls to unproductive rules dropped). Start stays
    state 0. Returns a DFA whose states are all live (dead transitions are -1); if the
    start state is dead, one with zero states.
    """
    n, n_classes = dfa.table.shape
    if not live[0]:
        return with_calls(np.zeros((0, n_classes), np.int32), np.zeros(0, bool), _EMPTY, _EMPTY, _EMPTY)
    src, rule, dst = call_edge_arrays(dfa)
    rules = []
    if len(src):
        keep = np.fromiter((r in productive_rules for r in rule.tolist()), dtype=bool, count=len(rule))
        src, rule, dst = src[keep], rule[keep], dst[keep]
        rules = sorted(set(rule.tolist()))
    calls = np.full((n, len(rules)), -1, dtype=np.int64)
    if rules:
        calls[src, np.searchsorted(np.array(rules, dtype=np.int64), rule)] = dst
    table, acc, out_calls = minimize_sparse_kernel(
        np.ascontiguousarray(dfa.table),
        np.asarray(dfa.accepting, dtype=bool),
        np.asarray(live, dtype=bool),
        calls,
    )
    if not rules:
        return with_calls(table, acc, _EMPTY, _EMPTY, _EMPTY)
    at, s, j = cells(out_calls >= 0)
    return with_calls(table, acc, s, np.array(rules, dtype=np.int64)[j], out_calls.ravel()[at])


def equivalent_blocks(table: np.ndarray, calls: list, init: np.ndarray, dead: int) -> np.ndarray:
    """Block of each state of a complete DFA (``table`` int [n, C], a dead sink included)
    whose call edges ``calls[s]`` = [(rule, target)] act as extra symbols (missing: ``dead``),
    refining the labels ``init``: states share a block iff they are equivalent
    (:func:`~.dfa_kernels.hopcroft`)."""
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


def product(d1: RawDFA, d2: RawDFA, mode: str, limits: Limits) -> RawDFA:
    """Product of two call-free DFAs over the same classes: ``"and"`` (both accept) or
    ``"diff"`` (``d1`` accepts, ``d2`` does not). Returns it minimised."""
    if len(d1.accepting) == 0:
        return d1
    t2 = d2.table if len(d2.accepting) else np.zeros((0, d1.table.shape[1]), np.int32)
    status, table, acc = product_kernel(
        np.ascontiguousarray(d1.table),
        np.asarray(d1.accepting, dtype=bool),
        np.ascontiguousarray(t2),
        np.asarray(d2.accepting, dtype=bool),
        mode == "diff",
        limits.max_dfa_states,
    )
    if status:
        raise ConstraintTooComplex(
            f"constraint is too complex: its automaton exceeds {limits.max_dfa_states:,} states"
        )
    raw = with_calls(table, acc, _EMPTY, _EMPTY, _EMPTY)
    return minimize(raw, live_states(raw, set()), set())
