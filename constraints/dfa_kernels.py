"""numba kernels of automaton construction: subset construction and Hopcroft minimisation.

Plain functions over int arrays, compiled by numba when it is installed (a listed
dependency; without it they run as Python, slowly but the same). ``determinize_kernel``
and ``hopcroft`` are the compiled entry points; the ``*_py`` names stay pure Python
for the tests that check them against references.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None


def _grow(a, need):
    """``a`` if it holds ``need`` entries, else a copy at least twice as large."""
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


def _grow_rows(table, accepting, need):
    """A DFA table (rows -1) and its accepting flags with room for ``need`` states."""
    if need <= table.shape[0]:
        return table, accepting
    size = max(need, 2 * table.shape[0])
    t2 = np.full((size, table.shape[1]), -1, dtype=np.int32)
    t2[: table.shape[0]] = table
    a2 = np.zeros(size, dtype=np.bool_)
    a2[: accepting.shape[0]] = accepting
    return t2, a2


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
            pool = _grow(pool, used + 1)
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


def _determinize_py(eps_ptr, eps_idx, important, e_ptr, e_mask, e_dst, m_ptr, m_cls, c_ptr, c_rule, c_dst,
                    start, accept, n_classes, max_states, max_work):
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
                    keys = _grow(keys, n_pairs + m_ptr[m + 1] - m_ptr[m])
                    for q in range(m_ptr[m], m_ptr[m + 1]):
                        keys[n_pairs] = m_cls[q] * n + t
                        n_pairs += 1
                for e in range(c_ptr[s], c_ptr[s + 1]):
                    keys = _grow(keys, n_pairs + 1)
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
                        buf = _grow(buf, nt + 1)
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
                prev = _grow(prev, nt)
                prev[:nt] = buf[:nt]
                n_prev = nt
                # the union of the targets' closures, sorted, at the end of sub_pool
                lo = sub_used
                for k in range(nt):
                    s0 = buf[k]
                    if clo_lo[s0] < 0:
                        tick += 1
                        c_lo = clo_used
                        clo_pool, clo_used = _closure(s0, eps_ptr, eps_idx, important, stamp, tick, dfs,
                                                      clo_pool, clo_used)
                        clo_lo[s0] = c_lo
                        clo_hi[s0] = clo_used
                    if nt == 1:
                        sub_pool = _grow(sub_pool, sub_used + clo_hi[s0] - clo_lo[s0])
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
                            sub_pool = _grow(sub_pool, sub_used + 1)
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
                    sub_lo = _grow(sub_lo, n_sub + 1)
                    sub_hi = _grow(sub_hi, n_sub + 1)
                    sub_lo[j_id] = lo
                    sub_hi[j_id] = hi
                    slots[slot] = j_id
                    n_sub += 1
                    table, accepting = _grow_rows(table, accepting, n_sub)
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
                call_src = _grow(call_src, n_calls + 1)
                call_rule = _grow(call_rule, n_calls + 1)
                call_dst = _grow(call_dst, n_calls + 1)
                call_src[n_calls] = i
                call_rule[n_calls] = sym - n_classes
                call_dst[n_calls] = j_id
                n_calls += 1
        i += 1
    return 0, table[:n_sub], accepting[:n_sub], call_src[:n_calls], call_rule[:n_calls], call_dst[:n_calls]


def _hopcroft_py(table, init):
    """Coarsest partition of a complete DFA compatible with ``init`` (Hopcroft).

    ``table``: int64 [n, K], every entry a state (a dead sink included); ``init``: int64
    [n] initial block labels 0..b-1. Returns the block of each state (int64 [n]); two
    states share a block iff no word tells them apart. O(K n log n).
    """
    n, k = table.shape
    # inverse transitions, CSR keyed by (symbol, target)
    ptr = np.zeros(k * n + 1, dtype=np.int64)
    for s in range(n):
        for c in range(k):
            ptr[c * n + table[s, c] + 1] += 1
    for i in range(k * n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    src = np.empty(k * n, dtype=np.int64)
    for s in range(n):
        for c in range(k):
            key = c * n + table[s, c]
            src[fill[key]] = s
            fill[key] += 1
    # the partition: block b holds elems[first[b]:end[b]]; its marked states come first,
    # elems[first[b]:mid[b]]
    n_blocks = 0
    for s in range(n):
        if init[s] + 1 > n_blocks:
            n_blocks = init[s] + 1
    first = np.zeros(n + 1, dtype=np.int64)
    end = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        end[init[s]] += 1
    acc = 0
    for b in range(n_blocks):
        first[b] = acc
        acc += end[b]
        end[b] = first[b]
    elems = np.empty(n, dtype=np.int64)
    loc = np.empty(n, dtype=np.int64)
    blk = init.copy()
    for s in range(n):
        b = init[s]
        elems[end[b]] = s
        loc[s] = end[b]
        end[b] += 1
    mid = first.copy()
    work = np.empty(n + 1, dtype=np.int64)
    in_work = np.zeros(n + 1, dtype=np.bool_)
    # every initial block but one is a splitter: the DFA is complete, so splitting by all
    # the others splits by the last too. Leave out the one with the most incoming
    # transitions (the dead sink's block, typically: most entries of a sparse DFA)
    indeg = np.zeros(n_blocks, dtype=np.int64)
    for s in range(n):
        for c in range(k):
            indeg[init[s]] += ptr[c * n + s + 1] - ptr[c * n + s]
    skip = -1
    for b in range(n_blocks):
        if end[b] > first[b] and (skip < 0 or indeg[b] > indeg[skip]):
            skip = b
    top = 0
    for b in range(n_blocks):
        if end[b] > first[b] and b != skip:
            work[top] = b
            in_work[b] = True
            top += 1
    snap = np.empty(n, dtype=np.int64)
    touched = np.empty(n + 1, dtype=np.int64)
    while top > 0:
        top -= 1
        a = work[top]
        in_work[a] = False
        m = end[a] - first[a]
        for j in range(m):
            snap[j] = elems[first[a] + j]
        for c in range(k):
            nt = 0
            for j in range(m):
                key = c * n + snap[j]
                for p in range(ptr[key], ptr[key + 1]):
                    s = src[p]
                    x = blk[s]
                    pos = loc[s]
                    if pos < mid[x]:
                        continue  # already marked
                    if mid[x] == first[x]:
                        touched[nt] = x
                        nt += 1
                    q = mid[x]
                    u = elems[q]
                    elems[q] = s
                    loc[s] = q
                    elems[pos] = u
                    loc[u] = pos
                    mid[x] += 1
            for i in range(nt):
                x = touched[i]
                if mid[x] == end[x]:
                    mid[x] = first[x]
                    continue
                y = n_blocks
                n_blocks += 1
                # the smaller part becomes the new block (relabelling costs its size)
                if mid[x] - first[x] <= end[x] - mid[x]:
                    first[y] = first[x]
                    end[y] = mid[x]
                    first[x] = mid[x]
                else:
                    first[y] = mid[x]
                    end[y] = end[x]
                    end[x] = mid[x]
                mid[x] = first[x]
                mid[y] = first[y]
                for q in range(first[y], end[y]):
                    blk[elems[q]] = y
                # x in the worklist: both parts now are; else the smaller part suffices
                work[top] = y
                in_work[y] = True
                top += 1
    return blk


def _live_py(table, accepting, call_src, call_dst):
    """States from which an accepting state is reachable (byte edges of ``table``, -1
    dead, and the call edges ``call_src[i] -> call_dst[i]``)."""
    n, k = table.shape
    cnt = np.zeros(n + 1, dtype=np.int64)  # reverse edges, CSR by target
    for s in range(n):
        for c in range(k):
            if table[s, c] >= 0:
                cnt[table[s, c] + 1] += 1
    for i in range(call_src.shape[0]):
        cnt[call_dst[i] + 1] += 1
    for i in range(n):
        cnt[i + 1] += cnt[i]
    fill = cnt[:-1].copy()
    pred = np.empty(cnt[n], dtype=np.int64)
    for s in range(n):
        for c in range(k):
            t = table[s, c]
            if t >= 0:
                pred[fill[t]] = s
                fill[t] += 1
    for i in range(call_src.shape[0]):
        pred[fill[call_dst[i]]] = call_src[i]
        fill[call_dst[i]] += 1
    live = accepting.copy()
    stack = np.empty(n, dtype=np.int64)
    top = 0
    for s in range(n):
        if live[s]:
            stack[top] = s
            top += 1
    while top > 0:
        top -= 1
        t = stack[top]
        for q in range(cnt[t], cnt[t + 1]):
            s = pred[q]
            if not live[s]:
                live[s] = True
                stack[top] = s
                top += 1
    return live


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


def _product_py(t1, a1, t2, a2, mode_diff, max_states):
    """Reachable product of two call-free DFAs over the same classes (``t2`` may have no
    states: then every pair is (p, dead)). ``mode_diff``: accept where ``a1`` and not
    ``a2``; else where both accept. Returns (status, table, accepting); status 1: over
    ``max_states``."""
    n1, k = t1.shape
    n2 = t2.shape[0]
    w = n2 + 1  # pair key = p * w + (q + 1), q = -1 for dead
    cap = 1024
    slots = np.full(cap, -1, dtype=np.int64)
    pair_key = np.empty(64, dtype=np.int64)
    table = np.full((64, k), -1, dtype=np.int32)
    acc = np.zeros(64, dtype=np.bool_)
    pair_key[0] = 0 * w + (1 if n2 > 0 else 0)
    slots[(pair_key[0] * 0x9E3779B1) & (cap - 1)] = 0
    n = 1
    i = 0
    while i < n:
        p = pair_key[i] // w
        q = pair_key[i] - p * w - 1
        acc[i] = a1[p] and not (q >= 0 and a2[q]) if mode_diff else a1[p] and q >= 0 and a2[q]
        for c in range(k):
            p2 = t1[p, c]
            if p2 < 0:
                continue
            q2 = t2[q, c] if q >= 0 else -1
            if q2 < 0 and not mode_diff:
                continue
            key = p2 * w + q2 + 1
            slot = (key * 0x9E3779B1) & (cap - 1)
            j = -1
            while slots[slot] >= 0:
                if pair_key[slots[slot]] == key:
                    j = slots[slot]
                    break
                slot = (slot + 1) & (cap - 1)
            if j < 0:
                if n >= max_states:
                    return 1, table[:n], acc[:n]
                j = n
                pair_key = _grow(pair_key, n + 1)
                pair_key[j] = key
                slots[slot] = j
                n += 1
                table, acc = _grow_rows(table, acc, n)
                if 2 * n > cap:
                    cap *= 2
                    slots = np.full(cap, -1, dtype=np.int64)
                    for j2 in range(n):
                        sl = (pair_key[j2] * 0x9E3779B1) & (cap - 1)
                        while slots[sl] >= 0:
                            sl = (sl + 1) & (cap - 1)
                        slots[sl] = j2
            table[i, c] = j
        i += 1
    return 0, table[:n], acc[:n]


if njit is not None:
    _grow = njit(cache=True, nogil=True)(_grow)
    _grow_rows = njit(cache=True, nogil=True)(_grow_rows)
    _hash_run = njit(cache=True, nogil=True)(_hash_run)
    _closure = njit(cache=True, nogil=True)(_closure)
    determinize_kernel = njit(cache=True, nogil=True)(_determinize_py)
    hopcroft = njit(cache=True, nogil=True)(_hopcroft_py)
    live_kernel = njit(cache=True, nogil=True)(_live_py)
    product_kernel = njit(cache=True, nogil=True)(_product_py)
else:  # pragma: no cover
    product_kernel = _product_py
    determinize_kernel = _determinize_py
    hopcroft = _hopcroft_py
    live_kernel = _live_py
_hopcroft = hopcroft  # what _minimize_py calls
if njit is not None:
    minimize_kernel = njit(cache=True, nogil=True)(_minimize_py)
else:  # pragma: no cover
    minimize_kernel = _minimize_py
