"""numba kernels between the Python NFA builder and the automaton kernels of :mod:`.dfa_kernels`.

The builder (:class:`~.nfa.FragmentBuilder`) appends edges to flat Python lists; these
kernels take them as flat int arrays and do in one call what would otherwise be dozens of
small numpy calls per NFA: CSR layout, important states, subset construction, and for a
call-free sub-expression also pruning and minimisation. Byte classes of a compile and the
classes of each byte mask come from :func:`_byte_classes_py`.

Plain functions, compiled by numba when it is installed; the ``*_py`` names stay pure
Python (the tests check them against ``tests/constraints/oracles``). numba's disk cache of
a function here does not notice a change in :mod:`.subset`, which it inlines: change this
file too (this note) when the subset construction changes. (Last change: the subset
construction reads a deadline in clock ticks (a negative ``max_work``), counts closures,
unions and sorts in its work bound, and sorts long unions in n log n.)
"""

from __future__ import annotations

import numpy as np

from ..native import kernel
from .dfa_kernels import live_kernel
from .minimize import minimize_sparse_kernel
from .subset import subsets_kernel


def _byte_classes_py(raw):
    """Classes of bytes by membership in every mask, and each mask's classes.

    ``raw``: uint8 [k, 32], mask i's bit b at ``raw[i, b >> 3] >> (b & 7)``. Returns
    ``cls`` (int32 [256], classes numbered by their first byte), ``reps`` (int64 [C], each
    class's first byte) and the CSR ``m_ptr`` (int64 [C + k + 1]), ``m_cls``: symbol id j <
    C is class j alone, id C + i lists the classes of mask i (increasing).
    """
    k = raw.shape[0]
    cls = np.zeros(256, dtype=np.int32)
    n = 1
    split = np.empty((257, 2), dtype=np.int32)  # (old class, bit) -> new class
    for i in range(k):
        for c in range(n):
            split[c, 0] = -1
            split[c, 1] = -1
        m = 0
        for b in range(256):
            bit = (raw[i, b >> 3] >> (b & 7)) & 1
            c = cls[b]
            t = split[c, bit]
            if t < 0:
                t = m
                split[c, bit] = m
                m += 1
            cls[b] = t
        n = m
    reps = np.full(n, -1, dtype=np.int64)
    for b in range(256):
        if reps[cls[b]] < 0:
            reps[cls[b]] = b
    m_ptr = np.empty(n + k + 1, dtype=np.int64)
    for j in range(n + 1):
        m_ptr[j] = j
    total = n
    for i in range(k):
        for c in range(n):
            b = reps[c]
            total += (raw[i, b >> 3] >> (b & 7)) & 1
        m_ptr[n + i + 1] = total
    m_cls = np.empty(total, dtype=np.int64)
    for j in range(n):
        m_cls[j] = j
    q = n
    for i in range(k):
        for c in range(n):
            b = reps[c]
            if (raw[i, b >> 3] >> (b & 7)) & 1:
                m_cls[q] = c
                q += 1
    return cls, reps, m_ptr, m_cls


def _csr_py(n, flat, width, key_col):
    """Row pointers and edge order (stable) of edges ``flat.reshape(-1, width)`` keyed by
    column ``key_col`` (a state < ``n``)."""
    m = flat.shape[0] // width
    ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(m):
        ptr[flat[i * width + key_col] + 1] += 1
    for s in range(n):
        ptr[s + 1] += ptr[s]
    fill = ptr[:-1].copy()
    order = np.empty(m, dtype=np.int64)
    for i in range(m):
        s = flat[i * width + key_col]
        order[fill[s]] = i
        fill[s] += 1
    return ptr, order


def _determinize_flat_py(
    n, eps, byt, ch_src, ch_sym, ch_dst, calls, m_ptr, m_cls, start, accept, n_classes, max_states, max_work
):
    """Subset construction of an NFA given as flat edge arrays: ``eps`` (src, dst) pairs,
    ``byt`` (src, symbol id, dst) triples, spliced class edges ``ch_*`` (symbol id = class)
    and ``calls`` (src, rule, dst) triples; symbol ids index ``m_ptr``/``m_cls``. Returns
    what the subset construction returns (computed by
    :func:`~.subset.subsets_kernel`)."""
    eps_ptr, order = _csr(n, eps, 2, 0)
    eps_idx = np.empty(order.shape[0], dtype=np.int64)
    for q in range(order.shape[0]):
        eps_idx[q] = eps[2 * order[q] + 1]
    nb = byt.shape[0] // 3
    nc = ch_src.shape[0]
    e_ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(nb):
        e_ptr[byt[3 * i] + 1] += 1
    for i in range(nc):
        e_ptr[ch_src[i] + 1] += 1
    for s in range(n):
        e_ptr[s + 1] += e_ptr[s]
    fill = e_ptr[:-1].copy()
    e_mask = np.empty(nb + nc, dtype=np.int64)
    e_dst = np.empty(nb + nc, dtype=np.int64)
    for i in range(nb):
        s = byt[3 * i]
        e_mask[fill[s]] = byt[3 * i + 1]
        e_dst[fill[s]] = byt[3 * i + 2]
        fill[s] += 1
    for i in range(nc):
        s = ch_src[i]
        e_mask[fill[s]] = ch_sym[i]
        e_dst[fill[s]] = ch_dst[i]
        fill[s] += 1
    c_ptr, order = _csr(n, calls, 3, 0)
    c_rule = np.empty(order.shape[0], dtype=np.int64)
    c_dst = np.empty(order.shape[0], dtype=np.int64)
    for q in range(order.shape[0]):
        c_rule[q] = calls[3 * order[q] + 1]
        c_dst[q] = calls[3 * order[q] + 2]
    important = np.zeros(n, dtype=np.bool_)
    for s in range(n):
        important[s] = e_ptr[s + 1] > e_ptr[s] or c_ptr[s + 1] > c_ptr[s]
    important[accept] = True
    return _determinize(
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
    )


def _det_min_flat_py(
    n, eps, byt, ch_src, ch_sym, ch_dst, m_ptr, m_cls, start, accept, n_classes, max_states, max_work
):
    """The minimal DFA of a call-free NFA (flat arrays as :func:`_determinize_flat_py`):
    subset construction, live states, minimisation. Returns (status, table, accepting);
    zero states if the start is dead."""
    no_calls = np.empty(0, dtype=np.int64)
    status, table, acc, _, _, _ = determinize_flat_kernel(
        n,
        eps,
        byt,
        ch_src,
        ch_sym,
        ch_dst,
        no_calls,
        m_ptr,
        m_cls,
        start,
        accept,
        n_classes,
        max_states,
        max_work,
    )
    if status != 0:
        return status, table, acc
    live = _live(table, acc, no_calls, no_calls)
    if not live[0]:
        return 0, table[:0], acc[:0]
    out, out_acc, _ = _minimize(table, acc, live, np.empty((table.shape[0], 0), dtype=np.int64))
    return 0, out, out_acc


_determinize, _live, _minimize = subsets_kernel, live_kernel, minimize_sparse_kernel
byte_classes_kernel = kernel(_byte_classes_py, __name__, "byte_classes_kernel")
_csr = kernel(_csr_py, __name__, "_csr")
determinize_flat_kernel = kernel(_determinize_flat_py, __name__, "determinize_flat_kernel")
det_min_flat_kernel = kernel(_det_min_flat_py, __name__, "det_min_flat_kernel")
