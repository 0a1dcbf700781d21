"""Numba kernels for cold mask rows (see :mod:`..compiled`).

``unquoted_region`` + ``canonical_key``: the canonical form of the part of an automaton
that decides the tokens without ``"`` from one state (the key of the per-vocabulary
shared rows); same bytes as :meth:`CompiledConstraint._canonical_unquoted_ref`, its
pure-Python reference. A region is minimised once: every state in it gets its key from
the region's quotient automaton.

``near_form``: what decides the short tokens without ``"`` from one state, as deep as they
reach, so that states alike that far share their part of a row
(:meth:`CompiledConstraint._short_part`).
"""

from __future__ import annotations

import numpy as np

from ..automaton.dfa_kernels import hopcroft
from ..native import kernel


def _columns_py(cls, n_cls, quote):
    """The columns of an unquoted region: the classes of the bytes other than quote (a class
    holding quote and other bytes keeps a column for those bytes). Returns (cls_col: column of
    each class or -1, col_cls: class of each column, col_rep: the first byte of each column,
    col_of: column of each byte, -1 for quote, k: the number of columns)."""
    cls_col = np.full(n_cls, -1, dtype=np.int64)
    col_cls = np.empty(n_cls, dtype=np.int64)
    col_rep = np.empty(n_cls, dtype=np.int64)
    col_of = np.empty(256, dtype=np.int64)
    k = 0
    for b in range(256):
        if b == quote:
            col_of[b] = -1
            continue
        c = cls[b]
        if cls_col[c] < 0:
            cls_col[c] = k
            col_cls[k] = c
            col_rep[k] = b
            k += 1
        col_of[b] = cls_col[c]
    return cls_col, col_cls, col_rep, col_of, k


_columns = kernel(_columns_py, __name__, "_columns")


def _unquoted_region_py(table, cls, quote, boundary, start, max_states, local):
    """The part of the automaton reachable from ``start`` over bytes other than ``quote``,
    minimised for definedness (two states share a block iff the same byte strings without
    ``quote`` keep each alive). Returns ``(code, states, block, quotient)``: code 1, the
    part's states, the block of each, and per block its successor block by byte (int16
    [blocks, 256], -1: dead); or code -1 when the part reaches a ``boundary`` state, -2
    when it has more than ``max_states`` states, with the states searched.

    ``local``: int32 scratch of one entry per state, all -1 (left all -1 on return).
    """
    n_cls = table.shape[1]
    cls_col, col_cls, col_rep, col_of, k = _columns(cls, n_cls, quote)
    order = np.empty(max_states, dtype=np.int64)
    sub = np.empty((max_states + 1, k), dtype=np.int64)
    order[0] = start
    local[start] = 0
    n = 1
    i = 0
    fail = 0
    while i < n:
        q = order[i]
        if boundary[q]:
            fail = -1
            break
        for j in range(k):
            t = table[q, col_cls[j]]
            if t < 0:
                sub[i, j] = -1
                continue
            lt = local[t]
            if lt < 0:
                if n >= max_states:
                    fail = -2
                    break
                lt = n
                local[t] = n
                order[n] = t
                n += 1
            sub[i, j] = lt
        if fail:
            break
        i += 1
    for x in range(n):
        local[order[x]] = -1
    if fail:
        return fail, order[:n].copy(), order[:0], np.empty((0, 256), dtype=np.int16)
    # the dead sink is state n
    for x in range(n):
        for j in range(k):
            if sub[x, j] < 0:
                sub[x, j] = n
    for j in range(k):
        sub[n, j] = n
    init = np.zeros(n + 1, dtype=np.int64)
    init[n] = 1
    block = hopcroft(sub[: n + 1], init)
    # renumber the blocks 0.. without the sink's
    sink = block[n]
    n_blocks = 0
    for x in range(n + 1):
        if block[x] + 1 > n_blocks:
            n_blocks = block[x] + 1
    ren = np.empty(n_blocks, dtype=np.int64)
    m = 0
    for b in range(n_blocks):
        if b == sink:
            ren[b] = -1
        else:
            ren[b] = m
            m += 1
    out_block = np.empty(n, dtype=np.int64)
    quotient = np.full((m, 256), -1, dtype=np.int16)
    done = np.zeros(m, dtype=np.bool_)
    for x in range(n):
        bx = ren[block[x]]
        out_block[x] = bx
        if done[bx]:
            continue
        done[bx] = True
        for b in range(256):
            c = col_of[b]
            if c >= 0:
                quotient[bx, b] = ren[block[sub[x, c]]]
    return 1, order[:n].copy(), out_block, quotient


def _canonical_key_py(quotient, start):
    """The canonical form of the quotient automaton from block ``start``: per block in
    breadth-first order (successors by first byte), 256 int16 block numbers (-1: dead)."""
    m = quotient.shape[0]
    ren = np.full(m, -1, dtype=np.int64)
    queue = np.empty(m, dtype=np.int64)
    ren[start] = 0
    queue[0] = start
    nq = 1
    out = np.empty((m, 256), dtype=np.int16)
    j = 0
    while j < nq:
        r = queue[j]
        for b in range(256):
            nb = quotient[r, b]
            if nb < 0:
                out[j, b] = -1
                continue
            if ren[nb] < 0:
                ren[nb] = nq
                queue[nq] = nb
                nq += 1
            out[j, b] = ren[nb]
        j += 1
    return out[:nq].reshape(-1)


def _match_form_py(table, cls, quote, boundary, start, max_states, local, form):
    """Does the part of the automaton reachable from ``start`` over bytes other than
    ``quote`` have the canonical form ``form`` (int16 [m, 256], a :func:`_canonical_key_py`
    output reshaped; block 0 is the start)? Checked without minimising: a search pairs
    each reached state with one block of ``form`` (a minimal automaton, so a state
    paired with two blocks means no) and compares which bytes are alive.

    Returns ``(code, states, block)``: code 1 and the part's states with their blocks when
    it has the form, 0 when not, -1 when the part reaches a ``boundary`` state, -2 when it
    has more than ``max_states`` states (no form at all); it stops at the first mismatch, so
    states and blocks are complete only with code 1. ``local``: as for
    :func:`_unquoted_region_py`.
    """
    n_cls = table.shape[1]
    m = form.shape[0]
    cls_col, col_cls, col_rep, col_of, k = _columns(cls, n_cls, quote)
    # a block whose successors differ between bytes of one column, or that is alive on
    # quote, matches no state (-1: unchecked, 0: no, 1: yes); formc: a block's successors
    # by column
    fits = np.full(m, -1, dtype=np.int64)
    formc = np.empty((m, k), dtype=np.int64)
    order = np.empty(max_states, dtype=np.int64)
    order[0] = start
    local[start] = 0
    n = 1
    i = 0
    code = 1
    while i < n and code == 1:
        q = order[i]
        i += 1
        if boundary[q]:
            code = -1
            break
        bq = local[q]
        if fits[bq] < 0:
            fits[bq] = 1 if form[bq, quote] < 0 else 0
            for b in range(256):
                if b != quote and form[bq, b] != form[bq, col_rep[col_of[b]]]:
                    fits[bq] = 0
                    break
            for j in range(k):
                formc[bq, j] = form[bq, col_rep[j]]
        if fits[bq] == 0:
            code = 0
            break
        row = table[q]
        frow = formc[bq]
        for j in range(k):
            t = row[col_cls[j]]
            fb = frow[j]
            if t < 0:
                if fb >= 0:
                    code = 0
                    break
                continue
            if fb < 0:
                code = 0
                break
            lt = local[t]
            if lt < 0:
                if n >= max_states:
                    code = -2
                    break
                local[t] = fb
                order[n] = t
                n += 1
            elif lt != fb:
                code = 0
                break
    blocks = np.empty(n, dtype=np.int64)
    for x in range(n):
        blocks[x] = local[order[x]]
        local[order[x]] = -1
    return code, order[:n].copy(), blocks


def _count_bytes_py(table, cls_sizes, state):
    """How many bytes ``state`` allows (``cls_sizes``: bytes per class)."""
    n = 0
    for c in range(table.shape[1]):
        if table[state, c] >= 0:
            n += cls_sizes[c]
    return n


def _near_form_py(table, quote_cls, flags, depth, max_states, local, order, dep, out, start):
    """What decides the tokens of at most ``depth`` bytes without the byte of class
    ``quote_cls`` (a class of that byte alone) from ``start``: the states a search from it
    reaches in fewer than ``depth`` such bytes, numbered in the order met (by class), each
    written to ``out`` as its ``flags`` entry then its successors' numbers by class but
    ``quote_cls`` (-1: dead; -2: alive, past the depth). Two states that write the same
    numbering allow the same tokens of that length. Returns ``(states, hash, written)``:
    states -1 when there are more than ``max_states``; a hash of what was written. ``local``:
    int64 scratch of one entry per state, all -1 (left all -1); ``order``, ``dep``: int64
    scratch of ``max_states`` entries; ``out``: int32, ``max_states * (n_classes + 1)`` entries.
    (The arguments that change from call to call come last: see :func:`..native.bind`.)"""
    n_cls = table.shape[1]
    order[0] = start
    local[start] = 0
    dep[0] = 0
    n = 1
    i = 0
    w = 0
    h = 1
    ok = True
    while i < n and ok:
        q = order[i]
        d = dep[i]
        i += 1
        out[w] = flags[q]
        w += 1
        h = (h * 31 + flags[q] + 8) & 0xFFFFFFFF
        for c in range(n_cls):
            if c == quote_cls:
                continue
            t = table[q, c]
            if t < 0:
                v = -1
            elif d >= depth:
                v = -2
            else:
                v = local[t]
                if v < 0:
                    if n >= max_states:
                        ok = False
                        break
                    local[t] = n
                    order[n] = t
                    dep[n] = d + 1
                    v = n
                    n += 1
            out[w] = v
            w += 1
            h = (h * 31 + v + 8) & 0xFFFFFFFF
    for x in range(n):
        local[order[x]] = -1
    return (n if ok else -1), h, w


count_bytes = kernel(_count_bytes_py, __name__, "count_bytes")
near_form = kernel(_near_form_py, __name__, "near_form")
match_form = kernel(_match_form_py, __name__, "match_form")
unquoted_region = kernel(_unquoted_region_py, __name__, "unquoted_region")
canonical_key = kernel(_canonical_key_py, __name__, "canonical_key")


def warm_up(index=None) -> None:
    """Load (or compile) the kernels now rather than on the first cold row (with a
    vocabulary's trie, its walks too)."""
    table = np.full((1, 1), -1, dtype=np.int32)
    if index is not None:
        cls, bnd = np.zeros(256, dtype=np.int32), np.zeros(1, dtype=np.bool_)
        words = np.zeros(index.n_words, dtype=np.uint32)
        index.walk(table, cls, 0, bnd, words)
        index.walk_below(table, cls, 0, bnd, words, np.zeros(min(1, index.n_nodes), dtype=np.int32))
        from .trie import WalkMemo

        memo = WalkMemo(table, cls, bnd, bnd)
        index.walk_fast(memo, False, 0, words)
        index.walk_fast(memo, True, 0, words, np.zeros(min(1, index.n_nodes), dtype=np.int32))
    _, _, block, quotient = unquoted_region(
        table,
        np.zeros(256, dtype=np.int32),
        0x22,
        np.zeros(1, dtype=np.bool_),
        0,
        4,
        np.full(1, -1, dtype=np.int32),
    )
    key = canonical_key(quotient, int(block[0]))
    count_bytes(table, np.ones(1, dtype=np.int64), 0)
    one = np.full(1, -1, dtype=np.int64)
    flags = np.zeros(1, dtype=np.int64)
    near_form(table, 0, flags, 4, 1, one, one.copy(), one.copy(), np.zeros(1, dtype=np.int32), 0)
    match_form(
        table,
        np.zeros(256, dtype=np.int32),
        0x22,
        np.zeros(1, dtype=np.bool_),
        0,
        4,
        np.full(1, -1, dtype=np.int32),
        key.reshape(-1, 256),
    )
