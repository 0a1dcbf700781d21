"""Token level: the vocabulary as a DFS-ordered byte trie, walked by numba.

One :class:`VocabIndex` per vocabulary (shared by every compiled constraint). Walking the
trie from a DFA state visits only live nodes, so a restrictive state costs a few µs
(measured: ``MEASUREMENTS.md``). The walk writes allowed tokens straight into an uint32
bitmask row and reports *boundary* nodes: trie nodes where the DFA reached a state with
a call edge or (above the bottom of the stack) an accepting state, so the pushdown
matcher can continue those subtrees in other rules.

Large walks (states allowing many bytes) take ``_walk_fast``: it takes a whole subtree at
once when every byte below a node lies in a byte set (letters, alphanumerics, printable
ASCII, ...) over which the automaton provably stays alive deeper than the subtree (the
"alive depth" of each state, memoised per automaton in :class:`WalkMemo`). A string or
counted-format state then costs ~90 µs instead of ~820 µs for the whole trie. ``_walk``
stays the reference.
"""

from __future__ import annotations

import threading

import numpy as np

from ..native import bind, kernel


def _walk_py(
    table,
    cls,
    start,
    node_byte,
    node_depth,
    node_skip,
    tok_lo,
    tok_hi,
    tok_ids,
    lo,
    hi,
    base_depth,
    boundary,
    out,
    bnd_nodes,
    bnd_states,
    states,
):
    """Walk trie nodes ``lo..hi-1`` (a DFS range whose roots are at ``base_depth + 1``)
    from DFA state ``start``; set the bits of tokens that stay alive; return the number
    of boundary (node, state) pairs written to ``bnd_nodes`` / ``bnd_states``."""
    states[base_depth] = start
    nb = 0
    i = lo
    while i < hi:
        d = node_depth[i]
        t = table[states[d - 1], cls[node_byte[i]]]
        if t < 0:
            i = node_skip[i]
            continue
        states[d] = t
        for k in range(tok_lo[i], tok_hi[i]):
            tid = tok_ids[k]
            out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        if boundary[t]:
            bnd_nodes[nb] = i
            bnd_states[nb] = t
            nb += 1
        i += 1
    return nb


_walk = kernel(_walk_py, __name__, "_walk")


def _walk_many_py(
    table,
    cls,
    start,
    node_byte,
    node_depth,
    node_skip,
    tok_lo,
    tok_hi,
    tok_ids,
    roots,
    boundary,
    out,
    bnd_nodes,
    bnd_states,
    states,
):
    """``_walk_py`` over the subtrees below each node of ``roots`` (children only)."""
    nb = 0
    for r in range(roots.shape[0]):
        node = roots[r]
        nb += _walk(
            table,
            cls,
            start,
            node_byte,
            node_depth,
            node_skip,
            tok_lo,
            tok_hi,
            tok_ids,
            node + 1,
            node_skip[node],
            node_depth[node],
            boundary,
            out,
            bnd_nodes[nb:],
            bnd_states[nb:],
            states,
        )
    return nb


_walk_many = kernel(_walk_many_py, __name__, "_walk_many")


def _note_side_py(x, pl, side_mark, side_stamp, side_nodes, side_levels, side_count):
    """List trie node ``x`` for a side walk of level ``pl``, once per walk (``side_mark[x]``
    stamped with ``side_stamp``; ``side_count[0]`` nodes listed so far)."""
    if side_mark[x] != side_stamp:
        side_mark[x] = side_stamp
        j = side_count[0]
        side_nodes[j] = x
        side_levels[j] = pl
        side_count[0] = j + 1


_note_side = kernel(_note_side_py, __name__, "_note_side")


def _walk_counted_py(
    table,
    act,
    cls,
    region,
    need,
    lo,
    hi,
    start,
    count,
    node_byte,
    node_depth,
    node_skip,
    tok_lo,
    tok_hi,
    tok_ids,
    lo_i,
    hi_i,
    base_depth,
    boundary,
    out,
    bnd_nodes,
    bnd_states,
    states,
    counts,
    recall_from,
    recall_to,
    recall_count,
    max_level,
    lev,
    bnd_levels,
    side_states,
    pend_level,
    pend_node,
    side_mark,
    side_stamp,
    side_nodes,
    side_levels,
    side_count,
    sub,
    tok_end,
    loop_set,
    loop_tick,
):
    """``_walk_py`` for an automaton with counted repetitions (see :mod:`..automaton.counted`): the
    configuration at each depth is (state, count), and a transition is live only if its
    counter action allows it (EXIT needs count >= lo of the state's region; ENTER, EXIT set
    the count to 0, TICK adds one) and, into a region state t, count + need[t] <= hi of its
    region. Boundary states (never in a region) are reported as by ``_walk_py``, each with
    its level in ``bnd_levels``. A chain of calls as in :func:`_walk_range`: below a node
    reached in ``recall_from`` at level ``l < max_level`` the walk goes on from
    (``recall_to``, ``recall_count``) at level ``l + 1``; ``side_states`` as there.

    The subtree shortcut (``loop_set`` not empty; see :func:`counted_loops`): below a live,
    non-boundary node reached in state t with count c, whose subtree's bytes lie in shortcut
    set ``sub & 255`` <= ``loop_set[t]`` (each of those bytes keeps t, with no counter action
    but the same TICK or none), every token of the subtree (``tok_end``) is set without
    walking when c + (its height ``sub >> 8`` if those bytes TICK) + need[t] <= hi: the
    walk would stay in t with every check passed."""
    short = loop_set.shape[0] > 0
    states[base_depth] = start
    counts[base_depth] = count
    lev[base_depth] = 1
    side_on = side_states.shape[0] > 0
    if side_on:
        pend_level[base_depth] = 0
        pend_node[base_depth] = lo_i - 1
    nb = 0
    i = lo_i
    while i < hi_i:
        d = node_depth[i]
        s = states[d - 1]
        c = counts[d - 1]
        k = cls[node_byte[i]]
        if side_on:
            pl = pend_level[d - 1]
            if pl >= 0 and table[side_states[pl], k] >= 0:  # a side walk reads this byte
                _note_side(pend_node[d - 1], pl, side_mark, side_stamp, side_nodes, side_levels, side_count)
        t = table[s, k]
        if t >= 0:
            a = act[s, k]
            if a != 0:
                if (a & 4) and c < lo[region[s]]:  # EXIT
                    t = -1
                else:
                    if a & 12:  # EXIT | ENTER
                        c = 0
                    if a & 2:  # TICK
                        c += 1
            if t >= 0:
                rt = region[t]
                if rt >= 0 and c + need[t] > hi[rt]:
                    t = -1
        if t < 0:
            i = node_skip[i]
            continue
        states[d] = t
        counts[d] = c
        for k2 in range(tok_lo[i], tok_hi[i]):
            tid = tok_ids[k2]
            out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        lv = lev[d - 1]
        lev[d] = lv
        if side_on:
            pend_level[d] = -1
        if boundary[t]:
            if t == recall_from and lv < max_level:  # the rule called again, below
                states[d] = recall_to
                counts[d] = recall_count
                lev[d] = lv + 1  # (inline: as a kernel call, the chain walk took 1.7x)
                if lv + 1 > lev[lev.shape[0] - 1]:
                    lev[lev.shape[0] - 1] = lv + 1
                if side_on:
                    pend_level[d] = lv
                    pend_node[d] = i
            else:
                bnd_nodes[nb] = i
                bnd_states[nb] = t
                bnd_levels[nb] = lv
                nb += 1
        elif short and (sub[i] & 255) <= loop_set[t]:
            rt = region[t]
            if rt < 0 or c + ((sub[i] >> 8) if loop_tick[t] else 0) + need[t] <= hi[rt]:
                for k2 in range(tok_hi[i], tok_end[i]):
                    tid = tok_ids[k2]
                    out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                i = node_skip[i]
                continue
        i += 1
    return nb


_walk_counted = kernel(_walk_counted_py, __name__, "_walk_counted")


def _walk_counted_many_py(
    table,
    act,
    cls,
    region,
    need,
    lo,
    hi,
    node_byte,
    node_depth,
    node_skip,
    tok_lo,
    tok_hi,
    tok_ids,
    sub,
    tok_end,
    loop_set,
    loop_tick,
    bnd_nodes,
    bnd_states,
    states,
    counts,
    lev,
    bnd_levels,
    pend_level,
    pend_node,
    side_mark,
    side_nodes,
    side_levels,
    side_count,
    boundary,
    out,
    roots,
    start,
    count,
    starts,
    start_counts,
    recall_from,
    recall_to,
    recall_count,
    max_level,
    side_states,
    side_stamp,
):
    """``_walk_counted_py`` of the whole trie (``roots`` empty), else of the subtrees below
    each node of ``roots`` (children only; from (``starts[i]``, ``start_counts[i]``) below
    ``roots[i]`` if ``starts`` is not empty). The arguments come in the order they change:
    the automaton's tables, the trie's, the thread's scratch (the first 29, bound once:
    ``VocabIndex._counted_walk``), then each walk's own."""
    nb = 0
    n_roots = roots.shape[0]
    for r in range(max(n_roots, 1)):
        lo_i, hi_i, base_depth = 0, node_byte.shape[0], 0  # (no roots: the whole trie)
        if n_roots:
            node = roots[r]
            lo_i, hi_i, base_depth = node + 1, node_skip[node], node_depth[node]
        if starts.shape[0]:
            start = starts[r]
            count = start_counts[r]
        nb += _walk_counted(
            table,
            act,
            cls,
            region,
            need,
            lo,
            hi,
            start,
            count,
            node_byte,
            node_depth,
            node_skip,
            tok_lo,
            tok_hi,
            tok_ids,
            lo_i,
            hi_i,
            base_depth,
            boundary,
            out,
            bnd_nodes[nb:],
            bnd_states[nb:],
            states,
            counts,
            recall_from,
            recall_to,
            recall_count,
            max_level,
            lev,
            bnd_levels[nb:],
            side_states,
            pend_level,
            pend_node,
            side_mark,
            side_stamp,
            side_nodes,
            side_levels,
            side_count,
            sub,
            tok_end,
            loop_set,
            loop_tick,
        )
    return nb


_walk_counted_many = kernel(_walk_counted_many_py, __name__, "_walk_counted_many")


def _walk_crit_py(
    table,
    act,
    cls,
    region,
    need,
    start,
    node_byte,
    node_depth,
    node_skip,
    tok_lo,
    tok_hi,
    tok_ids,
    crit,
    states,
    ticks,
    crits,
    sub,
    tok_end,
    tok_depth,
    loop_set,
    loop_tick,
):
    """For each token that stays inside ``start``'s counted region, the count margin it
    needs: the most, over its path, of items started so far + ``need`` of the state
    reached (allowed from count c iff c + crit <= hi). Other tokens keep their value.
    The subtree shortcut of ``_walk_counted_py`` (``loop_set`` not empty): below a node
    reached in state t whose subtree's bytes t keeps, a token at depth D (``tok_depth``, by
    its place in ``tok_ids``) needs the node's margin or, if those bytes tick, its items
    plus the D - d more and need[t], whichever is more."""
    short = loop_set.shape[0] > 0
    states[0] = start
    ticks[0] = 0
    crits[0] = 0
    n = node_byte.shape[0]
    i = 0
    while i < n:
        d = node_depth[i]
        s = states[d - 1]
        k = cls[node_byte[i]]
        t = table[s, k]
        if t < 0 or (act[s, k] & 12) != 0 or region[t] < 0:
            i = node_skip[i]
            continue
        tk = ticks[d - 1] + (1 if act[s, k] & 2 else 0)
        cr = max(crits[d - 1], tk + need[t])
        states[d] = t
        ticks[d] = tk
        crits[d] = cr
        for k2 in range(tok_lo[i], tok_hi[i]):
            crit[tok_ids[k2]] = cr
        if short and (sub[i] & 255) <= loop_set[t]:
            step = 1 if loop_tick[t] else 0
            base = tk - d * step + need[t]
            for k2 in range(tok_hi[i], tok_end[i]):
                v = base + tok_depth[k2] * step
                crit[tok_ids[k2]] = v if v > cr else cr
            i = node_skip[i]
            continue
        i += 1
    return 0


_walk_crit = kernel(_walk_crit_py, __name__, "_walk_crit")


def _count_reach_py(
    table, act, cls, region, need, start, node_byte, node_depth, node_skip, tok_lo, tok_hi, states, ticks,
    crits, hi_seen, lo_seen, sub, tok_end, tok_depth, loop_set, loop_tick
):  # fmt: skip
    """What of the count the tokens from region state ``start`` can see. A token's path is
    checked against the count only while it is in the region it started in (an EXIT or ENTER
    sets the count): its *margin* is the most, over that part, of items started so far +
    ``need`` of the state reached (it passes hi from count c iff ``c + margin <= hi``), and
    where it exits, the items started before (it passes lo iff ``c + those >= lo``). Marks
    ``hi_seen[margin]`` for every token's margin (a margin past the array's end is not
    marked) and ``lo_seen[items]`` for every exit. Every transition is taken as if the count
    allowed it (a token cut by a bound still marks), so from two counts that no mark tells
    apart every token passes the same bounds. The subtree shortcut of ``_walk_crit_py``
    (``loop_set`` not empty): below a node reached in state t whose subtree's bytes t keeps,
    no token exits and each marks the margin ``_walk_crit_py`` gives it, without walking."""
    short = loop_set.shape[0] > 0
    states[0] = start
    ticks[0] = 0
    crits[0] = 0
    n_hi = hi_seen.shape[0]
    n = node_byte.shape[0]
    i = 0
    while i < n:
        d = node_depth[i]
        s = states[d - 1]
        k = cls[node_byte[i]]
        t = table[s, k]
        if t < 0:
            i = node_skip[i]
            continue
        a = act[s, k]
        tk = ticks[d - 1]
        cr = crits[d - 1]
        if a & 12:  # EXIT | ENTER: the count is set; every token below has this margin
            if a & 4:  # EXIT: checked against lo with the count before this transition
                lo_seen[tk] = True
            if cr < n_hi:
                hi_seen[cr] = True
            i = node_skip[i]
            continue
        if a & 2:  # TICK
            tk += 1
        if region[t] >= 0:
            cr = max(cr, tk + need[t])
        if tok_hi[i] > tok_lo[i] and cr < n_hi:
            hi_seen[cr] = True
        if short and (sub[i] & 255) <= loop_set[t]:
            if loop_tick[t]:  # a token at depth D: D - d more items
                base = tk - d + need[t]
                for k2 in range(tok_hi[i], tok_end[i]):
                    v = base + tok_depth[k2]
                    v = v if v > cr else cr
                    if v < n_hi:
                        hi_seen[v] = True
            elif tok_end[i] > tok_hi[i] and cr < n_hi:  # every token below: the node's margin
                hi_seen[cr] = True
            i = node_skip[i]
            continue
        states[d] = t
        ticks[d] = tk
        crits[d] = cr
        i += 1
    return 0


_count_reach = kernel(_count_reach_py, __name__, "_count_reach")


# Byte sets for the walk's shortcut, each inside the next: a subtree whose bytes all lie
# in a set is taken whole when the automaton stays alive (and off boundaries) for any
# string over the set as long as the subtree is deep.
_LOWER = set(range(0x61, 0x7B))
_ALPHA = _LOWER | set(range(0x41, 0x5B))
_ALNUM = _ALPHA | set(range(0x30, 0x3A))
_WORD = _ALNUM | {0x2D, 0x2E, 0x5F}  # - . _
_PRINT = set(range(0x20, 0x7F)) - {0x22, 0x5C}  # printable ASCII but " and \
_GRAPH = _PRINT - {0x20}  # and not the space: what loops in a pattern's \S+
SHORTCUT_SETS = (_LOWER, _ALPHA, _ALNUM, _WORD, _GRAPH, _PRINT)
N_SETS = len(SHORTCUT_SETS)
_SET_ROWS = np.concatenate([np.full(len(bs), j, dtype=np.int32) for j, bs in enumerate(SHORTCUT_SETS)])
_SET_BYTES = np.concatenate([np.array(sorted(bs), dtype=np.int32) for bs in SHORTCUT_SETS])


_NO_LOOPS = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.bool_))
_SET_BYTE_LISTS = [np.array(sorted(bs), dtype=np.int64) for bs in SHORTCUT_SETS]


def chain_set(
    table: np.ndarray, cls: np.ndarray, boundary: np.ndarray, recall: tuple, side: np.ndarray | None
) -> int:
    """For a chain walk (``recall = (recall_from, recall_to, max_level)``, ``side``: the side
    walks' start states): the largest shortcut set each of whose bytes takes ``recall_to``
    straight to ``recall_from`` (an item of one byte: a string's ASCII character) and is read
    by no side walk's state, -1 if none. Below a node where the chain goes on, a subtree over
    that set goes on at every byte until ``max_level``."""
    recall_from, recall_to = int(recall[0]), int(recall[1])
    if recall_from < 0 or not boundary[recall_from]:
        return -1
    best = -1
    for j, byte_list in enumerate(_SET_BYTE_LISTS):  # (nested: a set's subsets pass too)
        k = cls[byte_list]
        if not (table[recall_to, k] == recall_from).all():
            break
        if side is not None and len(side) and (table[np.asarray(side)[:, None], k[None, :]] >= 0).any():
            break
        best = j
    return best


def counted_loops(
    table: np.ndarray, act: np.ndarray, cls: np.ndarray, region: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per state t of a counted automaton: the largest shortcut set (index into
    SHORTCUT_SETS; -1: none) each of whose bytes keeps t with one counter action for all,
    no action or TICK alone, and whether that action is TICK; for the states of a region
    (``region >= 0``) only, the others -1. The counted walk takes a subtree over such a set
    whole (see ``_walk_counted_py``): its state never changes there, and its count grows by
    at most the subtree's height."""
    n = table.shape[0]
    inside = np.flatnonzero(region >= 0)
    inside = inside[table[inside, cls[0x61]] == inside]  # ("a" is in every set: a loop there first)
    loop_set = np.full(n, -1, dtype=np.int32)
    loop_tick = np.zeros(n, dtype=np.bool_)
    ok = np.ones(len(inside), dtype=np.bool_)
    tick = np.zeros(len(inside), dtype=np.bool_)
    sub_t, sub_a = table[inside], act[inside]
    for j, byte_list in enumerate(_SET_BYTE_LISTS):  # (nested: a set's loop is its subsets' too)
        k = cls[byte_list]  # (each byte's class, as chain_set reads them)
        t, a = sub_t[:, k], sub_a[:, k]
        ok &= (t == inside[:, None]).all(axis=1) & ((a == 0).all(axis=1) | (a == 2).all(axis=1))
        if j == 0:
            tick = a[:, 0] == 2
        loop_set[inside[ok]] = j
    loop_tick[inside] = tick
    return loop_set, loop_tick


def _subtree_sets_py(node_byte, node_depth, node_skip, tok_lo, n_tok, byte_set, sub_set, sub_height, tok_end):
    """Per node: the first shortcut set holding every byte below it (``N_SETS``: none or
    no children), the depth of its subtree below it, and the end of its subtree's tokens
    in ``tok_ids`` (tokens are stored in DFS order). ``byte_set[b]``: first set with b."""
    n = node_byte.shape[0]
    parent = np.full(n, -1, dtype=np.int64)
    path = np.full(256, -1, dtype=np.int64)  # the last node met at each depth
    for i in range(n):
        sub_set[i] = N_SETS
        sub_height[i] = 0
        d = node_depth[i]
        if d > 1:
            parent[i] = path[d - 1]
        if d >= path.shape[0]:
            path = np.concatenate((path, np.full(d + 1, -1, dtype=np.int64)))
        path[d] = i
    for i in range(n - 1, -1, -1):
        sk = node_skip[i]
        tok_end[i] = tok_lo[sk] if sk < n else n_tok
        p = parent[i]  # fold i into its parent
        if p < 0:
            continue
        mine = byte_set[node_byte[i]]
        if sub_height[i] > 0 and sub_set[i] > mine:
            mine = sub_set[i]
        if sub_height[p] == 0:
            sub_set[p] = mine
        elif mine > sub_set[p]:
            sub_set[p] = mine
        if sub_height[i] + 1 > sub_height[p]:
            sub_height[p] = sub_height[i] + 1
    return 0


ALIVE_CAP = 127  # alive depths are kept up to this (deeper than any token)


def _alive_depth(table, boundary, t, j, set_cls, depth_memo, level, nxt, mark, stamp, chain):
    """A lower bound (exact below :data:`ALIVE_CAP`) of how deep every string over
    shortcut set ``j`` keeps the automaton alive and off boundaries from ``t``: level by
    level over the states reachable, or from the memo ``depth_memo[:, j]`` once a whole
    level is in it. Levels of one state are memoised too (all paths pass through it)."""
    nl = 1
    level[0] = t
    h = 0
    nc = 0
    n_cls = set_cls[j, 256]
    while h < ALIVE_CAP:
        if h > 0:
            known = True
            best = ALIVE_CAP
            for x in range(nl):
                v = depth_memo[level[x], j]
                if v < 0:
                    known = False
                    break
                if v < best:
                    best = v
            if known:
                h = min(ALIVE_CAP, h + best)
                break
            if nl == 1:
                chain[2 * nc] = level[0]
                chain[2 * nc + 1] = h
                nc += 1
        stamp[0] += 1
        nn = 0
        bad = False
        for x in range(nl):
            s = level[x]
            for k in range(n_cls):
                u = table[s, set_cls[j, k]]
                if u < 0 or boundary[u]:
                    bad = True
                    break
                if mark[u] != stamp[0]:
                    mark[u] = stamp[0]
                    nxt[nn] = u
                    nn += 1
            if bad:
                break
        if bad:
            break
        if nn == 1 and nl == 1 and nxt[0] == level[0]:  # a self-loop: as deep as any token
            h = ALIVE_CAP
            break
        h += 1
        for x in range(nn):
            level[x] = nxt[x]
        nl = nn
    depth_memo[t, j] = h
    for x in range(nc):  # the only state at its level
        u = chain[2 * x]
        if depth_memo[u, j] < 0:
            depth_memo[u, j] = max(0, h - chain[2 * x + 1])
    return h


# columns of VocabIndex.fast_nodes
F_BYTE, F_DEPTH, F_SKIP, F_WORD, F_TOK_LO, F_TOK_HI, F_TOK_END, F_SUB = range(8)


def _walk_range(
    table,
    cls,
    boundary,
    depth_memo,
    set_cls,
    level,
    nxt,
    mark,
    stamp,
    chain,
    start,
    nodes,
    tok_bit,
    tok_ids,
    los,
    his,
    base_depths,
    n_ranges,
    out,
    bnd_nodes,
    bnd_states,
    states,
    range_starts,
    recall_from,
    recall_to,
    max_level,
    chain_set,
    lev,
    bnd_levels,
    side_states,
    pend_level,
    pend_node,
    side_mark,
    side_stamp,
    side_nodes,
    side_levels,
    side_count,
):
    """``_walk_py`` over the DFS ranges ``los[r]..his[r]-1`` (roots at ``base_depths[r] + 1``)
    for ``r < n_ranges``, in one call (a call per range costs more than a small range's
    walk), with three changes, same results: the state of the previous node is kept when
    the next is its child; a node's first token is set without a branch; and below a live,
    non-boundary node whose subtree's bytes lie in a shortcut set deeper than the subtree
    (see :func:`_alive_depth`), every token is set without walking.

    ``range_starts`` (if not empty): each range's own start state. A chain of calls
    (``recall_from >= 0``, see :meth:`VocabIndex.walk_fast`): every boundary pair also gets
    its level in ``bnd_levels`` (from 1), and below a node reached in ``recall_from`` at
    level ``l < max_level`` the walk goes on from ``recall_to`` at level ``l + 1``. ``lev``
    holds the level per depth, and in its last item the highest level reached; a node where
    the walk goes on is not a boundary pair. With ``side_states`` (start state per level, not
    empty), :func:`_note_side` lists each root whose child byte ``side_states[0]`` reads, and
    each node where level ``l`` went on whose child byte ``side_states[l]`` reads (where a
    side walk from that state below that node can find anything). ``chain_set`` (a shortcut
    set, -1: none; :func:`chain_set`): each of its bytes is an item of its own, which no side
    walk reads; below a node where the walk goes on at level l, a subtree over it with l +
    its height <= ``max_level`` goes on at every node, and its tokens are set without
    walking."""
    nb = 0
    side_on = side_states.shape[0] > 0
    for r in range(n_ranges):
        base_depth = base_depths[r]
        hi = his[r]
        if range_starts.shape[0]:
            start = range_starts[r]
        states[base_depth] = start
        lev[base_depth] = 1
        if side_on:
            pend_level[base_depth] = 0
            pend_node[base_depth] = los[r] - 1
        i = los[r]
        prev_d = base_depth
        prev_s = start
        while i < hi:
            d = nodes[i, F_DEPTH]
            s = prev_s if d == prev_d + 1 else states[d - 1]
            if side_on:
                pl = pend_level[d - 1]
                if pl >= 0 and table[side_states[pl], cls[nodes[i, F_BYTE]]] >= 0:  # a side walk reads it
                    x = pend_node[d - 1]
                    _note_side(x, pl, side_mark, side_stamp, side_nodes, side_levels, side_count)
            t = table[s, cls[nodes[i, F_BYTE]]]
            if t < 0:
                i = nodes[i, F_SKIP]
                continue
            out[nodes[i, F_WORD]] |= tok_bit[i]
            k0 = nodes[i, F_TOK_LO]
            k1 = nodes[i, F_TOK_HI]
            if k1 - k0 > 1:  # tokens with the same bytes (rare)
                for k in range(k0 + 1, k1):
                    tid = tok_ids[k]
                    out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
            if recall_from >= 0:
                lv = lev[d - 1]
                lev[d] = lv
                if side_on:
                    pend_level[d] = -1
                if boundary[t]:
                    if t == recall_from and lv < max_level:  # the rule called again, below
                        t = recall_to
                        lev[d] = lv + 1  # (inline: as a kernel call, the chain walk took 1.7x)
                        if lv + 1 > lev[lev.shape[0] - 1]:
                            lev[lev.shape[0] - 1] = lv + 1
                        if side_on:
                            pend_level[d] = lv
                            pend_node[d] = i
                        sub = nodes[i, F_SUB]
                        top = lv + 1 + (sub >> 8)
                        if (sub & 255) <= chain_set and top <= max_level:  # every byte below goes on
                            for k in range(k1, nodes[i, F_TOK_END]):
                                tid = tok_ids[k]
                                out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                            if top > lev[lev.shape[0] - 1]:
                                lev[lev.shape[0] - 1] = top
                            i = nodes[i, F_SKIP]
                            continue
                    else:
                        bnd_nodes[nb] = i
                        bnd_states[nb] = t
                        bnd_levels[nb] = lv
                        nb += 1
                    states[d] = t
                    prev_d = d
                    prev_s = t
                    i += 1
                    continue
            if boundary[t]:
                bnd_nodes[nb] = i
                bnd_states[nb] = t
                nb += 1
            else:
                sub = nodes[i, F_SUB]
                j = sub & 255
                if j < N_SETS and depth_memo.shape[0]:  # (a light memo has no depths)
                    h = depth_memo[t, j]
                    if h < 0:
                        h = _alive_depth(
                            table, boundary, t, j, set_cls, depth_memo, level, nxt, mark, stamp, chain
                        )
                    if (sub >> 8) <= h:
                        for k in range(k1, nodes[i, F_TOK_END]):
                            tid = tok_ids[k]
                            out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
                        i = nodes[i, F_SKIP]
                        continue
            states[d] = t
            prev_d = d
            prev_s = t
            i += 1
    return nb


def _walk_fast_py(
    table,
    cls,
    boundary,
    depth_memo,
    set_cls,
    mscr,
    nodes,
    tok_bit,
    tok_ids,
    root_of_byte,
    bnd_nodes,
    bnd_states,
    states,
    lev,
    bnd_levels,
    pend_level,
    pend_node,
    side_mark,
    side_nodes,
    side_levels,
    side_count,
    starts,
    recall_from,
    recall_to,
    max_level,
    chain_set,
    side_states,
    side_stamp,
    start,
    roots,
    out,
):
    """:func:`_walk_range` over the whole trie when ``roots`` is empty, else over the
    subtrees below each node of ``roots`` (children only; from ``starts[i]`` below
    ``roots[i]`` if ``starts`` is not empty). The whole trie is entered
    only at the first bytes alive in ``start`` (``root_of_byte``: the depth-1 node of
    each byte, -1: none), so dead first bytes cost no memory traffic. ``mscr``: the
    memo's scratch (:class:`WalkMemo`). Returns the number of boundary pairs.

    The arguments come in the order they change: the memo's tables, the trie's, the
    thread's scratch (:meth:`VocabIndex._fast_walk` binds those once), a chain's (the
    same in every plain walk), then the walk's own start, roots and row."""
    n = table.shape[0]
    stamp = mscr[0:1]
    level = mscr[1 : 1 + n]
    nxt = mscr[1 + n : 1 + 2 * n]
    mark = mscr[1 + 2 * n : 1 + 3 * n]
    chain = mscr[1 + 3 * n :]
    m = roots.shape[0] if roots.shape[0] else 256
    los = np.empty(m, dtype=np.int64)
    his = np.empty(m, dtype=np.int64)
    bases = np.zeros(m, dtype=np.int64)
    k = 0
    if roots.shape[0] == 0:
        for b in range(256):
            r = root_of_byte[b]
            if r < 0 or table[start, cls[b]] < 0:
                continue
            los[k] = r
            his[k] = nodes[r, F_SKIP]
            k += 1
    else:
        for x in range(roots.shape[0]):
            node = roots[x]
            los[k] = node + 1
            his[k] = nodes[node, F_SKIP]
            bases[k] = nodes[node, F_DEPTH]
            k += 1
    range_starts = starts if roots.shape[0] else starts[:0]
    return _walk_range(
        table,
        cls,
        boundary,
        depth_memo,
        set_cls,
        level,
        nxt,
        mark,
        stamp,
        chain,
        start,
        nodes,
        tok_bit,
        tok_ids,
        los,
        his,
        bases,
        k,
        out,
        bnd_nodes,
        bnd_states,
        states,
        range_starts,
        recall_from,
        recall_to,
        max_level,
        chain_set,
        lev,
        bnd_levels,
        side_states,
        pend_level,
        pend_node,
        side_mark,
        side_stamp,
        side_nodes,
        side_levels,
        side_count,
    )


def _set_classes_py(cls, set_rows, set_bytes, set_cls):
    """``set_cls[j, :count]``: the classes of shortcut set j's bytes; count at column 256."""
    seen = np.zeros((set_cls.shape[0], 256), dtype=np.bool_)
    set_cls[:, 256] = 0
    for x in range(set_rows.shape[0]):
        j = set_rows[x]
        c = cls[set_bytes[x]]
        if not seen[j, c]:
            seen[j, c] = True
            set_cls[j, set_cls[j, 256]] = c
            set_cls[j, 256] += 1
    return 0


_set_classes = kernel(_set_classes_py, __name__, "_set_classes")
_subtree_sets = kernel(_subtree_sets_py, __name__, "_subtree_sets")
_alive_depth = kernel(_alive_depth, __name__, "_alive_depth")
_walk_range = kernel(_walk_range, __name__, "_walk_range")
_walk_fast = kernel(_walk_fast_py, __name__, "_walk_fast")


_NO_ROOTS = np.zeros(0, dtype=np.int32)
_FIXED = 21  # _walk_fast's arguments that stay the same (VocabIndex._fast_walk)
_PLAIN = (_NO_ROOTS, -1, -1, 0, -1, _NO_ROOTS, 0)  # its chain arguments in a plain walk
_NO_COUNTS = np.zeros(0, dtype=np.int64)
_COUNTED_KEPT = 64  # automata whose bound counted walk a trie keeps (per thread)


def _walk_result(nb: int, bnd_nodes, bnd_states, bnd_levels, lev, side_args: tuple, recall) -> tuple:
    """What a walk returns: ``(nodes, states)`` of its ``nb`` boundary pairs, and with
    ``recall`` their levels, the highest level reached and the side walks' ``(nodes,
    levels)`` (``side_args`` as :meth:`VocabIndex._side` made them)."""
    nodes, states = bnd_nodes[:nb].copy(), bnd_states[:nb].copy()
    if recall is None:
        return nodes, states
    k = int(side_args[7][0])
    sides = (side_args[5][:k].copy(), side_args[6][:k].copy())
    return nodes, states, bnd_levels[:nb].copy(), int(lev[-1]), sides


_NO_DEPTHS = np.zeros((0, N_SETS), dtype=np.int16)
_NO_SET_CLS = np.zeros((N_SETS, 257), dtype=np.int32)
_NO_SCRATCH = np.zeros(1, dtype=np.int64)


class WalkMemo:
    """Per automaton, what the fast walks learn about its states (the alive depth of each
    state for each shortcut set, per boundary set: bottom of the stack or inner) and
    their scratch space."""

    def __init__(self, table: np.ndarray, cls: np.ndarray, bottom: np.ndarray, inner: np.ndarray) -> None:
        n = table.shape[0]
        self.table, self.cls = table, cls
        self.boundary = (
            np.ascontiguousarray(bottom, dtype=np.bool_),
            np.ascontiguousarray(inner, dtype=np.bool_),
        )
        depth = np.full((2, n, N_SETS), -1, dtype=np.int16)
        self.depth = (depth[0], depth[1])
        self.set_cls = np.empty((N_SETS, 257), dtype=np.int32)
        _set_classes(cls, _SET_ROWS, _SET_BYTES, self.set_cls)
        self.scratch = np.zeros(3 * n + 2 * ALIVE_CAP + 3, dtype=np.int64)  # stamp, levels, marks, chain
        self.bound: dict = {}  # (trie, inner, thread, plain) -> _walk_fast bound (VocabIndex._fast_walk);
        # (trie, inner, thread) -> a plain walk's binding and buffers (VocabIndex._plain_walk)

    @classmethod
    def light(cls_, table: np.ndarray, cls: np.ndarray, bottom: np.ndarray, inner: np.ndarray) -> WalkMemo:
        """A memo without alive depths (the walks take no shortcut): free to make, for
        automata whose walks so far were small."""
        m = cls_.__new__(cls_)
        m.table, m.cls = table, cls
        m.boundary = (
            np.ascontiguousarray(bottom, dtype=np.bool_),
            np.ascontiguousarray(inner, dtype=np.bool_),
        )
        m.depth = (_NO_DEPTHS, _NO_DEPTHS)
        m.set_cls = _NO_SET_CLS
        m.scratch = _NO_SCRATCH
        m.bound = {}
        return m


class VocabIndex:
    """The vocabulary's byte trie in DFS order (built once per vocabulary).

    Arrays, one entry per trie node ``i``: ``node_byte[i]`` (the byte on the edge into
    ``i``), ``node_depth[i]`` (1 for the first byte), ``node_skip[i]`` (the first node
    after ``i``'s subtree); tokens ending at ``i`` are ``tok_ids[tok_lo[i]:tok_hi[i]]``.
    """

    def __init__(self, vocab, keep=None) -> None:
        self.vocab_size = vocab.vocab_size
        self.n_words = (self.vocab_size + 31) // 32
        pairs = sorted((b, i) for i, b in enumerate(vocab.token_bytes) if b and (keep is None or keep(b)))
        node_byte: list[int] = []
        node_depth: list[int] = []
        tok_lo: list[int] = []
        tok_hi: list[int] = []
        tok_ids: list[int] = []
        path_nodes: list[int] = []  # node index at each depth of the current path
        prev = b""
        for data, tid in pairs:
            common = 0
            lim = min(len(prev), len(data))
            while common < lim and prev[common] == data[common]:
                common += 1
            if common == len(data) and len(prev) == len(data):
                # same bytes as the previous token: another id on the same node
                tok_ids.append(tid)
                tok_hi[path_nodes[-1]] = len(tok_ids)
                continue
            del path_nodes[common:]
            for d in range(common, len(data)):
                n = len(node_byte)
                node_byte.append(data[d])
                node_depth.append(d + 1)
                tok_lo.append(len(tok_ids))
                tok_hi.append(len(tok_ids))
                path_nodes.append(n)
            tok_ids.append(tid)
            tok_lo[path_nodes[-1]] = len(tok_ids) - 1
            tok_hi[path_nodes[-1]] = len(tok_ids)
            prev = data
        n = len(node_byte)
        self.n_nodes = n
        self.node_byte = np.array(node_byte, dtype=np.int32)
        self.node_depth = np.array(node_depth, dtype=np.int32)
        self.tok_lo = np.array(tok_lo, dtype=np.int32)
        self.tok_hi = np.array(tok_hi, dtype=np.int32)
        self.tok_ids = np.array(tok_ids, dtype=np.int32)
        # skip[i]: first node after the subtree of i = next node with depth <= depth[i]
        skip = np.full(n, n, dtype=np.int32)
        stack: list[int] = []
        for i, d in enumerate(node_depth):
            while stack and node_depth[stack[-1]] >= d:
                skip[stack.pop()] = i
            stack.append(i)
        self.node_skip = skip
        self._derive()

    BASE = (
        "node_byte",
        "node_depth",
        "tok_lo",
        "tok_hi",
        "tok_ids",
        "node_skip",
    )  # what the rest derives from
    DERIVED = ("tok_bit", "fast_nodes", "root_of_byte")  # what _derive makes of them

    @classmethod
    def from_arrays(cls, vocab_size: int, arrays: dict) -> VocabIndex:
        """The trie of the :data:`BASE` arrays of one built before (:mod:`.trie_cache`), and
        of its :data:`DERIVED` ones when given (else derived again)."""
        self = cls.__new__(cls)
        self.vocab_size = vocab_size
        self.n_words = (vocab_size + 31) // 32
        for name in cls.BASE:
            setattr(self, name, np.ascontiguousarray(arrays[name], dtype=np.int32))
        self.n_nodes = len(self.node_byte)
        if all(name in arrays for name in cls.DERIVED):  # (as _derive made them)
            self.max_depth = int(self.node_depth.max()) if self.n_nodes else 0
            self._scratches = {}
            self.tok_bit = np.ascontiguousarray(arrays["tok_bit"]).view(np.uint32)  # (stored as int32)
            self.fast_nodes = np.ascontiguousarray(arrays["fast_nodes"], dtype=np.int32).reshape(-1, 8)
            self.root_of_byte = np.ascontiguousarray(arrays["root_of_byte"], dtype=np.int32)
        else:
            self._derive()
        return self

    def _derive(self) -> None:
        """The walks' arrays, from the :data:`BASE` ones."""
        n = self.n_nodes
        self.max_depth = int(self.node_depth.max()) if n else 0
        self._scratches: dict = {}
        # each node's first token as (word, bit) for the packed walks; no token: bit 0
        has = self.tok_hi > self.tok_lo
        first = np.zeros(n, dtype=np.int64)
        first[has] = self.tok_ids[self.tok_lo[has]]
        tok_word = (first >> 5).astype(np.int32)
        self.tok_bit = np.where(has, np.left_shift(np.uint32(1), (first & 31).astype(np.uint32)), 0).astype(
            np.uint32
        )
        byte_set = np.full(256, N_SETS, dtype=np.int8)
        for j in range(N_SETS - 1, -1, -1):
            byte_set[sorted(SHORTCUT_SETS[j])] = j
        sub_set = np.empty(n, dtype=np.int8)
        sub_height = np.empty(n, dtype=np.int16)
        tok_end = np.empty(n, dtype=np.int32)
        _subtree_sets(
            self.node_byte,
            self.node_depth,
            self.node_skip,
            self.tok_lo,
            len(self.tok_ids),
            byte_set,
            sub_set,
            sub_height,
            tok_end,
        )
        self.root_of_byte = np.full(256, -1, dtype=np.int32)
        top = np.nonzero(self.node_depth == 1)[0]
        self.root_of_byte[self.node_byte[top]] = top
        # the fast walks read a node's fields from one row (columns F_*)
        self.fast_nodes = np.ascontiguousarray(
            np.stack(
                [
                    self.node_byte,
                    self.node_depth,
                    self.node_skip,
                    tok_word,
                    self.tok_lo,
                    self.tok_hi,
                    tok_end,
                    sub_set.astype(np.int32) | (sub_height.astype(np.int32) << 8),
                ],
                axis=1,
            ).astype(np.int32)
        )

    def walk(
        self, table, cls, start: int, boundary, out, lo: int = 0, hi: int | None = None, base_depth: int = 0
    ):
        """Walk the subtree range ``lo..hi`` from DFA state ``start`` (see ``_walk_py``).

        Returns ``(nodes, states)`` of the boundary pairs met.
        """
        hi = self.n_nodes if hi is None else hi
        bnd_nodes, bnd_states, states = self._scratch()
        nb = _walk(
            table,
            cls,
            np.int32(start),
            *self._trie_arrays(),
            lo,
            hi,
            base_depth,
            boundary,
            out,
            bnd_nodes,
            bnd_states,
            states,
        )
        return bnd_nodes[:nb].copy(), bnd_states[:nb].copy()

    def walk_below(self, table, cls, start: int, boundary, out, roots: np.ndarray):
        """Walk the subtrees below every node of ``roots`` from DFA state ``start``."""
        cap = int((self.node_skip[roots] - roots).sum()) if len(roots) else 0
        bnd_nodes = np.empty(cap, dtype=np.int32)
        bnd_states = np.empty(cap, dtype=np.int32)
        states = np.empty(self.max_depth + 1, dtype=np.int32)
        nb = _walk_many(
            table,
            cls,
            np.int32(start),
            *self._trie_arrays(),
            roots.astype(np.int32),
            boundary,
            out,
            bnd_nodes,
            bnd_states,
            states,
        )
        return bnd_nodes[:nb], bnd_states[:nb]

    def walk_counted(
        self,
        table,
        counters,
        cls,
        start: int,
        count: int,
        out,
        boundary=None,
        roots: np.ndarray | None = None,
        recall: tuple[int, int, int] | None = None,
        starts: np.ndarray | None = None,
        side: np.ndarray | None = None,
        loops: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        """Set the tokens allowed from configuration (``start``, ``count``) of an automaton
        with counted repetitions (``counters``: its :class:`~..automaton.counted.Counters`), over the
        whole trie or below ``roots``. Returns ``(nodes, states)`` of the boundary pairs met.
        ``starts``: each root's own configuration (state + n_states * count) instead.
        ``recall``: a chain of calls, as in :meth:`walk_fast` (``recall_to`` a configuration);
        then ``(nodes, states, levels, the highest level reached, sides)`` (as there).
        ``loops``: :func:`counted_loops` of the automaton, for the subtree shortcut (None:
        every node walked; the same tokens)."""
        roots, bnd_nodes, bnd_states, bnd_levels, states, lev = self._walk_buffers(roots)
        n = table.shape[0]
        recall_from, to_state, to_count, max_level = -1, -1, 0, 0
        if recall is not None:
            recall_from, max_level = recall[0], recall[2]
            to_state, to_count = recall[1] % n, recall[1] // n
        side_args = self._side(side)
        if starts is None:
            start_states, start_counts = _NO_ROOTS, _NO_COUNTS
        else:
            start_states, start_counts = (starts % n).astype(np.int32), (starts // n).astype(np.int64)
        walk, none_boundary = self._counted_walk(table, counters, cls, loops)
        if boundary is None:
            boundary = none_boundary
        if bnd_nodes is not walk.args[17]:  # (nested roots: larger boundary buffers, this once)
            args = list(walk.args)
            args[17], args[18], args[22] = bnd_nodes, bnd_states, bnd_levels
            walk = bind(_walk_counted_many, *args)
        nb = walk(
            boundary,
            out,
            np.asarray(roots, dtype=np.int32),
            np.int32(start),
            np.int64(count),
            start_states,
            start_counts,
            int(recall_from),
            int(to_state),
            int(to_count),
            int(max_level),
            side_args[0],
            side_args[4],
        )
        return _walk_result(nb, bnd_nodes, bnd_states, bnd_levels, lev, side_args, recall)

    def subtree_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the counted walks' subtree shortcut reads, contiguous (made on first use,
        about 2 ms for Llama 3's trie: ``CompiledConstraint`` asks for it when it compiles an
        automaton with counters): ``fast_nodes``' subtree set and height (F_SUB) and tokens'
        end (F_TOK_END) columns, and per place in ``tok_ids`` the depth (byte length) of its
        token's node."""
        cols = self.__dict__.get("_sub_cols")
        if cols is None:
            # tokens lie in tok_ids in DFS order (as F_TOK_END reads them): the nodes' ranges
            # end to end
            depths = np.repeat(self.node_depth, self.tok_hi - self.tok_lo)
            cols = self._sub_cols = (
                np.ascontiguousarray(self.fast_nodes[:, F_SUB]),
                np.ascontiguousarray(self.fast_nodes[:, F_TOK_END]),
                np.ascontiguousarray(depths, dtype=np.int32),
            )
        return cols

    def _trie_arrays(self) -> tuple:
        """The trie as the walk kernels take it, in their order: per node its byte, depth and
        the end of its subtree; per node its tokens' range in ``tok_ids``; the token ids."""
        return self.node_byte, self.node_depth, self.node_skip, self.tok_lo, self.tok_hi, self.tok_ids

    def _region_walk(self, table, counters, cls, start: int) -> tuple:
        """The leading arguments of a walk from region state ``start`` that tracks items
        (``_walk_crit``, ``_count_reach``): the automaton, its counters, the trie."""
        return (table, counters.act, cls, counters.region, counters.need, np.int32(start),
                *self._trie_arrays()[:5])  # fmt: skip

    def _depth_scratch(self) -> tuple:
        """Per depth: the state, the items started, the margin so far."""
        d = self.max_depth + 2
        return np.empty(d, dtype=np.int32), np.empty(d, dtype=np.int64), np.empty(d, dtype=np.int64)

    def walk_crit(
        self, table, counters, cls, start: int, crit: np.ndarray, loops: tuple | None = None
    ) -> None:
        """Write into ``crit`` (int64 [vocab]) the count margin of each token that stays
        inside ``start``'s counted region (see ``_walk_crit_py``); ``loops`` as in
        :meth:`walk_counted`."""
        walk = self._region_walk(table, counters, cls, start)
        _walk_crit(*walk, self.tok_ids, crit, *self._depth_scratch(), *self.subtree_columns(),
                   *(loops if loops is not None else _NO_LOOPS))  # fmt: skip

    def count_reach(
        self, table, counters, cls, start: int, most: int, loops: tuple | None = None
    ) -> tuple[list[int], list[int]]:
        """``_count_reach_py`` from region state ``start`` over the whole vocabulary: the
        tokens' margins up to ``most`` and the items started before their exits, each sorted;
        ``loops`` as in :meth:`walk_counted`."""
        hi_seen = np.zeros(most + 1, dtype=np.bool_)
        lo_seen = np.zeros(self.max_depth + 2, dtype=np.bool_)
        walk = self._region_walk(table, counters, cls, start)
        _count_reach(*walk, *self._depth_scratch(), hi_seen, lo_seen, *self.subtree_columns(),
                     *(loops if loops is not None else _NO_LOOPS))  # fmt: skip
        return np.flatnonzero(hi_seen).tolist(), np.flatnonzero(lo_seen).tolist()

    def _walk_buffers(self, roots: np.ndarray | None) -> tuple:
        """``(roots, boundary nodes, their states, their levels, the state stack, the level
        per depth)`` of a kernel walk below ``roots`` (None: the whole trie), the boundary
        buffers with room for every pair."""
        bnd_nodes, bnd_states, states = self._scratch()
        lev, bnd_levels = self._level_scratch()[:2]
        lev[-1] = 1
        if roots is None:
            roots = _NO_ROOTS
        elif len(roots) > 1:  # nested roots walk a subtree twice: room for every pair
            cap = int((self.node_skip[roots] - roots).sum())
            if cap > self.n_nodes:
                bnd_nodes, bnd_states, bnd_levels = (np.empty(cap, dtype=np.int32) for _ in range(3))
        return roots, bnd_nodes, bnd_states, bnd_levels, states, lev

    def _level_scratch(self):
        """The level per depth (and, last, the highest level reached) and per boundary pair
        of a walk, and the side walks' scratch, for chains of calls."""
        key = ("levels", threading.get_ident())
        sc = self._scratches.get(key)
        if sc is None:
            sc = self._scratches[key] = (
                np.zeros(self.max_depth + 3, dtype=np.int64),
                np.empty(self.n_nodes, dtype=np.int32),
                np.full(self.max_depth + 3, -1, dtype=np.int32),  # per depth: the side level
                np.zeros(self.max_depth + 3, dtype=np.int32),  # per depth: its node
                [np.zeros(self.n_nodes, dtype=np.int32), 0],  # the side marks, their stamp
                np.empty(self.n_nodes, dtype=np.int32),  # the side walks' roots
                np.empty(self.n_nodes, dtype=np.int32),  # and their levels
                np.zeros(1, dtype=np.int64),  # how many
            )
        return sc

    def _bound_scratch(self, *between) -> tuple:
        """This thread's scratch in the order the bound walks take it after their tables:
        the boundary buffers and the state stack (:meth:`_scratch`), then ``between`` (a
        kernel's own buffers), then the levels and side walks' scratch
        (:meth:`_level_scratch`, the side marks without their stamp)."""
        lev, bnd_levels, pend_level, pend_node, marks, side_nodes, side_levels, count = self._level_scratch()
        return (*self._scratch(), *between, lev, bnd_levels, pend_level, pend_node, marks[0], side_nodes,
                side_levels, count)  # fmt: skip

    def _fast_walk(self, memo: WalkMemo, inner: bool, plain: bool):
        """``_walk_fast`` bound to ``memo``'s tables for ``inner``, this trie's and this
        thread's scratch (kept on the memo), and with ``plain`` to a plain walk's chain
        arguments too (no chain, no side walks)."""
        key = (self, inner, threading.get_ident(), plain)  # (the trie itself: an id may be reused)
        hit = memo.bound.get(key)
        if hit is None:
            fixed = (
                memo.table,
                memo.cls,
                memo.boundary[inner],
                memo.depth[inner],
                memo.set_cls,
                memo.scratch,
                self.fast_nodes,
                self.tok_bit,
                self.tok_ids,
                self.root_of_byte,
                *self._bound_scratch(),
            )
            hit = memo.bound[key] = bind(_walk_fast, *fixed, *(_PLAIN if plain else ()))
        return hit

    def _plain_walk(self, memo: WalkMemo, inner: bool) -> tuple:
        """What a plain walk of :meth:`walk_fast` takes, kept on ``memo`` per trie, ``inner``
        and thread: ``(the bound walk, boundary nodes, their states, the level per depth, the
        side walks' count)``, the buffers those the walk is bound to, with room for every
        pair of a walk below one node or of the whole trie."""
        walk = self._fast_walk(memo, inner, True)
        bnd_nodes, bnd_states, _ = self._scratch()
        lev, _, _, _, _, _, _, count = self._level_scratch()
        hit = memo.bound[(self, inner, threading.get_ident())] = (walk, bnd_nodes, bnd_states, lev, count)
        return hit

    def _counted_walk(self, table, counters, cls, loops):
        """``_walk_counted_many`` bound to the automaton's tables (``table``, ``counters``,
        ``cls``, ``loops``), this trie's and this thread's scratch: its first 29 arguments,
        checked once instead of at every walk. Kept per
        automaton in a small table (its entries hold the arrays their key names, so no key
        outlives them), with the automaton's empty boundary set."""
        loop_id = id(loops[0]) if loops is not None else 0
        key = (id(table), id(counters), id(cls), loop_id, threading.get_ident())
        bound = self._scratches.get("counted")
        if bound is None:
            bound = self._scratches["counted"] = {}
        hit = bound.get(key)
        if hit is not None:
            return hit
        hit = bind(
            _walk_counted_many,
            table,
            counters.act,
            cls,
            counters.region,
            counters.need,
            counters.lo,
            counters.hi,
            *self._trie_arrays(),
            *self.subtree_columns()[:2],
            *(loops if loops is not None else _NO_LOOPS),
            *self._bound_scratch(np.empty(self.max_depth + 2, dtype=np.int64)),
        )
        hit = (hit, np.zeros(table.shape[0], dtype=np.bool_))
        if len(bound) >= _COUNTED_KEPT:
            bound.clear()
        bound[key] = hit
        return hit

    def _side(self, side: np.ndarray | None) -> tuple:
        """The side-walk arguments of a walk (``side``: the start state per level, or None)."""
        _, _, pend_level, pend_node, marks, nodes, levels, count = self._level_scratch()
        count[0] = 0
        if side is None:
            return _NO_ROOTS, pend_level, pend_node, marks[0], 0, nodes, levels, count
        marks[1] += 1
        if marks[1] >= 2**31 - 1:
            marks[0][:] = 0
            marks[1] = 1
        return side.astype(np.int32), pend_level, pend_node, marks[0], marks[1], nodes, levels, count

    def _scratch(self):
        """Boundary buffers and the state stack of a walk, one set per thread."""
        key = threading.get_ident()
        sc = self._scratches.get(key)
        if sc is None:
            sc = (
                np.empty(self.n_nodes, dtype=np.int32),
                np.empty(self.n_nodes, dtype=np.int32),
                np.empty(self.max_depth + 2, dtype=np.int32),
            )
            self._scratches[key] = sc
        return sc

    def walk_fast(
        self,
        memo: WalkMemo,
        inner: bool,
        start: int,
        out,
        roots: np.ndarray | None = None,
        recall: tuple[int, int, int] | None = None,
        starts: np.ndarray | None = None,
        side: np.ndarray | None = None,
    ):
        """:meth:`walk` of the whole trie (or :meth:`walk_below` ``roots``) by
        ``_walk_range`` (``memo``: the automaton and what earlier walks learnt; ``inner``:
        the boundary set above the bottom of the stack). Returns ``(nodes, states)``.
        ``starts``: each root's own start state instead of ``start``.

        ``recall = (recall_from, recall_to, max_level)``: the walk is level 1 of a chain of
        calls of one rule (a string's characters as an item rule repeated up to its
        maxLength: each return from the rule calls it again one position further). Where it
        reaches the boundary ``recall_from`` (the rule's end, which reads no byte) at a level
        below ``max_level``, it goes on below that node from ``recall_to`` (the rule's start)
        at the next level instead of reporting the pair.
        ``side`` (with ``recall``): the start state of each level's side walk (level 0's
        below ``roots``, level k's below the nodes where level k went on). Returns
        ``(nodes, states, levels, the highest level reached, (side nodes, their levels))``:
        the roots and nodes whose side walk reads a child's byte (the others' find nothing)."""
        if recall is None and starts is None and side is None and (roots is None or len(roots) <= 1):
            # a plain walk of the whole trie or below one node (most walks): its binding and
            # buffers taken in one lookup (:meth:`_plain_walk`)
            hit = memo.bound.get((self, inner, threading.get_ident()))
            if hit is None:
                hit = self._plain_walk(memo, inner)
            walk, bnd_nodes, bnd_states, lev, count = hit
            lev[-1] = 1
            count[0] = 0
            nb = walk(start, _NO_ROOTS if roots is None else np.asarray(roots, dtype=np.int32), out)
            return bnd_nodes[:nb].copy(), bnd_states[:nb].copy()
        roots, bnd_nodes, bnd_states, bnd_levels, states, lev = self._walk_buffers(roots)
        recall_from, recall_to, max_level = recall if recall is not None else (-1, -1, 0)
        side_args = self._side(side)
        items = -1 if recall is None else chain_set(memo.table, memo.cls, memo.boundary[inner], recall, side)
        plain = recall is None and starts is None and side is None
        walk = self._fast_walk(memo, inner, plain)
        if bnd_nodes is not walk.args[10]:  # (nested roots: larger boundary buffers, this once)
            args = list(walk.args[:_FIXED])
            args[10], args[11], args[14] = bnd_nodes, bnd_states, bnd_levels
            walk, plain = bind(_walk_fast, *args), False
        if plain:
            nb = walk(start, np.asarray(roots, dtype=np.int32), out)
        else:
            nb = walk(
                _NO_ROOTS if starts is None else starts.astype(np.int32),
                int(recall_from),
                int(recall_to),
                int(max_level),
                items,
                side_args[0],
                side_args[4],
                start,
                np.asarray(roots, dtype=np.int32),
                out,
            )
        return _walk_result(nb, bnd_nodes, bnd_states, bnd_levels, lev, side_args, recall)

    def greedy_tokenize(self, data: bytes, vocab) -> list[int]:
        """Longest-match tokenization of ``data`` (every token's bytes concatenate to it)."""
        lookup = getattr(self, "_lookup", None)
        if lookup is None:
            lookup = {}
            for i, b in enumerate(vocab.token_bytes):
                if b and b not in lookup:
                    lookup[b] = i
            self._lookup = lookup
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for end in range(min(len(data), pos + self.max_depth), pos, -1):
                tid = lookup.get(data[pos:end])
                if tid is not None:
                    out.append(tid)
                    pos = end
                    break
            else:
                return out  # a byte with no token: stop before it
        return out
