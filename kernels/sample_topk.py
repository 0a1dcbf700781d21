"""Triton helpers of top-k: the k-th largest score, found exactly, and draws only above it.

Top-k keeps ``{i : s_i >= v_k}``, v_k the k-th largest score of the row (with multiplicity), so
its draws start from ``{s > low}``, ``low = nextafter(v_k, -inf)`` (``sample_reference.topk_low``):
the top-k test then never cuts a draw. v_k is found on the scores' order keys (``order_key``:
the float bits as an integer in the order of the floats), by ranking a few keys against each
other (``group_kth``: the k-th largest of up to NG keys at once) or by a search bit by bit from
the top, each step a count of the keys at or above a candidate (``kth_key``).

With the split, pass 1 stores each chunk's group maxima (``group_maxima``: the max of each group
of G = 32 tokens, a tile row; no search) beside its max and quanta sum. The per-row kernel
(``topk_row``) then finds a threshold T that k to ``NG`` (``SampleTuning.topk_max``) groups
reach: the k-th largest of the maxima of NG sets of groups (group_kth), and kth_key from there
only when more than NG groups reach that. T is at most the k-th largest group max, which is at
most v_k (k tokens, the k largest maxima, are at or above it), and a token at or above v_k has
its group's max at or above it. So those groups' [NG, G] tokens, gathered in token order, hold
every token the draws can reach. Their candidates, the tokens at or above T (at or above v_k,
by kth_key from T, when more than NG are), go through the scratch into [NG] vectors in token
order: v_k (group_kth of the candidates), the chunks' quanta sums above low (a segmented scan),
the draws, their count and mass above them for top-p, and any rounds all come from those. A
row with k > NG, or whose ties at T pass NG groups or at v_k NG tokens, takes the per-row way
instead (``row_topk_low``: kth_key over the row itself, then the row's draws).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .sample_filters import VERDICT_SLACK, filters_keep
from .triton_common import NDRAW, chunk_mass, draw_t, fast_exp, helper, load_scores, quanta, scale


@helper
def order_key(s):
    # float32 -> int32 in the order of the floats (+0 and -0 equal; -inf above INT32_MIN, which
    # marks "no entry" for kth_key)
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return tl.where(s == 0.0, 0, key)


@helper
def float_below(v):
    # nextafter(v, -inf) of a float32 scalar (-inf stays -inf), as torch.nextafter
    bits = v.to(tl.int32, bitcast=True)
    b = tl.where(v > 0.0, bits - 1, tl.where(v == 0.0, -2147483647, bits + 1))
    return tl.where(v == float("-inf"), v, b.to(tl.float32, bitcast=True))


NO_KEY = tl.constexpr(-2147483648)  # an order key no score has: not an entry


@helper
def kth_key(key, k, cap, lo, hi):
    # key: int32 order keys (NO_KEY: no entry), at least k entries, the k-th largest in
    # [lo, hi]. The k-th largest key found bit by bit from the top, from the bits lo and hi
    # share; stops at the first t whose count(key >= t) is in [k, cap] (cap = k: the k-th
    # largest is then min(key >= t)) -> (t, count(key >= t)). Offset binary (key + 2**31) in
    # the scalars, int32 in the tensors
    lo_u = lo.to(tl.int64) + 2147483648
    hi_u = hi.to(tl.int64) + 2147483648
    diff = lo_u ^ hi_u
    b = tl.full((), 31, tl.int64)
    while (b >= 0) & (((diff >> b) & 1) == 0):
        b -= 1
    t = (hi_u >> (b + 1)) << (b + 1)  # the shared bits
    n = tl.sum((key >= (t - 2147483648).to(tl.int32)).to(tl.int32))
    while (b >= 0) & (n > cap):
        cand = t | (tl.full((), 1, tl.int64) << b)
        c = tl.sum((key >= (cand - 2147483648).to(tl.int32)).to(tl.int32))
        take = c >= k
        t = tl.where(take, cand, t)
        n = tl.where(take, c, n)
        b -= 1
    return (t - 2147483648).to(tl.int32), n


@helper
def row_topk_low(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k, HAS_MASK: tl.constexpr,
                 BLOCK: tl.constexpr):  # fmt: skip
    # sample_reference.topk_low of one row, by kth_key's search over the row itself (a pass
    # over the row a step): the per-row way, for rows of one chunk and for k over the split's KC
    arange = tl.arange(0, BLOCK)
    low = float("-inf")
    if V <= BLOCK:  # one block: the row stays in registers, kth_key searches it there
        s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, arange, V, inv_t, HAS_MASK)
        u = tl.where(s > float("-inf"), order_key(s), NO_KEY)
        if tl.sum((u > NO_KEY).to(tl.int32)) >= k:
            lo = tl.full((), NO_KEY + 1, tl.int32)
            t, _n = kth_key(u, k, k, lo, order_key(tl.max(s)))
            low = float_below(tl.min(tl.where(u >= t, s, float("inf"))))
    else:
        n = 0
        for start in range(0, V, BLOCK):
            s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            n += tl.sum((s > float("-inf")).to(tl.int32))
        if n >= k:
            t = tl.full((), 0, tl.int64)  # (offset binary, as kth_key)
            b = tl.full((), 31, tl.int64)
            while (b >= 0) & (n > k):
                cand = t | (tl.full((), 1, tl.int64) << b)
                ck = (cand - 2147483648).to(tl.int32)
                c = 0
                for start in range(0, V, BLOCK):
                    s = load_scores(
                        lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK
                    )
                    c += tl.sum(((s > float("-inf")) & (order_key(s) >= ck)).to(tl.int32))
                take = c >= k
                t = tl.where(take, cand, t)
                n = tl.where(take, c, n)
                b -= 1
            tk = (t - 2147483648).to(tl.int32)
            vk = float("inf")
            for start in range(0, V, BLOCK):
                s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
                above = (s > float("-inf")) & (order_key(s) >= tk)
                vk = tl.minimum(vk, tl.min(tl.where(above, s, float("inf"))))
            low = float_below(vk)
    return low


@helper
def group_maxima(s, gm_ptr):
    # pass 1 of a top-k row on one chunk, tile s [CHUNK / G, G]: each group's (tile row's) max,
    # stored at gm_ptr [CHUNK / G]
    tl.store(gm_ptr + tl.arange(0, s.shape[0]), tl.max(s, 1))


@helper
def group_kth(gm, k):
    # gm [BC]: order keys (NO_KEY: no entry) -> the k-th largest of them (with multiplicity),
    # min{g : fewer than k entries strictly above g}, by ranking every entry against every other
    # (BC * BC compares, no search); NO_KEY + 1 (every entry) where fewer than k have one
    above = tl.sum((gm[None, :] > gm[:, None]).to(tl.int32), 1)
    has = gm > NO_KEY
    gk = tl.min(tl.where(has & (above < k), gm, 2147483647), 0)
    return tl.where(tl.sum(has.to(tl.int32), 0) >= k, gk, NO_KEY + 1)


@triton.jit  # (a combine function: jitted under the interpreter too)
def _seg_add(f1, v1, f2, v2):
    # a running sum that restarts where the flag f (int32, 1: first of its segment) is set
    return f1 | f2, tl.where(f2 != 0, v2, v1 + v2)


@helper
def _cand_draws(tc, cc, sc, run, cum, V, jv, k0, k1, SP: tl.constexpr):
    # the inverse-CDF draws jv [D] (uint32 ids) over {s > low} from the candidates (tc [NG]
    # their tokens in token order, V where none; cc their chunk, SP where none; sc their scores;
    # run: the running quanta sum in the chunk; cum: the running chunk weights, each chunk's
    # added at its last candidate), all D at once as [D, NG] tiles: each draw's chunk, the first
    # whose running weight passes the draw (pick_chunk), then its first token whose running sum
    # passes the draw -> (tokens [D], their scores [D]); the tokens row_draw would give (a token
    # not among the candidates weighs 0)
    total = tl.max(cum, 0)
    c = tl.min(tl.where(cum[None, :] > scale(total, draw_t(2 * jv, k0, k1))[:, None], cc[None, :], SP), 1)
    inc = cc[None, :] == c[:, None]
    h = scale(tl.max(tl.where(inc, run[None, :], 0), 1), draw_t(2 * jv + 1, k0, k1))
    x = tl.min(tl.where(inc & (run[None, :] > h[:, None]), tc[None, :], V), 1)
    return x, tl.max(tl.where(tc[None, :] == x[:, None], sc[None, :], float("-inf")), 1)


@helper
def topk_row(gm_ptr, row, gid_ptr, lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, pm_ptr, S, ms, zs, m,
             top_k, top_p, min_p, k0, k1, HAS_MASK: tl.constexpr, CHUNK: tl.constexpr, NG: tl.constexpr,
             SP: tl.constexpr):  # fmt: skip
    # a top-k row (top_k <= NG) after the split pass 1 stored its groups' maxima (group_maxima,
    # gm_ptr [B, S * R], row) -> (token, done). The groups at or above T, at most the k-th
    # largest group max and reached by k to NG groups, hold every token at or above v_k (a
    # token's group max is at least the token), and at least k tokens; their indices go through
    # gid_ptr [2 * NG] (scratch) to gather their tokens, in token order. The candidates, those
    # of them at or above T (or at or above v_k, found by kth_key, when more than NG are), go
    # through the scratch too, as [NG] vectors in token order: v_k, the chunks' quanta sums
    # above low, the draws, their count and mass above them for top-p, and any rounds all come
    # from those. done is False where more than NG groups tie at T, or more than NG tokens at
    # v_k (the caller takes the per-row way). pm_ptr: the row's chunk maxima
    G: tl.constexpr = 32 if CHUNK >= 32 else CHUNK  # (tile2d's groups)
    R: tl.constexpr = CHUNK // G
    # the row's group maxima as [A, BC], group a * BC + b at [a, b]: BC sets (the columns) of A
    # groups each
    BC: tl.constexpr = NG if SP * R > NG else SP * R
    A: tl.constexpr = SP * R // BC
    ga = tl.arange(0, A)[:, None] * BC + tl.arange(0, BC)[None, :]
    g = tl.load(gm_ptr + row * S * R + ga, mask=ga < S * R, other=float("-inf"))
    gk = tl.where(g > float("-inf"), order_key(g), NO_KEY)
    # t: the k-th largest of the sets' maxima, at most the k-th largest group max (they are k
    # groups' maxima), found at once (group_kth); kth_key searches on only when more than NG
    # groups reach it
    t = group_kth(tl.max(gk, 0), top_k)
    n = tl.sum((gk >= t).to(tl.int32))
    if n > NG:
        t, n = kth_key(gk, top_k, NG, t, tl.max(gk))
    done = n <= NG
    tok = 0
    if done:
        # the groups at or above t, gathered in token order
        sel = gk >= t
        per = tl.sum(sel.to(tl.int32), 1)
        pos = (tl.cumsum(per, 0) - per)[:, None] + tl.cumsum(sel.to(tl.int32), 1) - 1
        tl.store(gid_ptr + pos, ga, mask=sel)
        tl.debug_barrier()
        slot = tl.arange(0, NG)
        gid = tl.load(gid_ptr + slot, mask=slot < n, other=-1, cache_modifier=".cg")
        tokens = tl.where(gid[:, None] >= 0, gid[:, None] * G + tl.arange(0, G)[None, :], V)
        s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, tokens, V, inv_t, HAS_MASK)
        u = tl.where(s > float("-inf"), order_key(s), NO_KEY)
        # the candidates: the gathered tokens at or above t (every token at or above v_k, at
        # least k of them; every allowed token of the row when it has fewer than k). Past NG of
        # them, v_k by kth_key's search over the gathered tokens, and the candidates are the
        # tokens at or above it; still past NG (ties at v_k) the caller takes the per-row way
        nf = tl.sum((u > NO_KEY).to(tl.int32))
        cand = u >= t
        nc = tl.sum(cand.to(tl.int32))
        if (nc > NG) & (nf >= top_k):
            tk, _n = kth_key(u, top_k, top_k, t, order_key(m))
            cand = u >= tk
            nc = tl.sum(cand.to(tl.int32))
        done = nc <= NG
        if done:
            # the candidates' tokens and scores (bits) through the scratch, in token order, as
            # [NG] vectors: v_k, the draws, their count and mass above them, and any rounds
            # are all computed on those
            tl.debug_barrier()  # (every thread has read the groups' indices)
            pg = tl.sum(cand.to(tl.int32), 1)
            at = (tl.cumsum(pg, 0) - pg)[:, None] + tl.cumsum(cand.to(tl.int32), 1) - 1
            tl.store(gid_ptr + at, tokens, mask=cand)
            tl.store(gid_ptr + NG + at, s.to(tl.int32, bitcast=True), mask=cand)
            tl.debug_barrier()
            ok = slot < nc
            tc = tl.load(gid_ptr + slot, mask=ok, other=V, cache_modifier=".cg")
            # (the candidates before and after: where each chunk's run starts and ends)
            tp = tl.load(gid_ptr + slot - 1, mask=ok & (slot > 0), other=0, cache_modifier=".cg")
            tn = tl.load(gid_ptr + slot + 1, mask=slot + 1 < nc, other=0, cache_modifier=".cg")
            bits = tl.load(gid_ptr + NG + slot, mask=ok, other=0, cache_modifier=".cg")
            sc = tl.where(ok, bits.to(tl.float32, bitcast=True), float("-inf"))
            cc = tl.where(ok, tc // CHUNK, SP)  # each candidate's chunk
            first = ((slot == 0) | (tp // CHUNK != cc) | (ok == 0)).to(tl.int32)
            last = tl.where(slot + 1 < nc, tn // CHUNK != cc, ok)
            mg = tl.load(pm_ptr + cc, mask=ok, other=0.0)  # its max
            uc = tl.where(ok, order_key(sc), NO_KEY)
            low = float("-inf")
            if nf >= top_k:  # (else top-k keeps every token)
                low = float_below(tl.min(tl.where(uc >= group_kth(uc, top_k), sc, float("inf")), 0))
            kmax = top_k
            cut_p = top_p < 1.0
            zz = tl.sum(chunk_mass(ms, zs, m), 0) * (1.0 / 4294967296.0)
            # top-p keeps every draw when the whole top-k set's mass (the most any draw has
            # above it) clears top_p * Z by the verdicts' slack (over the sums' rounding): then
            # draw 0 is the token, as the rounds below would find, and they are skipped
            kept_all = top_p < 0.0  # (False)
            if cut_p & (min_p == 0.0):
                mass_k = tl.sum(tl.where(ok & (sc > low), fast_exp(sc - m), 0.0), 0)
                kept_all = mass_k + VERDICT_SLACK * zz < top_p * zz
            j = tl.full((), 0, tl.uint32)
            dj = tl.arange(0, NDRAW).to(tl.uint32)
            searching = m > float("-inf")
            while searching:
                # the quanta over {s > low}, their running sum in each chunk, and the running
                # chunk weights (each chunk's quanta sum at its last candidate, as chunk_mass)
                q = quanta(sc, mg, low)
                _f, run = tl.associative_scan((first, q), 0, _seg_add)
                cum = tl.cumsum(tl.where(last, chunk_mass(mg, run, m), 0.0).to(tl.int64), 0)
                if (cut_p | (min_p > 0.0)) & (kept_all == 0):
                    # NDRAW draws at once, and the count and mass of the candidates above each
                    # (all the row's tokens above it: it is above low >= v_k); the first kept
                    # is the token, as first_kept, else the next round draws below the lowest
                    x, qd = _cand_draws(tc, cc, sc, run, cum, V, j + dj, k0, k1, SP)
                    above = sc[None, :] > qd[:, None]
                    mass = tl.sum(tl.where(above, fast_exp(sc - m)[None, :], 0.0), 1)
                    cnt = tl.sum(above.to(tl.int32), 1)
                    keep = filters_keep(qd, m, top_p * zz, mass, cnt, kmax, cut_p, min_p)
                    kept = tl.min(tl.where(keep, dj, NDRAW), 0)  # the first draw kept (NDRAW: none)
                    tok = tl.sum(tl.where(dj == kept, x, 0), 0)
                    searching = kept == NDRAW
                    low = tl.max(qd, 0)
                    j += NDRAW
                else:  # top-k alone (or with a top-p that keeps the whole set): the token is draw 0
                    x0, _q0 = _cand_draws(tc, cc, sc, run, cum, V, j + tl.arange(0, 1).to(tl.uint32), k0, k1,
                                          SP)  # fmt: skip
                    tok = tl.sum(x0, 0)
                    searching = False
    return tok, done
