"""The previous numba kernels of subset construction and minimisation, kept as references.

``determinize_kernel`` (replaced by :func:`deepinfer.constraints.automaton.subset.subsets_kernel`)
and ``minimize_kernel`` (dense; replaced by
:func:`deepinfer.constraints.automaton.minimize.minimize_sparse_kernel`): the tests check the
fast kernels against them, result and numbering included. Used by no library code.
"""

from __future__ import annotations

import numpy as np

from deepinfer.constraints.automaton.dfa_kernels import grow, grow_rows, hopcroft

try:
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None

_hopcroft = hopcroft  # what _minimize_py calls


def _hash_run(pool, lo, hi):
    h = np.uint64(1469598103934665603)
    for j in range(lo, hi):
        h = (h ^ np.uint64(pool[j])) * np.uint64(1099511628211)
    return h ^ np.uint64(hi - lo)


def _closure(s0, eps_ptr, eps_idx, important, stamp, tick, dfs, pool, used):
    """Append the important states epsilon-reachable from ``s0`` to ``pool`` (sorted)."""
    top = 1
    dfs[0] = s0
    stamp[s0] = tick
    lo = used
    while top > 0:
        top -= 1
        u = dfs[top]
        if important[u]:
            pool = grow(pool, used + 1)
            pool[used] = u
            used += 1
        for q in range(eps_ptr[u], eps_ptr[u + 1]):
            v = eps_idx[q]
            if stamp[v] != tick:
                stamp[v] = tick
                dfs[top] = v
                top += 1
    pool[lo:used] = np.sort(pool[lo:used])
    return pool, used


def _determinize_py(
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
    start,
    accept,
    n_classes,
    max_states,
    max_work,
):
    """Subset construction over byte classes and call symbols (the kernel of
    :func:`deepinfer.constraints.nfa.determinize`).

    The NFA comes as CSR arrays: epsilon edges (``eps_ptr``/``eps_idx``), byte edges
    ``e_mask``/``e_dst`` per state (``e_ptr``) whose mask ids list their classes in
    ``m_cls[m_ptr[m]:m_ptr[m + 1]]``, call edges ``c_rule``/``c_dst`` (``c_ptr``); a subset
    holds only ``important`` states (with edges, or ``accept``). Returns ``(status, table
    [n, n_classes], accepting [n], call_src, call_rule, call_dst)``: status 0 ok, 1 over
    ``max_states``, 2 over ``max_work`` (pairs examined: the time bound).
    """
    n = important.shape[0]
    clo_lo = np.full(n, -1, dtype=np.int64)  # epsilon closure of each NFA state, memoised
    clo_hi = np.zeros(n, dtype=np.int64)
    clo_pool = np.empty(1024, dtype=np.int64)
    clo_used = 0
    stamp = np.zeros(n, dtype=np.int64)  # visited marks of the closure DFS
    tick = 0
    mark = np.zeros(n, dtype=np.int64)  # members of the union being built
    mark_tick = 0
    dfs = np.empty(n, dtype=np.int64)
    sub_lo = np.empty(64, dtype=np.int64)  # subsets: runs of sub_pool, found by hash
    sub_hi = np.empty(64, dtype=np.int64)
    sub_pool = np.empty(1024, dtype=np.int64)
    sub_used = 0
    n_sub = 0
    cap = 1024
    slots = np.full(cap, -1, dtype=np.int64)
    table = np.full((64, n_classes), -1, dtype=np.int32)
    accepting = np.zeros(64, dtype=np.bool_)
    call_src = np.empty(16, dtype=np.int64)
    call_rule = np.empty(16, dtype=np.int64)
    call_dst = np.empty(16, dtype=np.int64)
    n_calls = 0
    keys = np.empty(256, dtype=np.int64)
    buf = np.empty(256, dtype=np.int64)
    prev = np.empty(256, dtype=np.int64)
    work = 0
    buf[0] = start
    i = -1  # the subset being expanded; -1 makes the start subset (closure of ``start``)
    while i < n_sub:
        n_pairs = 0
        if i >= 0:
            # (symbol, target) keys of subset i: classes, then calls as n_classes + rule
            for j in range(sub_lo[i], sub_hi[i]):
                s = sub_pool[j]
                if s == accept:
                    accepting[i] = True
                for e in range(e_ptr[s], e_ptr[s + 1]):
                    m = e_mask[e]
                    t = e_dst[e]
                    keys = grow(keys, n_pairs + m_ptr[m + 1] - m_ptr[m])
                    for q in range(m_ptr[m], m_ptr[m + 1]):
                        keys[n_pairs] = m_cls[q] * n + t
                        n_pairs += 1
                for e in range(c_ptr[s], c_ptr[s + 1]):
                    keys = grow(keys, n_pairs + 1)
                    keys[n_pairs] = (n_classes + c_rule[e]) * n + c_dst[e]
                    n_pairs += 1
            work += n_pairs
            if work > max_work:
                return 2, table[:n_sub], accepting[:n_sub], call_src[:0], call_rule[:0], call_dst[:0]
            keys[:n_pairs] = np.sort(keys[:n_pairs])
        n_prev = -1
        prev_id = -1
        g = 0
        while g < n_pairs or i < 0:
            if i < 0:
                sym = -1
                nt = 1  # buf[0] = start
            else:
                sym = keys[g] // n
                nt = 0
                while g < n_pairs and keys[g] // n == sym:
                    t = keys[g] - sym * n
                    if nt == 0 or buf[nt - 1] != t:
                        buf = grow(buf, nt + 1)
                        buf[nt] = t
                        nt += 1
                    g += 1
            same = nt == n_prev  # the previous symbol's targets: the same subset
            if same:
                for k in range(nt):
                    if buf[k] != prev[k]:
                        same = False
                        break
            if same:
                j_id = prev_id
            else:
                prev = grow(prev, nt)
                prev[:nt] = buf[:nt]
                n_prev = nt
                # the union of the targets' closures, sorted, at the end of sub_pool
                lo = sub_used
                for k in range(nt):
                    s0 = buf[k]
                    if clo_lo[s0] < 0:
                        tick += 1
                        c_lo = clo_used
                        clo_pool, clo_used = _closure(
                            s0, eps_ptr, eps_idx, important, stamp, tick, dfs, clo_pool, clo_used
                        )
                        clo_lo[s0] = c_lo
                        clo_hi[s0] = clo_used
                    if nt == 1:
                        sub_pool = grow(sub_pool, sub_used + clo_hi[s0] - clo_lo[s0])
                        for q in range(clo_lo[s0], clo_hi[s0]):
                            sub_pool[sub_used] = clo_pool[q]
                            sub_used += 1
                        continue
                    if k == 0:
                        mark_tick += 1
                    for q in range(clo_lo[s0], clo_hi[s0]):
                        u = clo_pool[q]
                        if mark[u] != mark_tick:
                            mark[u] = mark_tick
                            sub_pool = grow(sub_pool, sub_used + 1)
                            sub_pool[sub_used] = u
                            sub_used += 1
                hi = sub_used
                if nt > 1:
                    sub_pool[lo:hi] = np.sort(sub_pool[lo:hi])
                # intern the subset
                slot = np.int64(_hash_run(sub_pool, lo, hi) & np.uint64(cap - 1))
                j_id = -1
                while slots[slot] >= 0:
                    k2 = slots[slot]
                    if sub_hi[k2] - sub_lo[k2] == hi - lo:
                        eq = True
                        for q in range(hi - lo):
                            if sub_pool[sub_lo[k2] + q] != sub_pool[lo + q]:
                                eq = False
                                break
                        if eq:
                            j_id = k2
                            break
                    slot = (slot + 1) & (cap - 1)
                if j_id >= 0:
                    sub_used = lo  # seen before: drop the copy
                else:
                    if n_sub >= max_states:
                        return 1, table[:n_sub], accepting[:n_sub], call_src[:0], call_rule[:0], call_dst[:0]
                    j_id = n_sub
                    sub_lo = grow(sub_lo, n_sub + 1)
                    sub_hi = grow(sub_hi, n_sub + 1)
                    sub_lo[j_id] = lo
                    sub_hi[j_id] = hi
                    slots[slot] = j_id
                    n_sub += 1
                    table, accepting = grow_rows(table, accepting, n_sub)
                    if 2 * n_sub > cap:  # rehash at half load
                        cap *= 2
                        slots = np.full(cap, -1, dtype=np.int64)
                        for k2 in range(n_sub):
                            sl = np.int64(_hash_run(sub_pool, sub_lo[k2], sub_hi[k2]) & np.uint64(cap - 1))
                            while slots[sl] >= 0:
                                sl = (sl + 1) & (cap - 1)
                            slots[sl] = k2
                prev_id = j_id
            if i < 0:
                break
            if sym < n_classes:
                table[i, sym] = j_id
            else:
                call_src = grow(call_src, n_calls + 1)
                call_rule = grow(call_rule, n_calls + 1)
                call_dst = grow(call_dst, n_calls + 1)
                call_src[n_calls] = i
                call_rule[n_calls] = sym - n_classes
                call_dst[n_calls] = j_id
                n_calls += 1
        i += 1
    return 0, table[:n_sub], accepting[:n_sub], call_src[:n_calls], call_rule[:n_calls], call_dst[:n_calls]


def _minimize_py(table, accepting, live, calls):
    """The minimal DFA of the live part of a DFA (start: state 0, which must be live).

    ``table`` int32 [n, C] (-1 dead), ``calls`` int64 [n, R]: the target of each call
    symbol or -1. Dead and non-live targets become -1. States of the result are the
    equivalence classes (:func:`_hopcroft_py`) reachable from the start, numbered
    breadth-first with successors in symbol order. Returns (table, accepting, calls).
    """
    n, c_bytes = table.shape
    r = calls.shape[1]
    k = c_bytes + r
    dead = n
    full = np.full((n + 1, k), dead, dtype=np.int64)
    for s in range(n):
        if not live[s]:
            continue
        for c in range(k):
            t = table[s, c] if c < c_bytes else calls[s, c - c_bytes]
            if t >= 0 and live[t]:
                full[s, c] = t
    init = np.zeros(n + 1, dtype=np.int64)  # 0: dead or not live; 1: live; 2: live, accepting
    for s in range(n):
        if live[s]:
            init[s] = 2 if accepting[s] else 1
    # symbols whose columns are equal refine alike: Hopcroft needs one of each
    col_hash = np.zeros(k, dtype=np.uint64)
    for c in range(k):
        col_hash[c] = _hash_run(full[:, c].copy(), 0, n + 1)
    keep = np.zeros(k, dtype=np.bool_)
    for c in range(k):
        keep[c] = True
        for c2 in range(c):
            if keep[c2] and col_hash[c2] == col_hash[c]:
                same = True
                for s in range(n + 1):
                    if full[s, c] != full[s, c2]:
                        same = False
                        break
                if same:
                    keep[c] = False
                    break
    blk = _hopcroft(np.ascontiguousarray(full[:, keep]), init)
    dead_blk = blk[dead]
    n_blk = 0
    for s in range(n + 1):
        if blk[s] + 1 > n_blk:
            n_blk = blk[s] + 1
    rep = np.full(n_blk, -1, dtype=np.int64)
    for s in range(n + 1):
        if rep[blk[s]] < 0:
            rep[blk[s]] = s
    new_id = np.full(n_blk, -1, dtype=np.int64)
    queue = np.empty(n_blk, dtype=np.int64)
    new_id[blk[0]] = 0
    queue[0] = blk[0]
    m = 1
    h = 0
    while h < m:
        b = queue[h]
        h += 1
        s = rep[b]
        for c in range(k):
            nb = blk[full[s, c]]
            if nb != dead_blk and new_id[nb] < 0:
                new_id[nb] = m
                queue[m] = nb
                m += 1
    out = np.full((m, c_bytes), -1, dtype=np.int32)
    out_calls = np.full((m, r), -1, dtype=np.int64)
    out_acc = np.zeros(m, dtype=np.bool_)
    for i in range(m):
        s = rep[queue[i]]
        out_acc[i] = accepting[s]
        for c in range(k):
            nb = blk[full[s, c]]
            if nb != dead_blk:
                if c < c_bytes:
                    out[i, c] = new_id[nb]
                else:
                    out_calls[i, c - c_bytes] = new_id[nb]
    return out, out_acc, out_calls


if njit is not None:
    _hash_run = njit(cache=True, nogil=True)(_hash_run)
    _closure = njit(cache=True, nogil=True)(_closure)
    determinize_kernel = njit(cache=True, nogil=True)(_determinize_py)
    minimize_kernel = njit(cache=True, nogil=True)(_minimize_py)
else:  # pragma: no cover
    determinize_kernel = _determinize_py
    minimize_kernel = _minimize_py
