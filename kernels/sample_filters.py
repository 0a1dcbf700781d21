"""Triton helpers of top-k / top-p / min-p: which of a row's draws the filters keep.

The kept set of top-k / top-p / min-p is ``{i : s_i >= tau}`` for an unknown threshold tau; it is
never searched for. Each of the four draws x_0..x_3 gets a verdict from pass 1's chunk maxima
and quanta sums alone (``verdict``: kept or cut for sure, or left to the test pass); the test
pass (top-k / top-p only) counts and sums the mass above s_x0..s_x3 at once, over the chunks
whose max is above a draw left to it (none when the verdicts settle the row, as on most rows of
a real model's peaked logits); the token is the first kept x_j (rejection sampling: exact for
the kept distribution). All four cut (probability ~ (1 - kept mass)**4): rounds r = 1, 2, ... of
four draws x_4r..x_4r+3 from {s > low} (low = the highest cut score so far: every token at or
below it is cut), tested in one pass; the token is the first kept one (``decide``).
"""

from __future__ import annotations

import triton.language as tl

from .triton_common import NDRAW, chunk_mass, fast_exp, helper, load_scores, row_chunks, row_draws


@helper
def tile_sums(s, m, q0, q1, q2, q3, k_on):
    # one tile of scores -> the mass sum exp(s - m) (and count, if top-k is on) above q0..q3
    e = fast_exp(s - m)
    mass0 = tl.sum(tl.where(s > q0, e, 0.0))
    mass1 = tl.sum(tl.where(s > q1, e, 0.0))
    mass2 = tl.sum(tl.where(s > q2, e, 0.0))
    mass3 = tl.sum(tl.where(s > q3, e, 0.0))
    cnt0 = 0
    cnt1 = 0
    cnt2 = 0
    cnt3 = 0
    if k_on:
        cnt0 = tl.sum((s > q0).to(tl.int32))
        cnt1 = tl.sum((s > q1).to(tl.int32))
        cnt2 = tl.sum((s > q2).to(tl.int32))
        cnt3 = tl.sum((s > q3).to(tl.int32))
    return mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3


@helper
def _test_loop(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, m, q0, q1, q2, q3, k_on, ms, cs, low,
               HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # the test pass over the row: tile_sums added block by block, over the blocks holding a
    # chunk whose max (ms) is above low (the others add nothing to the masses and counts above
    # q0..q3 >= low)
    arange = tl.arange(0, BLOCK)
    mass0 = 0.0
    mass1 = 0.0
    mass2 = 0.0
    mass3 = 0.0
    cnt0 = 0
    cnt1 = 0
    cnt2 = 0
    cnt3 = 0
    for start in range(0, V, BLOCK):
        held = (cs >= start // CHUNK) & (cs <= (start + BLOCK - 1) // CHUNK)  # the chunks the block meets
        if tl.max(tl.where(held, ms, float("-inf")), 0) > low:
            s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            b0, b1, b2, b3, n0, n1, n2, n3 = tile_sums(s, m, q0, q1, q2, q3, k_on)
            mass0 += b0
            mass1 += b1
            mass2 += b2
            mass3 += b3
            cnt0 += n0
            cnt1 += n1
            cnt2 += n2
            cnt3 += n3
    return mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3


@helper
def filter_on(top_k, top_p, min_p, V):
    # -> (top-k on, top-p on, any filter on)
    k_on = (top_k > 0) & (top_k < V)
    cut_p = top_p < 1.0
    return k_on, cut_p, k_on | cut_p | (min_p > 0.0)


@helper
def filters_keep(q, m, pz, mass, cnt, kmax, cut_p, min_p):
    # whether every filter keeps a draw of score q (scalars or tensors alike), from the count
    # and mass strictly above it (ties at a threshold are kept); pz = top_p * Z
    return (cnt < kmax) & ((cut_p == 0) | (mass < pz)) & (tl.exp(q - m) >= min_p)


@helper
def first_kept(x0, x1, x2, x3, q0, q1, q2, q3, m, zz, mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3,
                kmax, cut_p, top_p, min_p, v0, v1, v2, v3):  # fmt: skip
    # the first of the draws x0..x3 (scores q0..q3) that every filter keeps (filters_keep), or
    # from its verdict v (verdict: 1 kept, -1 cut, 0 measured) -> (token, none kept)
    pz = top_p * zz
    keep0 = (v0 == 1) | ((v0 == 0) & filters_keep(q0, m, pz, mass0, cnt0, kmax, cut_p, min_p))
    keep1 = (v1 == 1) | ((v1 == 0) & filters_keep(q1, m, pz, mass1, cnt1, kmax, cut_p, min_p))
    keep2 = (v2 == 1) | ((v2 == 0) & filters_keep(q2, m, pz, mass2, cnt2, kmax, cut_p, min_p))
    keep3 = (v3 == 1) | ((v3 == 0) & filters_keep(q3, m, pz, mass3, cnt3, kmax, cut_p, min_p))
    tok = tl.where(keep2, x2, x3)
    tok = tl.where(keep1, x1, tok)
    tok = tl.where(keep0, x0, tok)
    return tok, (keep0 | keep1 | keep2 | keep3) == 0


VERDICT_SLACK = tl.constexpr(1.0 / 1024)  # of Z: how far a bound must clear a threshold (rounding: ~1e-6)


@helper
def verdict(q, ct, m, ms, w, z, cs, kmax, k_on, cut_p, top_p, min_p):
    # a draw of score q in chunk ct against pass 1's chunk results alone (m = max(ms); w, z: the
    # chunks' masses and their total, chunk_mass) -> 1:
    # every filter keeps it, -1: one cuts it, 0: only the test pass can tell. In quanta
    # (2**32 = exp(0)): only the chunks whose max is above q hold tokens above it. The mass
    # above q is at most theirs (less the draw's own weight, in its chunk) and at least their
    # maxima's; the count above q is at least the number of those chunks, and at most that plus
    # their mass besides the maxima (and the draw) over exp(q - m), which every token above q
    # outweighs. Bounds clear a threshold by VERDICT_SLACK * Z (over the rounding of the sums
    # and the quanta's floor, at most V quanta), so the test pass would agree.
    slack = VERDICT_SLACK * z
    e = tl.exp(q - m)
    eq = e * 4294967296.0
    above = ms > q
    own = tl.sum(tl.where(above & (cs == ct), eq, 0.0), 0)  # the draw's weight, if its chunk is above q
    mass = tl.sum(tl.where(above, w, 0.0), 0) - own
    tops = tl.sum(tl.where(above, tl.exp(ms - m), 0.0), 0) * 4294967296.0
    n_lo = tl.sum(above.to(tl.int32), 0)
    n_up = n_lo.to(tl.float32) + (mass - tops + slack) / eq
    keep_min = e >= min_p  # (as filters_keep)
    keep = (
        keep_min & ((k_on == 0) | (n_up < kmax.to(tl.float32))) & ((cut_p == 0) | (mass + slack < top_p * z))
    )
    cut = (keep_min == 0) | (k_on & (n_lo >= kmax)) | (cut_p & (tops - slack >= top_p * z))
    return tl.where(cut, -1, tl.where(keep, 1, 0))


@helper
def test_low(q0, q1, q2, q3, v0, v1, v2, v3):
    # the lowest score among the draws the test pass must settle: those with verdict 0 before the
    # first one kept for sure (+inf: none, the verdicts decide). A chunk whose max is at or
    # below it has nothing above any of them: its tile is not read
    inf = float("inf")
    open1 = v0 != 1
    open2 = open1 & (v1 != 1)
    open3 = open2 & (v2 != 1)
    low = tl.where(v0 == 0, q0, inf)
    low = tl.minimum(low, tl.where(open1 & (v1 == 0), q1, inf))
    low = tl.minimum(low, tl.where(open2 & (v2 == 0), q2, inf))
    return tl.minimum(low, tl.where(open3 & (v3 == 0), q3, inf))


@helper
def _tested_sum(p, rd):
    # one of the test pass's per-chunk sums p [SP] (loaded whether tested or not: no load waits
    # on rd), added in chunk order over the chunks it tested (rd)
    return tl.sum(tl.where(rd, p, 0.0), 0)


@helper
def decide(
    x0,
    x1,
    x2,
    x3,
    q0,
    q1,
    q2,
    q3,
    v0,
    v1,
    v2,
    v3,
    m,
    top_k,
    top_p,
    min_p,
    lrow,
    stride_lv,
    mrow_ptr,
    has_row_mask,
    V,
    inv_t,
    k0,
    k1,
    sums_ptr,
    S,
    ms,
    zs,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    DRAWN: tl.constexpr,
    SPLIT2: tl.constexpr,
    SP: tl.constexpr,
):
    # The first of the draws x0..x3 (samples of softmax(s); scores q0..q3) that the filters keep;
    # a draw is kept iff count / mass strictly above its score pass top-k / top-p and
    # e >= min_p (m = max(s); -inf: an empty row, token x0). Each draw's verdict (verdict, from
    # pass 1's chunk maxima ms and quanta sums zs, which also give Z) settles it or leaves it to
    # the test pass, which measures the four at once on the chunks whose max is above test_low
    # of the verdicts; min-p alone needs none. DRAWN: the verdicts are v0..v3 (the draw
    # kernel's), else they are found here. SPLIT2: _split_pass2_kernel did the test pass per
    # chunk (its sums at sums_ptr), added here in chunk order; else _test_loop does it here. All
    # four cut: rounds of four draws from {s > low} and one test pass each, both over the chunks
    # that still hold a token above it (see the module docstring).
    kmax = tl.where(top_k > 0, top_k, 2147483647)
    k_on, cut_p, active = filter_on(top_k, top_p, min_p, V)
    c = tl.arange(0, SP)
    cm = c < S
    if SPLIT2:  # the test pass's sums, loaded before anything decides whether they are used
        p0 = tl.load(sums_ptr + c, mask=cm, other=0.0)
        p1 = tl.load(sums_ptr + S + c, mask=cm, other=0.0)
        p2 = tl.load(sums_ptr + 2 * S + c, mask=cm, other=0.0)
        p3 = tl.load(sums_ptr + 3 * S + c, mask=cm, other=0.0)
        p4 = tl.load(sums_ptr + 4 * S + c, mask=cm, other=0.0)  # (the counts: unwritten without top-k)
        p5 = tl.load(sums_ptr + 5 * S + c, mask=cm, other=0.0)
        p6 = tl.load(sums_ptr + 6 * S + c, mask=cm, other=0.0)
        p7 = tl.load(sums_ptr + 7 * S + c, mask=cm, other=0.0)
    tok = x0
    if active & (m > float("-inf")):
        # Z = sum exp(s - m) from the chunks' quanta sums (the test pass may read only some)
        w = chunk_mass(ms, zs, m)
        zq = tl.sum(w, 0)
        zz = zq * (1.0 / 4294967296.0)
        mass0 = 0.0
        mass1 = 0.0
        mass2 = 0.0
        mass3 = 0.0
        cnt0 = 0
        cnt1 = 0
        cnt2 = 0
        cnt3 = 0
        u0 = 0
        u1 = 0
        u2 = 0
        u3 = 0
        if k_on | cut_p:
            if DRAWN:
                u0 = v0
                u1 = v1
                u2 = v2
                u3 = v3
            else:
                u0 = verdict(q0, x0 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u1 = verdict(q1, x1 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u2 = verdict(q2, x2 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u3 = verdict(q3, x3 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
            tlow = test_low(q0, q1, q2, q3, u0, u1, u2, u3)
            if SPLIT2:
                rd = cm & (ms > tlow)  # the chunks tested (the others: 0)
                mass0 = _tested_sum(p0, rd)
                mass1 = _tested_sum(p1, rd)
                mass2 = _tested_sum(p2, rd)
                mass3 = _tested_sum(p3, rd)
                if k_on:
                    cnt0 = _tested_sum(p4, rd).to(tl.int32)
                    cnt1 = _tested_sum(p5, rd).to(tl.int32)
                    cnt2 = _tested_sum(p6, rd).to(tl.int32)
                    cnt3 = _tested_sum(p7, rd).to(tl.int32)
            else:
                mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3 = _test_loop(
                    lrow,
                    stride_lv,
                    mrow_ptr,
                    has_row_mask,
                    V,
                    inv_t,
                    m,
                    q0,
                    q1,
                    q2,
                    q3,
                    k_on,
                    ms,
                    c,
                    tlow,
                    HAS_MASK,
                    BLOCK,
                    CHUNK,
                )
        tok, searching = first_kept(
            x0,
            x1,
            x2,
            x3,
            q0,
            q1,
            q2,
            q3,
            m,
            zz,
            mass0,
            mass1,
            mass2,
            mass3,
            cnt0,
            cnt1,
            cnt2,
            cnt3,
            kmax,
            cut_p,
            top_p,
            min_p,
            u0,
            u1,
            u2,
            u3,
        )
        if searching:
            # every token scoring at or below a cut draw is cut: draw four again above the
            # highest, and test them in one pass
            low = tl.maximum(tl.maximum(q0, q1), tl.maximum(q2, q3))
            j = tl.full((), NDRAW, tl.uint32)
            rms = ms
            while searching:
                # (a chunk whose max is at or below low is read by neither pass)
                rms, rzs, cs = row_chunks(
                    lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, low, rms, HAS_MASK, CHUNK, SP
                )
                x0, x1, x2, x3, q0, q1, q2, q3 = row_draws(
                    lrow,
                    stride_lv,
                    mrow_ptr,
                    has_row_mask,
                    V,
                    inv_t,
                    rms,
                    rzs,
                    cs,
                    low,
                    j,
                    k0,
                    k1,
                    HAS_MASK,
                    CHUNK,
                )
                qmin = tl.minimum(tl.minimum(q0, q1), tl.minimum(q2, q3))
                mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3 = _test_loop(
                    lrow,
                    stride_lv,
                    mrow_ptr,
                    has_row_mask,
                    V,
                    inv_t,
                    m,
                    q0,
                    q1,
                    q2,
                    q3,
                    k_on,
                    rms,
                    cs,
                    qmin,
                    HAS_MASK,
                    BLOCK,
                    CHUNK,
                )
                tok, searching = first_kept(
                    x0,
                    x1,
                    x2,
                    x3,
                    q0,
                    q1,
                    q2,
                    q3,
                    m,
                    zz,
                    mass0,
                    mass1,
                    mass2,
                    mass3,
                    cnt0,
                    cnt1,
                    cnt2,
                    cnt3,
                    kmax,
                    cut_p,
                    top_p,
                    min_p,
                    0,
                    0,
                    0,
                    0,
                )
                low = tl.maximum(tl.maximum(q0, q1), tl.maximum(q2, q3))
                j += NDRAW
    return tok
