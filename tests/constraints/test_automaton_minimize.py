"""Hopcroft minimisation (numba) against Moore refinement (the reference) on random DFAs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer.constraints.automaton.dfa_kernels import _hopcroft_py
from deepinfer.constraints.automaton.nfa import RawDFA, equivalent_blocks, live_states, minimize

from .oracles.nfa_reference import moore_blocks
from .test_nfa_fast_paths import _random_nfa, _same_dfa


def random_dfa(rng: random.Random, n: int, n_classes: int, cyclic: bool) -> RawDFA:
    table = np.full((n, n_classes), -1, dtype=np.int32)
    for s in range(n):
        for c in range(n_classes):
            if rng.random() < 0.6:
                t = rng.randrange(n) if cyclic else rng.randrange(s + 1, n + 1)
                table[s, c] = t if t < n else -1
    acc = np.array([rng.random() < 0.3 for _ in range(n)])
    return RawDFA(table, acc, [[] for _ in range(n)])


def run(d: RawDFA, word: list[int]) -> bool:
    s = 0
    for c in word:
        s = int(d.table[s, c])
        if s < 0:
            return False
    return bool(d.accepting[s])


@pytest.mark.parametrize("seed", range(30))
def test_minimize_keeps_the_language_and_matches_moore_on_acyclic(seed):
    rng = random.Random(seed)
    cyclic = seed % 2 == 0
    d = random_dfa(rng, rng.randint(2, 40), rng.randint(1, 4), cyclic)
    live = live_states(d, set())
    if not live[0]:
        assert len(minimize(d, live, set()).accepting) == 0
        return
    m = minimize(d, live, set())
    for _ in range(300):
        w = [rng.randrange(d.table.shape[1]) for _ in range(rng.randint(0, 12))]
        assert run(d, w) == run(m, w), w
    # the reference partition: Moore over the live part
    n = len(d.accepting)
    table = np.where(d.table < 0, n, d.table)
    table = np.where(np.append(live, False)[table], table, n)
    table = np.vstack([table, np.full((1, d.table.shape[1]), n)])
    acc = np.append(d.accepting & live, False)
    init = np.unique(np.where(np.append(live, False), acc, -1), return_inverse=True)[1].reshape(-1)
    moore = moore_blocks(table, acc, [[] for _ in range(n + 1)], init)
    reachable_moore = len({int(moore[s]) for s in _reachable(table, n)} - {int(moore[n])})
    assert len(m.accepting) == reachable_moore  # minimal, cycles included


@pytest.mark.parametrize("seed", range(40))
def test_hopcroft_blocks_equal_moore_with_call_edges(seed):
    # complete DFAs (a sink included), random initial labels and call edges as extra symbols
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    k = int(rng.integers(1, 5))
    table = rng.integers(0, n + 1, size=(n + 1, k))
    table[n] = n
    init = rng.integers(0, 3, size=n + 1)
    calls = [[] for _ in range(n + 1)]
    for s in range(n):
        for r in range(2):
            if rng.random() < 0.2:
                calls[s].append((r, int(rng.integers(0, n))))  # missing = the sink
    fast = equivalent_blocks(table, calls, init, n)
    _, lab = np.unique(init, return_inverse=True)
    ref = moore_blocks(table, np.zeros(n + 1, bool), calls, lab.reshape(-1).astype(np.int64))
    # the same partition: a bijection between labels
    pairs = set(zip(fast.tolist(), ref.tolist()))
    assert len(pairs) == len(set(fast.tolist())) == len(set(ref.tolist()))
    # the pure-Python kernel is the one numba compiles
    assert (
        _hopcroft_py(np.ascontiguousarray(table.astype(np.int64)), lab.reshape(-1).astype(np.int64))
        == equivalent_blocks(table, [], init, n)
    ).all()


def _reachable(table, dead):
    seen, work = {0}, [0]
    while work:
        s = work.pop()
        for t in table[s].tolist():
            if t != dead and t not in seen:
                seen.add(t)
                work.append(t)
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_numba_determinize_equals_the_python_reference(seed):
    from deepinfer.constraints.automaton.nfa import Limits, determinize

    from .oracles.nfa_reference import determinize_reference

    rng = random.Random(seed)
    n_classes = rng.randint(1, 5)
    nfa = _random_nfa(rng, rng.randint(1, 30), n_classes)
    cls = np.arange(256, dtype=np.int32) % n_classes  # class c = bytes b with b % n == c
    reps = list(range(n_classes))
    accept = rng.randrange(nfa.n)
    fast = determinize(nfa, 0, accept, cls, reps, Limits())
    ref = determinize_reference(nfa, 0, accept, cls, reps, Limits())
    assert len(fast.accepting) == len(ref.accepting)
    assert int(fast.accepting.sum()) == int(ref.accepting.sum())
    _same_dfa(fast, ref)  # the same automaton up to numbering (a lockstep walk from the start)


@pytest.mark.parametrize("seed", range(20))
def test_byte_classes_partition_bytes_by_mask_membership(seed):
    from .oracles.nfa_reference import byte_classes, mask_classes

    rng = random.Random(seed)
    masks = {rng.getrandbits(256) & rng.getrandbits(256) for _ in range(rng.randint(0, 12))}
    masks |= {1 << rng.randrange(256) for _ in range(rng.randint(0, 4))}
    cls, reps = byte_classes(masks)
    member = [tuple((m >> b) & 1 for m in sorted(masks)) for b in range(256)]
    for a in range(256):
        for b in range(a, 256, 7):
            assert (cls[a] == cls[b]) == (member[a] == member[b])
    assert reps == sorted(reps) and [int(cls[b]) for b in reps] == list(range(len(reps)))
    for m in masks:  # a mask is a union of whole classes
        covered = set(mask_classes(m, cls, reps))
        assert all(((m >> b) & 1) == (int(cls[b]) in covered) for b in range(256))


@pytest.mark.parametrize("seed", range(30))
def test_product_accepts_the_intersection_or_difference(seed):
    from deepinfer.constraints.automaton.nfa import Limits, product

    rng = random.Random(seed)
    k = rng.randint(1, 3)
    d1 = random_dfa(rng, rng.randint(1, 12), k, cyclic=True)
    d2 = random_dfa(rng, rng.randint(0, 12), k, cyclic=True)
    for mode in ("and", "diff"):
        p = product(d1, d2, mode, Limits())
        for _ in range(300):
            w = [rng.randrange(k) for _ in range(rng.randint(0, 8))]
            a, b = run(d1, w), len(d2.accepting) > 0 and run(d2, w)
            want = (a and b) if mode == "and" else (a and not b)
            assert (len(p.accepting) > 0 and run(p, w)) == want, (mode, w)


def _product_reference(t1, a1, t2, a2, diff: bool, max_states: int):
    """The reachable product by a dict, pairs numbered as a breadth-first search meets them
    (classes in order): (status, table, accepting), status 1 past ``max_states``."""
    k = t1.shape[1]
    start = (0, 0 if len(t2) else -1)
    number, order, rows = {start: 0}, [start], []
    i = 0
    while i < len(order):
        p, q = order[i]
        row = [-1] * k
        for c in range(k):
            p2 = int(t1[p, c])
            q2 = int(t2[q, c]) if q >= 0 else -1
            if p2 < 0 or (q2 < 0 and not diff):
                continue
            if (p2, q2) not in number:
                if len(order) >= max_states:
                    return 1, None, None
                number[(p2, q2)] = len(order)
                order.append((p2, q2))
            row[c] = number[(p2, q2)]
        rows.append(row)
        i += 1
    acc = [bool(a1[p]) and (not (q >= 0 and a2[q]) if diff else q >= 0 and bool(a2[q])) for p, q in order]
    return 0, np.array(rows, dtype=np.int32).reshape(-1, k), np.array(acc, dtype=bool)


@pytest.mark.parametrize("seed", range(40))
def test_product_kernel_equals_a_plain_search(seed):
    """``product_kernel`` (its rows' arrays grown before each row's loop, the hash table
    rebuilt as it fills) against a dict-based search: the same table, numbering and
    accepting flags, and the same refusal past the state bound; tables up to thousands of
    pairs and 60 classes, so the arrays grow and the hash table is rebuilt several times."""
    from deepinfer.constraints.automaton.dfa_kernels import product_kernel

    rng = np.random.default_rng(seed)
    n1, n2, k = int(rng.integers(1, 60)), int(rng.integers(0, 60)), int(rng.integers(1, 61))
    dead = rng.random()  # share of dead transitions
    t1 = np.where(rng.random((n1, k)) < dead, -1, rng.integers(0, n1, (n1, k))).astype(np.int32)
    t2 = np.where(rng.random((n2, k)) < dead, -1, rng.integers(0, max(n2, 1), (n2, k))).astype(np.int32)
    a1, a2 = rng.random(n1) < 0.5, rng.random(n2) < 0.5
    for diff in (False, True):
        for bound in (10**6, int(rng.integers(1, 200))):
            got = product_kernel(t1, a1, t2, a2, diff, bound)
            want = _product_reference(t1, a1, t2, a2, diff, bound)
            assert got[0] == want[0], (diff, bound)
            if want[0] == 0:
                assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])
