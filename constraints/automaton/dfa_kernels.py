"""numba kernels of DFAs: Hopcroft partition refinement, live states, products.

Plain functions over int arrays, compiled by numba when it is installed (a listed
dependency; without it they run as Python, slowly but the same). ``hopcroft``,
``live_kernel`` and ``product_kernel`` are the compiled entry points; the ``*_py`` names
stay pure Python for the tests that check them against references. (Subset construction is
:mod:`.subset`, minimisation :mod:`.minimize`.)
"""

from __future__ import annotations

import numpy as np

from ..native import kernel


def grow(a, need):
    """``a`` if it holds ``need`` entries, else a copy at least twice as large."""
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


def grow_rows(table, accepting, need):
    """A DFA table (rows -1) and its accepting flags with room for ``need`` states."""
    if need <= table.shape[0]:
        return table, accepting
    size = max(need, 2 * table.shape[0])
    t2 = np.full((size, table.shape[1]), -1, dtype=np.int32)
    t2[: table.shape[0]] = table
    a2 = np.zeros(size, dtype=np.bool_)
    a2[: accepting.shape[0]] = accepting
    return t2, a2


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


def _backward_py(table, call_src, call_dst, seeds, depth):
    """bool [n]: the states of ``table`` (int [n, C], -1 dead; and the call edges
    ``call_src[i] -> call_dst[i]``) with a path of at most ``depth`` edges into a state of
    ``seeds`` (bool [n]): a breadth-first search over the reversed edges (CSR by target),
    level by level."""
    n, k = table.shape
    cnt = np.zeros(n + 1, dtype=np.int64)
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
    seen = seeds.copy()
    frontier = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    nf = 0
    for s in range(n):
        if seen[s]:
            frontier[nf] = s
            nf += 1
    level = 0
    while level < depth and nf > 0:
        nn = 0
        for j in range(nf):
            t = frontier[j]
            for e in range(cnt[t], cnt[t + 1]):
                s = pred[e]
                if not seen[s]:
                    seen[s] = True
                    nxt[nn] = s
                    nn += 1
        frontier, nxt = nxt, frontier
        nf = nn
        level += 1
    return seen


def _near_py(table, seeds, depth):
    """bool [n]: the states of ``table`` (int [n, C], -1 dead) with a path of at most ``depth``
    transitions into a state of ``seeds`` (bool [n])."""
    no_calls = np.empty(0, dtype=np.int64)
    return _backward(table, no_calls, no_calls, seeds, depth)


def _live_py(table, accepting, call_src, call_dst):
    """States from which an accepting state is reachable (byte edges of ``table``, -1
    dead, and the call edges ``call_src[i] -> call_dst[i]``)."""
    return _backward(table, call_src, call_dst, accepting, table.shape[0])


def _product_py(t1, a1, t2, a2, mode_diff, max_states):
    """Reachable product of two call-free DFAs over the same classes (``t2`` may have no
    states: then every pair is (p, dead)). ``mode_diff``: accept where ``a1`` and not
    ``a2``; else where both accept. Returns (status, table, accepting); status 1: over
    ``max_states``. Pairs are numbered as a breadth-first search meets them, classes in
    order."""
    k = t1.shape[1]
    w = t2.shape[0] + 1  # pair key = p * w + (q + 1), q = -1 for dead
    slots = np.full(1024, -1, dtype=np.int64)  # open addressing: pair key -> pair number
    pair_key = np.empty(64, dtype=np.int64)
    table = np.full((64, k), -1, dtype=np.int32)
    acc = np.zeros(64, dtype=np.bool_)
    pair_key[0] = 1 if t2.shape[0] > 0 else 0
    slots[(pair_key[0] * 0x9E3779B1) & 1023] = 0
    n = 1
    i = 0
    while i < n:
        # room for the k pairs row i may add, made before its loop: the loop reassigns no
        # array (numba keeps such a loop tight; growing inside it took ten times as long)
        if n + k > pair_key.shape[0]:
            pair_key = grow(pair_key, n + k)
            table, acc = grow_rows(table, acc, n + k)
        if 2 * (n + k) > slots.shape[0]:
            cap = slots.shape[0]
            while 2 * (n + k) > cap:
                cap *= 2
            slots = np.full(cap, -1, dtype=np.int64)
            for j in range(n):
                sl = (pair_key[j] * 0x9E3779B1) & (cap - 1)
                while slots[sl] >= 0:
                    sl = (sl + 1) & (cap - 1)
                slots[sl] = j
        m = _product_row(t1, a1, t2, a2, mode_diff, max_states, w, slots, pair_key, table, acc, i, n)
        if m < 0:
            return 1, table[:n], acc[:n]
        n = m
        i += 1
    return 0, table[:n], acc[:n]


def _product_row(t1, a1, t2, a2, mode_diff, max_states, w, slots, pair_key, table, acc, i, n):
    """Row ``i`` of :func:`_product_py`'s product: its accepting flag and its targets, the
    pairs it meets first numbered from ``n`` on. The arrays have room for them. Returns
    the new count, or -1 where it would pass ``max_states``."""
    k = t1.shape[1]
    cap = slots.shape[0]
    p = pair_key[i] // w
    q = pair_key[i] - p * w - 1
    acc[i] = a1[p] and not (q >= 0 and a2[q]) if mode_diff else a1[p] and q >= 0 and a2[q]
    for c in range(k):
        p2 = int(t1[p, c])
        if p2 < 0:
            continue
        q2 = int(t2[q, c]) if q >= 0 else -1
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
                return -1
            j = n
            pair_key[j] = key
            slots[slot] = j
            n += 1
        table[i, c] = j
    return n


grow = kernel(grow, __name__, "grow")
_product_row = kernel(_product_row, __name__, "_product_row")
grow_rows = kernel(grow_rows, __name__, "grow_rows")
hopcroft = kernel(_hopcroft_py, __name__, "hopcroft")
_backward = kernel(_backward_py, __name__, "_backward")
near_kernel = kernel(_near_py, __name__, "near_kernel")
live_kernel = kernel(_live_py, __name__, "live_kernel")
product_kernel = kernel(_product_py, __name__, "product_kernel")
