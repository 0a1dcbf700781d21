"""The compile fast paths against their references, on random inputs.

- byte classes and each mask's classes (numba kernel) == membership signatures in numpy;
- subset construction from flat edge arrays (kernel, and its pure-Python twin) ==
  :func:`~.oracles.nfa_reference.determinize_reference`; the fused determinise + minimise == the steps apart;
- Hopcroft with many initial blocks (one left out of the worklist) == Moore;
- a DFA shared by compilations (:class:`DFAMemo`, carried over to other byte classes) ==
  the DFA compiled afresh; whole grammars compile to identical automata with and without
  the shared DFAs, with rules that call none minimised at once or through the steps apart,
  and with small sub-expressions spliced as DFAs or built inline.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer.constraints import ir
from deepinfer.constraints.automaton import nfa as nfa_module
from deepinfer.constraints.automaton import pushdown
from deepinfer.constraints.automaton.dfa_kernels import _hopcroft_py
from deepinfer.constraints.automaton.nfa import (
    NFA,
    Alphabet,
    DFAMemo,
    FragmentBuilder,
    Limits,
    _mask_bytes,
    determinize,
    live_states,
    minimal_dfa,
    minimize,
)
from deepinfer.constraints.automaton.nfa_kernels import (
    _byte_classes_py,
    _determinize_flat_py,
    byte_classes_kernel,
)
from deepinfer.constraints.automaton.pushdown import _compile
from deepinfer.constraints.errors import ConstraintError

from .oracles.nfa_reference import determinize_reference, mask_classes, moore_blocks

INF = float("inf")


def _random_masks(rng: random.Random) -> list[int]:
    masks = [rng.getrandbits(256) & rng.getrandbits(256) for _ in range(rng.randint(0, 10))]
    masks += [1 << rng.randrange(256) for _ in range(rng.randint(0, 5))]
    masks += [((1 << rng.randint(1, 40)) - 1) << rng.randrange(200) for _ in range(rng.randint(0, 4))]
    return list(dict.fromkeys(m & ((1 << 256) - 1) for m in masks))


@pytest.mark.parametrize("seed", range(40))
def test_byte_classes_kernel_matches_membership_signatures(seed):
    rng = random.Random(seed)
    masks = _random_masks(rng)
    raw = _mask_bytes(masks) if masks else np.zeros((0, 32), np.uint8)
    for fn in (byte_classes_kernel, _byte_classes_py):
        cls, reps, m_ptr, m_cls = fn(raw)
        sig = [tuple((m >> b) & 1 for m in masks) for b in range(256)]
        first: dict = {}
        want = [first.setdefault(s, len(first)) for s in sig]  # numbered by first byte
        assert cls.tolist() == want
        assert reps.tolist() == [sig.index(s) for s in first]
        c = len(reps)
        assert m_ptr[: c + 1].tolist() == list(range(c + 1)) and m_cls[:c].tolist() == list(range(c))
        for i, m in enumerate(masks):
            got = m_cls[m_ptr[c + i] : m_ptr[c + i + 1]].tolist()
            assert got == mask_classes(m, cls, reps.tolist())
        # the numpy path over given classes says the same
        a = Alphabet(cls=cls, reps=reps.tolist())
        for m in masks:
            a.id(m)
        p2, c2 = a.csr()
        assert p2.tolist() == m_ptr.tolist() and c2.tolist() == m_cls.tolist()


def _random_nfa(rng: random.Random, n: int, n_classes: int, calls: bool = True) -> NFA:
    nfa = NFA(Limits(), deadline=INF)
    nfa.new(n)
    for s in range(n):
        for _ in range(rng.randint(0, 2)):
            nfa.add_eps(s, rng.randrange(n))
        for _ in range(rng.randint(0, 3)):
            mask = sum(1 << c for c in range(n_classes) if rng.random() < 0.4)
            if mask:
                nfa.add_bytes(s, mask, rng.randrange(n))
        if calls and rng.random() < 0.15:
            nfa.add_call(s, rng.randrange(2), rng.randrange(n))
    for _ in range(rng.randint(0, 2)):  # spliced DFAs' class edges
        k = rng.randint(1, 6)
        base = nfa.new(k)
        src = np.array([base + rng.randrange(k) for _ in range(2 * k)], np.int64)
        nfa.chunks.append(
            (
                src,
                np.array([rng.randrange(n_classes) for _ in src], np.int64),
                np.array([rng.randrange(nfa.n) for _ in src], np.int64),
            )
        )
        nfa.add_eps(rng.randrange(n), base)
    return nfa


def _same_dfa(fast, ref) -> None:
    """Equal up to state numbering (lockstep walk from the start), calls included."""
    assert len(fast.accepting) == len(ref.accepting)
    iso = {0: 0}
    work = [0]
    while work:
        s = work.pop()
        t = iso[s]
        assert bool(fast.accepting[s]) == bool(ref.accepting[t])
        fc, rc = sorted(fast.calls[s]), sorted(ref.calls[t])
        assert [r for r, _ in fc] == [r for r, _ in rc]
        pairs = list(zip(fast.table[s].tolist(), ref.table[t].tolist())) + [
            (a, b) for (_, a), (_, b) in zip(fc, rc)
        ]
        for a, b in pairs:
            assert (a < 0) == (b < 0)
            if a >= 0:
                if a in iso:
                    assert iso[a] == b
                else:
                    iso[a] = b
                    work.append(a)
    assert len(iso) == len(fast.accepting)


@pytest.mark.parametrize("seed", range(60))
def test_flat_determinize_equals_the_python_reference(seed):
    rng = random.Random(seed)
    n_classes = rng.randint(1, 6)
    nfa = _random_nfa(rng, rng.randint(1, 30), n_classes)
    cls = np.arange(256, dtype=np.int32) % n_classes
    reps = list(range(n_classes))
    accept = rng.randrange(nfa.n)
    fast = determinize(nfa, 0, accept, cls, reps, Limits())
    ref = determinize_reference(nfa, 0, accept, cls, reps, Limits())
    _same_dfa(fast, ref)
    # the pure-Python twin of the kernel: the same tables, numbering included
    a = Alphabet(cls=cls, reps=reps)
    st, table, acc, cs, cr, cd = _determinize_flat_py(
        nfa.n, *nfa.flat(a), *a.csr(), 0, accept, n_classes, 10**6, 10**12
    )
    assert st == 0 and (table == fast.table).all() and (acc == fast.accepting).all()


@pytest.mark.parametrize("seed", range(40))
def test_fused_minimal_dfa_equals_determinize_then_minimize(seed):
    rng = random.Random(seed)
    masks = _random_masks(rng) or [1]
    alphabet = Alphabet(masks)
    nfa = NFA(Limits(), deadline=INF, alphabet=alphabet)
    n = rng.randint(1, 25)
    nfa.new(n)
    for s in range(n):
        for _ in range(rng.randint(0, 2)):
            nfa.add_eps(s, rng.randrange(n))
        for _ in range(rng.randint(0, 2)):
            nfa.add_bytes(s, rng.choice(masks), rng.randrange(n))
    accept = rng.randrange(n)
    fused = minimal_dfa(nfa, 0, accept)
    raw = determinize(nfa, 0, accept, alphabet.cls, alphabet.reps, Limits())
    apart = minimize(raw, live_states(raw, set()), set())
    assert (fused.table == apart.table).all() and (fused.accepting == apart.accepting).all()


@pytest.mark.parametrize("seed", range(40))
def test_hopcroft_with_many_initial_blocks_equals_moore(seed):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 80))
    k = int(rng.integers(1, 6))
    table = rng.integers(0, n + 1, size=(n + 1, k))
    if seed % 2:  # sparse: most moves go to the sink, as in real DFAs
        table[rng.random((n + 1, k)) < 0.8] = n
    table[n] = n
    init = rng.integers(0, int(rng.integers(1, 9)), size=n + 1)
    _, lab = np.unique(init, return_inverse=True)
    lab = lab.reshape(-1).astype(np.int64)
    fast = _hopcroft_py(np.ascontiguousarray(table.astype(np.int64)), lab)
    ref = moore_blocks(table, np.zeros(n + 1, bool), [[] for _ in range(n + 1)], lab)
    pairs = set(zip(fast.tolist(), ref.tolist()))
    assert len(pairs) == len(set(fast.tolist())) == len(set(ref.tolist()))


def _random_expr(rng: random.Random, depth: int) -> ir.Expr:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(
            [
                ir.lit(rng.choice(["a", "b", "ab", "é", "\u20ac"])),
                ir.byte_range(0x61, 0x61 + rng.randrange(6)),
                ir.utf8_class([(0x61, 0x7A), (0xE9, 0xFF)], negate=rng.random() < 0.5),
            ]
        )
    kind = rng.randrange(4)
    if kind == 0:
        return ir.seq(*(_random_expr(rng, depth - 1) for _ in range(rng.randint(2, 3))))
    if kind == 1:
        return ir.alt(*(_random_expr(rng, depth - 1) for _ in range(rng.randint(2, 3))))
    if kind == 2:
        lo = rng.randint(0, 2)
        return ir.rep(_random_expr(rng, depth - 1), lo, rng.choice([None, lo + rng.randint(0, 4)]))
    return ir.difference(_random_expr(rng, depth - 1), _random_expr(rng, depth - 1))


@pytest.mark.parametrize("seed", range(30))
def test_shared_dfa_carried_to_other_byte_classes_equals_a_fresh_one(seed):
    rng = random.Random(seed)
    e = _random_expr(rng, 3)
    memo = DFAMemo()

    def sub_dfa(extra: list[int], shared: DFAMemo | None):
        masks = set()
        stack = [e]
        while stack:
            x = stack.pop()
            if isinstance(x, ir.ByteSet):
                masks.add(x.mask)
            else:
                stack.extend(getattr(x, "items", ()) or ([x.item] if isinstance(x, ir.Repeat) else []))
        alphabet = Alphabet(list(masks) + extra)
        fb = FragmentBuilder(NFA(Limits(), INF, alphabet), {}, {}, {}, shared)
        return fb._sub_dfa(e)

    first = sub_dfa(_random_masks(rng), memo)  # computed, kept in memo
    extra = _random_masks(rng)
    carried = sub_dfa(extra, memo)
    fresh = sub_dfa(extra, None)
    assert memo.hits >= 1
    assert carried.table.shape == fresh.table.shape
    assert (carried.table == fresh.table).all() and (carried.accepting == fresh.accepting).all()
    assert len(first.accepting) == len(fresh.accepting)  # minimal either way


@pytest.mark.parametrize("seed", range(20))
def test_grammars_compile_the_same_with_and_without_shared_dfas(seed):
    rng = random.Random(seed)
    memo = DFAMemo()
    for _ in range(3):  # later rounds reuse what earlier ones kept
        big = _random_expr(rng, 4)
        rules = {
            "start": ir.seq(ir.lit("["), ir.Ref("v"), ir.lit("]")),
            "v": ir.alt(big, ir.seq(ir.lit("("), ir.Ref("v"), ir.lit(")")), ir.rep(big, 4, 6)),
        }
        g = ir.Grammar(rules)
        try:
            b = _compile(g, Limits(), None, INF, None)
        except ConstraintError as e:  # an empty language: the shared path says the same
            with pytest.raises(type(e)):
                _compile(g, Limits(), None, INF, memo)
            continue
        a = _compile(g, Limits(), None, INF, memo)
        assert (a.table == b.table).all() and (a.cls == b.cls).all() and a.calls == b.calls
        assert (a.accepting == b.accepting).all() and a.start == b.start


@pytest.mark.parametrize("seed", range(25))
def test_grammars_compile_the_same_minimised_at_once_and_spliced_small(seed, monkeypatch):
    rng = random.Random(1000 + seed)
    rules = {
        "start": ir.seq(ir.Ref("a"), ir.lit(","), ir.alt(ir.Ref("b"), ir.Ref("r"))),
        "a": _random_expr(rng, 4),  # no calls
        "b": ir.rep(_random_expr(rng, 3), 0, 3),  # no calls
        "r": ir.alt(_random_expr(rng, 2), ir.seq(ir.lit("("), ir.Ref("r"), ir.lit(")"))),  # recursive
    }
    if rng.random() < 0.5:
        rules = {"start": ir.seq(rules["a"], ir.rep(rules["b"], 1, 2))}  # one rule, no calls
    g = ir.Grammar(rules)
    out = []
    for pre, splice in ((True, 48), (False, 10**9), (True, 10**9), (False, 8)):
        monkeypatch.setattr(pushdown, "PREMINIMIZE", pre)
        monkeypatch.setattr(nfa_module, "SPLICE_MIN_SIZE", splice)
        for call_above in (None, 0):
            try:
                out.append(_compile(g, Limits(), call_above, INF, None))
            except ConstraintError as e:
                out.append(type(e))
    for call_above in (0, 1):
        ref = out[call_above]
        for a in out[call_above::2]:
            if isinstance(ref, type):
                assert a is ref
                continue
            assert (a.table == ref.table).all() and (a.cls == ref.cls).all() and a.calls == ref.calls
            assert (a.accepting == ref.accepting).all() and a.start == ref.start


def _kernel_args(nfa: NFA, alphabet: Alphabet, accept: int) -> tuple:
    """The CSR arguments of the subset-construction kernels, built with numpy."""
    eps, byt, ch_src, ch_sym, ch_dst, calls = nfa.flat(alphabet)
    n = nfa.n

    def csr(src, *cols):
        order = np.argsort(src, kind="stable")
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
        return (ptr, *(c[order] for c in cols))

    eps_ptr, eps_idx = csr(eps[0::2], eps[1::2])
    e_ptr, e_mask, e_dst = csr(
        np.concatenate([byt[0::3], ch_src]),
        np.concatenate([byt[1::3], ch_sym]),
        np.concatenate([byt[2::3], ch_dst]),
    )
    c_ptr, c_rule, c_dst = csr(calls[0::3], calls[1::3], calls[2::3])
    important = (np.diff(e_ptr) > 0) | (np.diff(c_ptr) > 0)
    important[accept] = True
    m_ptr, m_cls = alphabet.csr()
    return (
        eps_ptr,
        eps_idx,
        important,
        e_ptr,
        e_mask,
        e_dst,
        m_ptr,
        m_cls,
        c_ptr,
        c_rule,
        c_dst,
        0,
        accept,
        alphabet.n_classes,
    )


@pytest.mark.parametrize("seed", range(60))
def test_subsets_kernel_equals_the_previous_kernel_buffers_grown_or_not(seed):
    from deepinfer.constraints.automaton.subset import _subsets_py, subsets_kernel

    from .oracles.previous_kernels import determinize_kernel

    rng = random.Random(seed)
    n_classes = rng.randint(1, 6)
    nfa = _random_nfa(rng, rng.randint(1, 40), n_classes)
    alphabet = Alphabet(cls=np.arange(256, dtype=np.int32) % n_classes, reps=list(range(n_classes)))
    args = _kernel_args(nfa, alphabet, rng.randrange(nfa.n))
    max_states = rng.choice([3, 10, 10**6])  # small bounds stop both at the same point
    want = determinize_kernel(*args, max_states, 10**12)
    for got in (
        subsets_kernel(*args, max_states, 10**12),
        subsets_kernel(*args, max_states, 10**12, True),
        _subsets_py(*args, max_states, 10**12, True),
    ):
        assert got[0] == want[0]
        if want[0] == 0:
            assert all((x == y).all() for x, y in zip(got[1:], want[1:]))


@pytest.mark.parametrize("seed", range(60))
def test_sparse_minimize_equals_the_dense_kernel(seed):
    from deepinfer.constraints.automaton.minimize import _minimize_sparse_py, minimize_sparse_kernel

    from .oracles.previous_kernels import _minimize_py, minimize_kernel

    rng = np.random.default_rng(2000 + seed)
    for _ in range(20):
        n, c, r = int(rng.integers(1, 40)), int(rng.integers(1, 6)), int(rng.integers(0, 3))
        table = np.where(rng.random((n, c)) < rng.random(), rng.integers(0, n, (n, c)), -1).astype(np.int32)
        calls = np.where(rng.random((n, r)) < 0.3, rng.integers(0, n, (n, r)), -1).astype(np.int64)
        acc = rng.random(n) < 0.3
        live = rng.random(n) < 0.8
        live[0] = True
        want = minimize_kernel(table, acc, live, calls)
        for fn in (minimize_sparse_kernel, _minimize_sparse_py):
            got = fn(table, acc, live, calls)
            assert all(x.shape == y.shape and (x == y).all() for x, y in zip(got, want))
    # and the Python twin of the dense one agrees too (it is what numba compiles)
    got = _minimize_py(table, acc, live, calls)
    assert all(x.shape == y.shape and (x == y).all() for x, y in zip(got, want))


def test_shared_dfas_do_not_cross_state_bounds():
    from deepinfer.constraints.errors import ConstraintTooComplex

    # spliced (over 300 nodes): ~300 subsets, which minimise to 12 states (the tails are alike)
    keys = ir.alt(*(ir.lit(chr(0x41 + i) + "abcdefghij") for i in range(30)))
    g = ir.Grammar({"start": ir.seq(ir.lit("["), keys, ir.lit("]"))})
    memo = DFAMemo()
    _compile(g, Limits(), None, INF, memo)  # keeps the keys' DFA
    assert memo.misses and not memo.hits
    with pytest.raises(ConstraintTooComplex):
        _compile(g, Limits(max_dfa_states=100), None, INF, None)
    with pytest.raises(ConstraintTooComplex):  # not spared by the DFA kept under the default bounds
        _compile(g, Limits(max_dfa_states=100), None, INF, memo)
    _compile(g, Limits(), None, INF, memo)
    assert memo.hits


@pytest.mark.parametrize("seed", range(20))
def test_collected_byte_sets_equal_a_plain_walk(seed):
    """``ir.collect_masks`` (large Ref-free sub-expressions' byte sets kept across calls)
    against a walk of every node."""

    def plain(e, out):
        if isinstance(e, ir.ByteSet):
            out.add(e.mask)
        elif isinstance(e, ir.Repeat):
            plain(e.item, out)
        elif isinstance(e, ir.Ref):
            if e.name not in out_rules:
                out_rules.add(e.name)
                plain(rules[e.name], out)
        else:
            for it in getattr(e, "items", ()):
                plain(it, out)
        return out

    rng = random.Random(seed)
    for _ in range(3):  # later rounds meet sub-expressions kept by earlier ones
        big = _random_expr(rng, 4)
        rules = {
            "start": ir.seq(ir.lit("["), ir.Ref("v"), ir.rep(big, 0, 2), ir.lit("]")),
            "v": ir.alt(big, ir.seq(ir.lit("("), ir.Ref("v"), ir.lit(")")), _random_expr(rng, 3)),
        }
        out_rules: set = {"start"}
        assert ir.collect_masks(rules, ["start"], set()) == plain(rules["start"], set())


def test_a_shared_rule_that_matches_nothing_compiles_again():
    """A called rule that calls none and matches nothing is kept minimal (no state) in the
    shared DFAs; a later compilation that finds it there leaves it out of the productive
    rules, as the first did, and compiles to the same automaton."""
    rules = {
        "start": ir.alt(ir.lit("a"), ir.seq(ir.lit("b"), ir.Ref("e")), ir.seq(ir.lit("c"), ir.Ref("f"))),
        "e": ir.seq(ir.lit("x"), ir.intersect(ir.lit("y"), ir.lit("z"))),  # no string
        "f": ir.rep(ir.lit("f"), 1, 3),
    }
    memo = DFAMemo()
    out = [_compile(ir.Grammar(rules), Limits(), 0, INF, memo) for _ in range(3)]
    assert memo.hits >= 2  # (the later compilations took e and f from the memo)
    for a in out[1:]:
        assert (a.table == out[0].table).all() and a.calls == out[0].calls
        assert (a.accepting == out[0].accepting).all() and a.start == out[0].start
    assert out[0].accepts(b"a") and out[0].accepts(b"cff") and not out[0].accepts(b"bx")


def test_cells_and_class_edges_equal_numpy_nonzero():
    """``cells`` (a 2-D bool array's True cells by its flat view's nonzero: flat indices,
    rows, columns) and the DFA transitions ``_class_edges`` lists with it equal
    ``np.flatnonzero``'s and ``np.nonzero``'s, row by row, as int64: empty tables, a column or
    a row alone, dense and sparse ones."""
    from deepinfer.constraints.automaton.nfa import RawDFA, _class_edges, cells

    rng = np.random.default_rng(3)
    for n, k, p in [
        (0, 5, 0.5),
        (4, 0, 0.5),
        (1, 1, 1.0),
        (7, 1, 0.5),
        (1, 60, 0.3),
        (40, 53, 0.3),
        (300, 64, 0.05),
    ]:
        table = np.where(rng.random((n, k)) < p, rng.integers(0, max(n, 1), (n, k)), -1).astype(np.int32)
        rows, cols = np.nonzero(table >= 0)
        got = cells(table >= 0)
        want = (np.flatnonzero(table >= 0), rows, cols)
        assert all(np.array_equal(a, b) and a.dtype == np.int64 for a, b in zip(got, want, strict=True))
        acc = rng.random(n) < 0.3
        s, c, d, a = _class_edges(RawDFA(table, acc, []))
        assert np.array_equal(s, rows) and np.array_equal(c, cols)
        assert (
            np.array_equal(d, table[rows, cols]) and d.dtype == np.int64 and a == np.flatnonzero(acc).tolist()
        )
    t = np.asfortranarray(rng.integers(-1, 5, (6, 9)).astype(np.int32))  # (not C-contiguous)
    at, rows, cols = cells(t >= 0)
    assert all(np.array_equal(a, b) for a, b in zip((rows, cols), np.nonzero(t >= 0), strict=True))
    assert np.array_equal(t.ravel()[at], t[rows, cols])  # (flat indices of the C-ordered ravel)


@pytest.mark.parametrize("alphabet", [False, True], ids=["masks", "classes"])
@pytest.mark.parametrize("seed", range(20))
def test_byte_chains_equal_repeats_built_copy_by_copy(seed, alphabet):
    """``[set]{lo,hi}`` (the bounded whitespace around every JSON token) built as one chain
    gives the NFA that building each copy gives: the same states, numbered alike, and the
    same edges in the same order, inside a sequence and after other states."""
    rng = random.Random(seed)
    masks = _random_masks(rng) + [0, 1 << 32 | 1 << 9]  # (an empty set too; space and tab)
    for _ in range(10):
        lo = rng.randint(0, 3)
        hi = lo + rng.choice([0, 1, rng.randint(2, 21)])
        e = ir.seq(ir.ByteSet(rng.choice(masks)), ir.rep(ir.ByteSet(rng.choice(masks)), lo, hi))
        before = rng.randint(1, 5)
        nfas = []
        for fast in (True, False):
            nfa = NFA(Limits(), INF, Alphabet(masks) if alphabet else None)
            fb = FragmentBuilder(nfa, {}, {}, {}, None)
            if not fast:
                fb._byte_chain = lambda mask, lo, hi, start, fb=fb, e=e: fb._repeat_built(e.items[1], start)
            s0 = nfa.new(before)
            end = fb.build(e, s0, splice=False)
            nfas.append((end, nfa.n, nfa.eps, nfa.byt, nfa.call))
        assert nfas[0] == nfas[1], (lo, hi)
