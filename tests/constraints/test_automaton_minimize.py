"""The bottom-up minimisation against Moore refinement (the reference) on random DFAs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer.constraints.nfa import RawDFA, _moore_blocks, live_states, minimize


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
    moore = _moore_blocks(table, acc, [[] for _ in range(n + 1)], init)
    reachable_moore = len({int(moore[s]) for s in _reachable(table, n)} - {int(moore[n])})
    assert len(m.accepting) >= reachable_moore
    if not cyclic:
        assert len(m.accepting) == reachable_moore


def _reachable(table, dead):
    seen, work = {0}, [0]
    while work:
        s = work.pop()
        for t in table[s].tolist():
            if t != dead and t not in seen:
                seen.add(t)
                work.append(t)
    return seen
