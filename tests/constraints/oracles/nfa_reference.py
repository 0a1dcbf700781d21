"""Pure-Python references the fast automaton paths are tested against: subset
construction (:func:`determinize_reference`), Moore partition refinement
(:func:`moore_blocks`) and the byte classes of masks (:func:`byte_classes`,
:func:`mask_classes`). Used by the tests only."""

from __future__ import annotations

import time

import numpy as np

from deepinfer.constraints.automaton.nfa import NFA, Alphabet, Limits, RawDFA
from deepinfer.constraints.errors import ConstraintTooComplex


def byte_classes(masks: set[int]) -> tuple[np.ndarray, list[int]]:
    """Partition 0..255 by membership in every mask.

    Returns ``cls`` (byte → class id, int32 [256]; classes numbered by their first byte)
    and ``reps`` (each class's first byte); :func:`mask_classes` maps a mask to its classes.
    """
    a = Alphabet(masks)
    return a.cls, a.reps


def mask_classes(mask: int, cls: np.ndarray, reps: list[int]) -> list[int]:
    """The class ids a byte mask covers (every byte of a class behaves alike)."""
    return [c for c, b in enumerate(reps) if (mask >> b) & 1]


def determinize_reference(
    nfa: NFA, start: int, accept: int, cls: np.ndarray, reps: list[int], limits: Limits
) -> RawDFA:
    """Subset construction in Python: the reference ``nfa.determinize`` is tested against."""

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


def moore_blocks(table: np.ndarray, acc: np.ndarray, calls: list, block: np.ndarray) -> np.ndarray:
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
        new_block = partition(np.column_stack([block, call_sig, block[table]]), coef)
        count = int(new_block.max()) + 1
        if count == n_blocks:
            return block
        block, n_blocks = new_block, count


def partition(sig: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Block ids of equal rows of ``sig``: two 64-bit row hashes, then an exact check
    (falls back to sorting whole rows in the astronomically rare collision)."""
    h = np.stack([(sig * c).sum(axis=1) for c in coef], axis=1)  # wrapping int64 arithmetic
    _, first, inv = np.unique(
        h[:, 0] ^ (h[:, 1] * np.int64(0x9E3779B97F4A7C15 - 2**64)), return_index=True, return_inverse=True
    )
    inv = inv.reshape(-1)
    if (sig == sig[first[inv]]).all():
        return inv.astype(np.int64)
    _, inv = np.unique(sig, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)
