"""DFA minimisation over the live transitions only (:func:`minimize_sparse_kernel`).

Same contract and result, numbering included, as the previous ``minimize_kernel``
(dense; kept in ``tests/constraints/oracles/previous_kernels.py`` for the tests). That one
completes the DFA with a dead sink and inverts all ``n x k`` transitions; a constraint's DFA
is sparse (a key literal state has one live move out of ~60 classes), so here the dead sink
stays implicit: it is never split (its states all move to it and never accept) and, being
the one initial block Hopcroft may leave out of the worklist, never a splitter. Refinement
then costs the live transitions, O(m log n), and memory O(n + m + k) instead of several
``n x k`` arrays (whose fresh pages the kernel spent most of its time faulting in).
"""

from __future__ import annotations

import numpy as np

from ..native import kernel


def _minimize_sparse_py(table, accepting, live, calls):
    """The minimal DFA of the live part of a DFA (start: state 0, which must be live).

    ``table`` int32 [n, C] (-1 dead), ``calls`` int64 [n, R] (target of each call symbol,
    or -1). Returns (table int32 [m, C], accepting [m], calls int64 [m, R]) over the
    equivalence classes reachable from the start, numbered breadth-first with successors
    in symbol order (classes, then calls)."""
    n, cb = table.shape
    r = calls.shape[1]
    k = cb + r
    new = np.full(n, -1, dtype=np.int64)  # live states, renumbered
    n_live = 0
    for s in range(n):
        if live[s]:
            new[s] = n_live
            n_live += 1
    old = np.empty(n_live, dtype=np.int64)
    for s in range(n):
        if live[s]:
            old[new[s]] = s
    # inverse live transitions, CSR by target: (symbol, source) pairs
    ptr = np.zeros(n_live + 1, dtype=np.int64)
    for s in range(n):
        if live[s]:
            for c in range(k):
                t = table[s, c] if c < cb else calls[s, c - cb]
                if t >= 0 and live[t]:
                    ptr[new[t] + 1] += 1
    for x in range(n_live):
        ptr[x + 1] += ptr[x]
    m = ptr[n_live]
    inv_c = np.empty(m, dtype=np.int64)
    inv_s = np.empty(m, dtype=np.int64)
    fill = ptr[:-1].copy()
    for s in range(n):
        if live[s]:
            for c in range(k):
                t = table[s, c] if c < cb else calls[s, c - cb]
                if t >= 0 and live[t]:
                    q = fill[new[t]]
                    inv_c[q] = c
                    inv_s[q] = new[s]
                    fill[new[t]] += 1
    # the partition: block b holds elems[first[b]:end[b]], its marked states first
    # (elems[first[b]:mid[b]]); initial blocks: live non-accepting (0), accepting (1)
    first = np.zeros(n_live + 2, dtype=np.int64)
    end = np.zeros(n_live + 2, dtype=np.int64)
    n_acc = 0
    for x in range(n_live):
        if accepting[old[x]]:
            n_acc += 1
    end[0] = n_live - n_acc
    first[1] = end[0]
    end[1] = end[0]
    elems = np.empty(n_live, dtype=np.int64)
    loc = np.empty(n_live, dtype=np.int64)
    blk = np.empty(n_live, dtype=np.int64)
    fill0 = 0
    for x in range(n_live):
        b = 1 if accepting[old[x]] else 0
        q = fill0 if b == 0 else end[1]
        if b == 0:
            fill0 += 1
        else:
            end[1] += 1
        elems[q] = x
        loc[x] = q
        blk[x] = b
    n_blocks = 2
    mid = first.copy()
    work = np.empty(n_live + 2, dtype=np.int64)
    top = 0
    for b in range(2):
        if end[b] > first[b]:
            work[top] = b
            top += 1
    head = np.full(k, -1, dtype=np.int64)  # per symbol: the splitter's predecessors, linked
    p_val = np.empty(m, dtype=np.int64)
    p_next = np.empty(m, dtype=np.int64)
    syms = np.empty(k, dtype=np.int64)
    touched = np.empty(n_live + 2, dtype=np.int64)
    while top > 0:
        top -= 1
        a = work[top]
        n_p = 0
        n_syms = 0
        for q in range(first[a], end[a]):  # gather first: splitting may reorder a
            t = elems[q]
            for p in range(ptr[t], ptr[t + 1]):
                c = inv_c[p]
                if head[c] < 0:
                    syms[n_syms] = c
                    n_syms += 1
                p_val[n_p] = inv_s[p]
                p_next[n_p] = head[c]
                head[c] = n_p
                n_p += 1
        for g in range(n_syms):
            c = syms[g]
            nt = 0
            p = head[c]
            head[c] = -1
            while p >= 0:
                s = p_val[p]
                p = p_next[p]
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
            for j in range(nt):
                x = touched[j]
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
                top += 1
    # breadth-first numbering of the blocks reachable from the start
    new_id = np.full(n_blocks, -1, dtype=np.int64)
    queue = np.empty(n_blocks, dtype=np.int64)
    b0 = blk[new[0]]
    new_id[b0] = 0
    queue[0] = b0
    n_out = 1
    h = 0
    while h < n_out:
        b = queue[h]
        h += 1
        s = old[elems[first[b]]]
        for c in range(k):
            t = table[s, c] if c < cb else calls[s, c - cb]
            if t >= 0 and live[t]:
                nb = blk[new[t]]
                if new_id[nb] < 0:
                    new_id[nb] = n_out
                    queue[n_out] = nb
                    n_out += 1
    out = np.full((n_out, cb), -1, dtype=np.int32)
    out_calls = np.full((n_out, r), -1, dtype=np.int64)
    out_acc = np.zeros(n_out, dtype=np.bool_)
    for i in range(n_out):
        s = old[elems[first[queue[i]]]]
        out_acc[i] = accepting[s]
        for c in range(k):
            t = table[s, c] if c < cb else calls[s, c - cb]
            if t >= 0 and live[t]:
                if c < cb:
                    out[i, c] = new_id[blk[new[t]]]
                else:
                    out_calls[i, c - cb] = new_id[blk[new[t]]]
    return out, out_acc, out_calls


minimize_sparse_kernel = kernel(_minimize_sparse_py, __name__, "minimize_sparse_kernel")
