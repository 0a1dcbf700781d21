"""Triton helpers of top-k: the k-th largest score, found exactly, and draws only above it.

Top-k keeps ``{i : s_i >= v_k}``, v_k the k-th largest score of the row (with multiplicity), so
its draws start from ``{s > low}``, ``low = nextafter(v_k, -inf)`` (``sample_reference.topk_low``):
the top-k test then never cuts a draw. v_k is found by a search over the scores' order keys
(``order_key``: the float bits as an integer in the order of the floats), bit by bit from the
top, each step a count of the keys at or above a candidate (``kth_key``).

With the split, pass 1 (``chunk_candidates``) searches each chunk only far enough to keep
between k and ``KC`` (``SampleTuning.topk_max``) of its largest scores, and stores those
candidates in token order. Every token at or above v_k is among them, so the per-row kernel
(``topk_row``) finds v_k, the chunks' quanta sums above low, the draws, their count and mass
above them for top-p, and any rounds, all from the [S, KC] candidates, without reading the row
again. A row with k > KC, or whose ties at a chunk's threshold overflow KC, takes the per-row
way instead (``row_topk_low``: the same search over the row itself, then the row's draws).
"""

from __future__ import annotations

import triton.language as tl

from .sample_filters import first_kept
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
def chunk_candidates(s, local, c, k, cv_ptr, ci_ptr, cn_ptr, CHUNK: tl.constexpr, KC: tl.constexpr):
    # pass 1 of a top-k row (k <= KC) on its chunk c, tile s [CHUNK / G, G] (token local[i, j]
    # of the chunk; a tile row is a group of G tokens): the chunk's largest scores, at least k
    # of them and at most KC unless ties at the threshold forbid it, stored in token order at
    # cv_ptr / ci_ptr; their count at cn_ptr (over KC: overflow, the row takes the per-row way).
    # Every token at or above the row's k-th largest score is among them: that score is at or
    # above the chunk's k-th largest, which is at or above the threshold t taken here.
    # t: the k-th largest of the groups' maxima (``group_kth``: k tokens, the k maxima, are at
    # or above it), found at once by ranking the groups; only when more than KC tokens reach it
    # (ties, a dense top) does kth_key search on, from t up to the chunk's max
    u = tl.where(s > float("-inf"), order_key(s), NO_KEY)
    gm = tl.max(u, 1)  # [CHUNK / G] each group's largest key
    t = group_kth(gm, k)
    n = tl.sum((u >= t).to(tl.int32))
    if n > KC:
        t, n = kth_key(u, k, KC, t, tl.max(gm, 0))
    sel = u >= t
    # position of each selected token among them in token order ([CHUNK / G, G] row-major)
    per_row = tl.sum(sel.to(tl.int32), 1)
    pos = (tl.cumsum(per_row, 0) - per_row)[:, None] + tl.cumsum(sel.to(tl.int32), 1) - 1
    ok = sel & (pos < KC)
    tl.store(cv_ptr + pos, s, mask=ok)
    tl.store(ci_ptr + pos, c * CHUNK + local, mask=ok)
    tl.store(cn_ptr, n)


@helper
def group_kth(gm, k):
    # gm [R]: the groups' largest order keys (NO_KEY: a group with no entry) -> the k-th largest
    # of them (with multiplicity), min{g : fewer than k groups strictly above g}, by ranking
    # every group against every other (R * R compares, no search); NO_KEY + 1 (every entry)
    # where fewer than k groups have an entry
    above = tl.sum((gm[None, :] > gm[:, None]).to(tl.int32), 1)
    has = gm > NO_KEY
    gk = tl.min(tl.where(has & (above < k), gm, 2147483647), 0)
    return tl.where(tl.sum(has.to(tl.int32), 0) >= k, gk, NO_KEY + 1)


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
def _cand_draw(cand_ptr, cidx_ptr, cq, zl, cum, cs, j, k0, k1, KC: tl.constexpr):
    # inverse-CDF draw j over {s > low} from the candidates at cand_ptr / cidx_ptr [SP, KC]
    # (token order in each chunk; every token above low is one), given their quanta's running
    # sums cq [SP, KC] in each chunk, the chunks' quanta sums zl and the running sum cum of the
    # chunks' weights: the chunk (as pick_chunk), then the candidate whose running sum passes
    # the draw -> (token, its score); the token row_draw would give
    c = tl.sum((cum <= scale(tl.max(cum, 0), draw_t(2 * j, k0, k1))).to(tl.int32), 0)
    h = scale(tl.sum(tl.where(cs == c, zl, 0), 0), draw_t(2 * j + 1, k0, k1))
    at = c * KC + tl.sum(((cs[:, None] == c) & (cq <= h)).to(tl.int32))
    return tl.load(cidx_ptr + at), tl.load(cand_ptr + at)


@helper
def _cand_above(cv, e, q):
    # mass sum exp(s - m) (e) and count of the candidates above q (all the row's tokens above
    # q >= v_k)
    above = cv > q
    return tl.sum(tl.where(above, e, 0.0)), tl.sum(above.to(tl.int32))


@helper
def topk_row(cand_ptr, cidx_ptr, cn_ptr, S, ms, zs, cs, m, top_k, top_p, min_p, k0, k1,
             KC: tl.constexpr, SP: tl.constexpr):  # fmt: skip
    # a top-k row after the split pass 1 stored its candidates (chunk_candidates; none
    # overflowed): v_k and low from them, then the draws over {s > low} and the first kept
    # (first_kept: top-k keeps every draw; top-p's mass and min-p as decide), rounds of four
    # above the highest cut score when all four are cut. zs: pass 1's quanta sums (Z). The
    # draws of a round share one pass over the candidates (their quanta, running sums in each
    # chunk, and the chunks' weights); each then reads its token and score back
    kk = tl.arange(0, KC)
    n = tl.load(cn_ptr + cs, mask=cs < S, other=0)
    ok = (cs[:, None] < S) & (kk[None, :] < n[:, None])
    off = cs[:, None] * KC + kk[None, :]
    cv = tl.load(cand_ptr + off, mask=ok, other=float("-inf"))
    u = tl.where(ok, order_key(cv), NO_KEY)
    low = float("-inf")
    if tl.sum(ok.to(tl.int32)) >= top_k:
        # the k-th largest is at least each chunk's least candidate where it has k of them, at
        # most the max
        least = tl.min(tl.where(ok, u, 2147483647), 1)
        lo = tl.max(tl.where(n >= top_k, least, NO_KEY + 1), 0)
        t, _n = kth_key(u, top_k, top_k, lo, order_key(m))
        low = float_below(tl.min(tl.where(u >= t, cv, float("inf"))))
    kmax = top_k
    cut_p = top_p < 1.0
    zz = tl.sum(chunk_mass(ms, zs, m), 0) * (1.0 / 4294967296.0)
    e = fast_exp(cv - m)  # (top-p's mass above a draw)
    j = tl.full((), 0, tl.uint32)
    tok = 0
    searching = m > float("-inf")
    while searching:
        q = quanta(cv, ms[:, None], low)
        zl = tl.sum(q, 1)  # the chunks' quanta sums over {s > low}
        cq = tl.cumsum(q, 1)
        cum = tl.cumsum(chunk_mass(ms, zl, m).to(tl.int64), 0)
        x0, q0 = _cand_draw(cand_ptr, cidx_ptr, cq, zl, cum, cs, j, k0, k1, KC)
        if cut_p | (min_p > 0.0):
            x1, q1 = _cand_draw(cand_ptr, cidx_ptr, cq, zl, cum, cs, j + 1, k0, k1, KC)
            x2, q2 = _cand_draw(cand_ptr, cidx_ptr, cq, zl, cum, cs, j + 2, k0, k1, KC)
            x3, q3 = _cand_draw(cand_ptr, cidx_ptr, cq, zl, cum, cs, j + 3, k0, k1, KC)
            mass0, cnt0 = _cand_above(cv, e, q0)
            mass1, cnt1 = _cand_above(cv, e, q1)
            mass2, cnt2 = _cand_above(cv, e, q2)
            mass3, cnt3 = _cand_above(cv, e, q3)
            tok, searching = first_kept(x0, x1, x2, x3, q0, q1, q2, q3, m, zz, mass0, mass1, mass2,
                                        mass3, cnt0, cnt1, cnt2, cnt3, kmax, cut_p, top_p, min_p,
                                        0, 0, 0, 0)  # fmt: skip
            low = tl.maximum(tl.maximum(q0, q1), tl.maximum(q2, q3))
            j += NDRAW
        else:  # top-k alone keeps every draw: the token is x0
            tok = x0
            searching = False
    return tok
