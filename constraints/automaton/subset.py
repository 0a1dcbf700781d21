"""Subset construction, the numba kernel (:func:`subsets_kernel`).

Same contract as ``determinize_kernel`` (the previous implementation, kept in
``tests/constraints/oracles/previous_kernels.py`` for the tests), and the same DFA, numbering
included; faster:

- targets are bucketed per byte class (linked lists) instead of sorting (class, target)
  keys; a target set of one NFA state maps to its subset through a memo;
- the expansion loop (:func:`_expand_py`) never rebinds an array. numba reference-counts
  an array variable rebound inside a loop on every pass through the loop's blocks, which
  cost more than the construction itself. When a buffer is full, the expansion stops at
  a safe point (state kept in ``st``), the driver (:func:`_subsets_py`) grows the buffers
  and the expansion resumes where it stopped.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from ..native import kernel

# st[]: the expansion's state between calls
I, N_SUB, SUB_USED, CLO_USED, N_CALLS, TICK, MARK_TICK, WORK, FULL, NEED_B = range(10)
# FULL bits: which buffer stopped the expansion
B_FULL, CLO_FULL, SUB_FULL, ROWS_FULL, CALLS_FULL = 1, 2, 4, 8, 16


def _expand_py(
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
    pairs_of,
    start,
    accept,
    n_classes,
    n_rules,
    max_states,
    max_work,
    clo_lo,
    clo_hi,
    clo_pool,
    single,
    stamp,
    mark,
    dfs,
    sub_lo,
    sub_hi,
    sub_pool,
    slots,
    table,
    accepting,
    call_src,
    call_rule,
    call_dst,
    head,
    touched,
    b_val,
    b_next,
    keys,
    buf,
    prev,
    st,
):
    """Expand subsets from ``st[I]`` on. Returns 0 (done), 1 (over ``max_states``), 2 (over
    ``max_work``) or 3 (a buffer is full: ``st[FULL]`` says which; nothing of the subset
    being expanded is kept, so expanding it again after growing the buffer is exact)."""
    n = important.shape[0]
    i = st[I]
    n_sub = st[N_SUB]
    sub_used = st[SUB_USED]
    clo_used = st[CLO_USED]
    n_calls = st[N_CALLS]
    tick = st[TICK]
    mark_tick = st[MARK_TICK]
    work = st[WORK]
    cap = slots.shape[0]
    margin = n_classes + n_rules + 1  # subsets one expansion may add
    status = 0
    while i < n_sub:
        n_t = 0
        n_keys = 0
        n_calls0 = n_calls
        work0 = work
        if i >= 0:
            if n_sub + margin > table.shape[0] or 2 * (n_sub + margin) > cap:
                st[FULL] = ROWS_FULL
                status = 3
                break
            if n_calls + n_rules > call_src.shape[0]:
                st[FULL] = CALLS_FULL
                status = 3
                break
            need = 0
            for j in range(sub_lo[i], sub_hi[i]):
                need += pairs_of[sub_pool[j]]
            if need > b_val.shape[0]:
                st[FULL] = B_FULL
                st[NEED_B] = need
                status = 3
                break
            n_b = 0
            for j in range(sub_lo[i], sub_hi[i]):
                s = sub_pool[j]
                if s == accept:
                    accepting[i] = True
                for e in range(e_ptr[s], e_ptr[s + 1]):
                    m = e_mask[e]
                    t = e_dst[e]
                    for q in range(m_ptr[m], m_ptr[m + 1]):
                        c = m_cls[q]
                        if head[c] < 0:
                            touched[n_t] = c
                            n_t += 1
                        b_val[n_b] = t
                        b_next[n_b] = head[c]
                        head[c] = n_b
                        n_b += 1
                for e in range(c_ptr[s], c_ptr[s + 1]):
                    keys[n_keys] = c_rule[e] * n + c_dst[e]
                    n_keys += 1
            work += n_b + n_keys
            if max_work >= 0 and work > max_work:
                status = 2
                break
            if max_work < 0 and not i & 15 and _clock() > -max_work:  # (a deadline in ticks)
                status = 2
                break
            work += _isort(touched, 0, n_t)  # classes, then calls by rule: the symbols in order
            work += _isort(keys, 0, n_keys)
        n_prev = -1
        prev_id = -1
        g = 0
        h = 0
        while g < n_t or h < n_keys or i < 0:
            if i < 0:
                sym = -1
                nt = 1
                buf[0] = start
            elif g < n_t:
                sym = touched[g]
                g += 1
                nt = 0
                p = head[sym]
                head[sym] = -1
                mark_tick += 1
                while p >= 0:  # the distinct targets
                    t = b_val[p]
                    p = b_next[p]
                    if mark[t] != mark_tick:
                        mark[t] = mark_tick
                        buf[nt] = t
                        nt += 1
                if nt > 1:
                    work += _isort(buf, 0, nt)
            else:
                rule = keys[h] // n
                sym = n_classes + rule
                nt = 0
                while h < n_keys and keys[h] // n == rule:
                    t = keys[h] - rule * n
                    if nt == 0 or buf[nt - 1] != t:
                        buf[nt] = t
                        nt += 1
                    h += 1
            same = nt == n_prev
            if same:
                for k in range(nt):
                    if buf[k] != prev[k]:
                        same = False
                        break
            if same:
                j_id = prev_id
            elif nt == 1 and single[buf[0]] >= 0:  # one target: its subset is known
                j_id = single[buf[0]]
                prev[0] = buf[0]
                n_prev = 1
                prev_id = j_id
            else:
                # the targets' epsilon closures (memoised per NFA state, sorted)
                size = 0
                for k in range(nt):
                    s0 = buf[k]
                    if clo_lo[s0] < 0:
                        tick += 1
                        c_lo = clo_used
                        top = 1
                        dfs[0] = s0
                        stamp[s0] = tick
                        while top > 0 and status == 0:
                            top -= 1
                            work += 1
                            u = dfs[top]
                            if important[u]:
                                if clo_used >= clo_pool.shape[0]:
                                    status = 3
                                    break
                                b = clo_used - 1
                                while b >= c_lo and clo_pool[b] > u:
                                    clo_pool[b + 1] = clo_pool[b]
                                    b -= 1
                                clo_pool[b + 1] = u
                                clo_used += 1
                            for q in range(eps_ptr[u], eps_ptr[u + 1]):
                                v = eps_idx[q]
                                if stamp[v] != tick:
                                    stamp[v] = tick
                                    dfs[top] = v
                                    top += 1
                        if status != 0:
                            clo_used = c_lo
                            st[FULL] = CLO_FULL
                            break
                        clo_lo[s0] = c_lo
                        clo_hi[s0] = clo_used
                    size += clo_hi[s0] - clo_lo[s0]
                if status == 0 and sub_used + size > sub_pool.shape[0]:
                    st[FULL] = SUB_FULL
                    status = 3
                if status != 0:
                    break
                for k in range(nt):
                    prev[k] = buf[k]
                n_prev = nt
                lo = sub_used
                if nt == 1:
                    s0 = buf[0]
                    for q in range(clo_lo[s0], clo_hi[s0]):
                        sub_pool[sub_used] = clo_pool[q]
                        sub_used += 1
                else:  # the union, sorted
                    mark_tick += 1
                    for k in range(nt):
                        s0 = buf[k]
                        for q in range(clo_lo[s0], clo_hi[s0]):
                            u = clo_pool[q]
                            if mark[u] != mark_tick:
                                mark[u] = mark_tick
                                sub_pool[sub_used] = u
                                sub_used += 1
                    work += _isort(sub_pool, lo, sub_used)
                hi = sub_used
                work += size + (hi - lo)  # the union, its hash and a comparison
                slot = _slot(sub_pool, lo, hi, cap)
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
                        status = 1
                        break
                    j_id = n_sub
                    sub_lo[j_id] = lo
                    sub_hi[j_id] = hi
                    slots[slot] = j_id
                    n_sub += 1
                prev_id = j_id
                if nt == 1:
                    single[buf[0]] = j_id
                if max_work >= 0 and work > max_work:  # (abandoned: no state to keep)
                    status = 2
                    break
            if i < 0:
                break
            if sym < n_classes:
                table[i, sym] = j_id
            else:
                call_src[n_calls] = i
                call_rule[n_calls] = sym - n_classes
                call_dst[n_calls] = j_id
                n_calls += 1
        if status != 0:
            if status == 3:  # undo this subset's expansion: it runs again once there is room
                for a in range(n_t):
                    head[touched[a]] = -1
                n_calls = n_calls0
                work = work0
            break
        i += 1
    st[I] = i
    st[N_SUB] = n_sub
    st[SUB_USED] = sub_used
    st[CLO_USED] = clo_used
    st[N_CALLS] = n_calls
    st[TICK] = tick
    st[MARK_TICK] = mark_tick
    st[WORK] = work
    return status


def _isort(a, lo, hi):
    """Sort ``a[lo:hi]`` in place (insertion sort where the run is short, as most are; else
    the array's sort: a long union of closures would take quadratic time); returns the work
    done, in the units of the work bound (8 moves of a contiguous element a unit)."""
    n = hi - lo
    if n > 64:
        a[lo:hi].sort()
        bits = 0
        while n >> bits:
            bits += 1
        return (n * bits) >> 2
    moved = 0
    for p in range(lo + 1, hi):
        x = a[p]
        q = p - 1
        while q >= lo and a[q] > x:
            a[q + 1] = a[q]
            q -= 1
        moved += p - 1 - q
        a[q + 1] = x
    return (moved >> 3) + ((hi - lo) >> 3)


def _slot(pool, lo, hi, cap):
    """Home slot of the run ``pool[lo:hi]`` in a table of ``cap`` (a power of two) slots."""
    h = np.uint64(1469598103934665603)
    for j in range(lo, hi):
        h = (h ^ np.uint64(pool[j])) * np.uint64(1099511628211)
    h = h ^ np.uint64(hi - lo)
    return np.int64(h & np.uint64(cap - 1))


def _grown(a, size):
    b = np.empty(size, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


def _subsets_py(
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
    tiny=False,
):
    """Subset construction (the contract of the previous ``determinize_kernel``): runs
    :func:`_expand_py`, growing its buffers whenever it stops for room (``tiny``: start
    from one-entry buffers, for the tests of the resumption)."""
    n = important.shape[0]
    pairs_of = np.zeros(n, dtype=np.int64)  # (class, target) pairs each NFA state adds
    for s in range(n):
        p = 0
        for e in range(e_ptr[s], e_ptr[s + 1]):
            p += m_ptr[e_mask[e] + 1] - m_ptr[e_mask[e]]
        pairs_of[s] = p
    n_rules = 0
    for e in range(c_rule.shape[0]):
        if c_rule[e] + 1 > n_rules:
            n_rules = c_rule[e] + 1
    clo_lo = np.full(n, -1, dtype=np.int64)
    clo_hi = np.zeros(n, dtype=np.int64)
    clo_pool = np.empty(1 if tiny else 2 * n + 64, dtype=np.int64)
    single = np.full(n, -1, dtype=np.int64)
    stamp = np.zeros(n, dtype=np.int64)
    mark = np.zeros(n, dtype=np.int64)
    dfs = np.empty(n, dtype=np.int64)
    rows = 1 if tiny else 64
    while rows < (0 if tiny else min(2 * n, 8192)) + n_classes + n_rules + 1:
        rows *= 2
    sub_lo = np.empty(rows, dtype=np.int64)
    sub_hi = np.empty(rows, dtype=np.int64)
    sub_pool = np.empty(1 if tiny else 2 * rows, dtype=np.int64)
    slots = np.full(2 * rows, -1, dtype=np.int64)
    table = np.full((rows, n_classes), -1, dtype=np.int32)
    accepting = np.zeros(rows, dtype=np.bool_)
    n_c = n_rules + (1 if tiny else 64)
    call_src = np.empty(n_c, dtype=np.int64)
    call_rule = np.empty(n_c, dtype=np.int64)
    call_dst = np.empty(n_c, dtype=np.int64)
    head = np.full(max(n_classes, 1), -1, dtype=np.int64)
    touched = np.empty(max(n_classes, 1), dtype=np.int64)
    b_val = np.empty(1 if tiny else 1024, dtype=np.int64)
    b_next = np.empty(1 if tiny else 1024, dtype=np.int64)
    keys = np.empty(c_rule.shape[0] + 1, dtype=np.int64)  # a subset's call edges are distinct edges
    buf = np.empty(n + 1, dtype=np.int64)
    prev = np.empty(n + 1, dtype=np.int64)
    st = np.zeros(10, dtype=np.int64)
    st[I] = -1
    while True:
        st[FULL] = 0
        status = _expand(
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
            pairs_of,
            start,
            accept,
            n_classes,
            n_rules,
            max_states,
            max_work,
            clo_lo,
            clo_hi,
            clo_pool,
            single,
            stamp,
            mark,
            dfs,
            sub_lo,
            sub_hi,
            sub_pool,
            slots,
            table,
            accepting,
            call_src,
            call_rule,
            call_dst,
            head,
            touched,
            b_val,
            b_next,
            keys,
            buf,
            prev,
            st,
        )
        if status != 3:
            break
        full = st[FULL]
        if full == B_FULL:
            b_val = np.empty(2 * st[NEED_B], dtype=np.int64)
            b_next = np.empty(2 * st[NEED_B], dtype=np.int64)
        elif full == CLO_FULL:
            clo_pool = _grown(clo_pool, 2 * clo_pool.shape[0])
        elif full == SUB_FULL:
            sub_pool = _grown(sub_pool, 2 * sub_pool.shape[0])
        elif full == CALLS_FULL:
            call_src = _grown(call_src, 2 * call_src.shape[0])
            call_rule = _grown(call_rule, 2 * call_rule.shape[0])
            call_dst = _grown(call_dst, 2 * call_dst.shape[0])
        else:  # rows: the table, the subsets, the hash slots (rehashed)
            rows *= 2
            t2 = np.full((rows, n_classes), -1, dtype=np.int32)
            t2[: table.shape[0]] = table
            table = t2
            accepting = _grown(accepting, rows)
            accepting[st[N_SUB] :] = False
            sub_lo = _grown(sub_lo, rows)
            sub_hi = _grown(sub_hi, rows)
            slots = np.full(2 * rows, -1, dtype=np.int64)
            for k in range(st[N_SUB]):
                sl = _slot(sub_pool, sub_lo[k], sub_hi[k], 2 * rows)
                while slots[sl] >= 0:
                    sl = (sl + 1) & (2 * rows - 1)
                slots[sl] = k
    n_sub = st[N_SUB]
    n_calls = st[N_CALLS]
    if status != 0:
        n_sub = min(n_sub, table.shape[0])
        n_calls = 0
    return (
        status,
        table[:n_sub],
        accepting[:n_sub],
        call_src[:n_calls],
        call_rule[:n_calls],
        call_dst[:n_calls],
    )


_CYCLES = platform.machine().lower() in ("x86_64", "amd64")  # an invariant cycle counter


def _define_counter(g: dict) -> None:
    """Define the intrinsic ``_readcyclecounter`` (LLVM's cycle counter) in ``g``: numba
    is imported only when the kernels run through its JIT (see :mod:`..native`)."""
    from llvmlite import ir as _llvm
    from numba import types as _types
    from numba.core import cgutils as _cgutils
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def _readcyclecounter(typingctx):
        def codegen(context, builder, signature, args):
            fnty = _llvm.FunctionType(_llvm.IntType(64), [])
            fn = _cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
            return builder.call(fn, [])

        return _types.int64(), codegen

    g["_readcyclecounter"] = _readcyclecounter


def _cycles_py() -> int:
    return _readcyclecounter()  # noqa: F821 # (defined by _define_counter)


def _still_py() -> int:
    return 0


if _CYCLES:
    _clock = kernel(_cycles_py, __name__, "_clock", setup=_define_counter)
else:  # no counter the compiled kernels can read: a clock that stands still
    _clock = kernel(_still_py, __name__, "_clock")

_RATE: list[float] = []


RATE_WINDOW = 0.001  # seconds: perf_counter's resolution (< 1 µs) makes it exact to 0.1%


def clock_rate() -> float:
    """Ticks of the kernels' clock (:func:`now`) per second, measured once over
    :data:`RATE_WINDOW` of a new process's first compilation (0.0: the clock does not
    advance here; the kernels then bound their work, not their time)."""
    if not _RATE:
        rate = 0.0
        try:
            c0, t0 = int(_clock()), time.perf_counter()
            while time.perf_counter() - t0 < RATE_WINDOW:
                pass
            c1, t1 = int(_clock()), time.perf_counter()
            rate = (c1 - c0) / (t1 - t0) if c1 > c0 else 0.0
        except Exception:  # noqa: BLE001 - no cycle counter: the work bound alone
            rate = 0.0
        _RATE.append(rate if rate > 1e7 else 0.0)
    return _RATE[0]


def now() -> int:
    """The kernels' clock (ticks: see :func:`clock_rate`)."""
    return int(_clock())


_isort = kernel(_isort, __name__, "_isort")
_slot = kernel(_slot, __name__, "_slot")
_grown = kernel(_grown, __name__, "_grown")
_expand = kernel(_expand_py, __name__, "_expand")
subsets_kernel = kernel(_subsets_py, __name__, "subsets_kernel")
