"""Triton kernels: bitmask apply, and the fused mask + temperature + top-k/top-p/min-p + sampling.

Sampling is by inverse CDF with counter-based uniforms (``reference.draw_bits``, the same 32-bit
integer hash in both backends) over integer weights (``reference.chunk_weights`` /
``inverse_cdf``): draw j walks the running sums to a chunk (hash id 2j), then to a token in it
(id 2j + 1); the sums are exact, so every path picks the same token. The kept set of top-k / top-p /
min-p is ``{i : s_i >= tau}`` for an unknown threshold tau; it is never searched for:

    pass 1: m = max(s), Z = sum exp(s - m)            (greedy: m and the lowest argmax only)
    draws:  x_0..x_3 = 4 inverse-CDF draws from softmax(s) (u_0..u_3), one tile each, and
            each one's verdict from pass 1's chunk maxima and sums (_verdict): kept or cut for
            sure, or left to the test pass
    test pass (top-k / top-p only): count and mass above s_x0..s_x3 at once, over the chunks
            whose max is above a draw left to it (none when the verdicts settle the row)
    token = the first kept x_j (rejection sampling: exact for the kept distribution)
    all four cut (probability ~ (1 - kept mass)**4): rounds r = 1, 2, ... of four draws
      x_4r..x_4r+3 from {s > low} (low = the highest cut score so far: every token at or below
      it is cut), tested in one pass; the token is the first kept one

Passes over V: greedy 1; sampling 1 plus 4 tiles; top-k / top-p 2 plus 4 tiles (1 plus 4 when the
verdicts settle the row, as on most rows of a real model's peaked logits); no host
synchronisation, no sort, no per-token random numbers (no hashing of the vocabulary).

When V is over one chunk (``SPLIT``) each pass runs over (row, chunk) programs, ``CHUNK`` from
V only, so a row's token depends on that row alone: ``_split_pass1_kernel`` (per chunk: max,
sum of exp, greedy argmax), ``_split_draw_kernel`` ((row, draw) programs: the chunk that holds
the draw from the chunks' masses, then one tile's cumulative sum), ``_split_pass2_kernel``
(the test pass per chunk), and the per-row ``_sample_kernel`` adds the chunks' results in chunk
order and decides. An all-greedy batch without logprobs is one launch, ``_split_greedy_kernel``
(its row's last chunk program decides); a batch whose sampling rows have no filter is two, pass
1 and ``_split_plain_kernel`` (one program a row: draw 0, or a greedy row's argmax). Without the
split, ``_sample_kernel`` runs every pass itself, looping over the row.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from . import reference

try:  # grid dependency control (Hopper and later): a dependent launch starts while the previous ends
    from triton.backends.nvidia.compiler import CUDAOptions as _CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAS_PDL = "launch_pdl" in _CUDAOptions.__dataclass_fields__
except Exception:  # noqa: BLE001 - an older Triton: every launch waits for the one before
    _HAS_PDL = False

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Device helpers are inlined by the compiler; under the interpreter each @triton.jit call
# re-patches triton.language (~0.4 ms), so there they are plain functions (same code).
_helper = (lambda fn: fn) if _INTERPRET else triton.jit
N_DRAWS = 4  # inverse-CDF draws per row before the rounds
NDRAW = tl.constexpr(N_DRAWS)


if _INTERPRET:

    def _exp(x):
        return tl.exp(x)

else:

    @triton.jit
    def _exp(x):
        # exp(x) per token as 2 ** (x * log2 e) by libdevice's exp2, which Triton builds flushing
        # denormals: one ex2.approx.ftz (tl.exp adds a rescale around results below 2**-126,
        # four instructions a token; those flush to 0 here: weights under 2**-126 of the max)
        return libdevice.exp2(x * 1.4426950408889634)


@_helper
def _mix32(x):
    # lowbias32 on uint32 (same bits as reference.mix32)
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    x = x ^ (x >> 15)
    return x


@_helper
def _row_keys(seed, step):
    # seed, step: int64 scalars -> two uint32 keys (reference.row_keys)
    k = _mix32((step >> 32).to(tl.uint32) ^ 0x9E3779B9)
    k = _mix32(step.to(tl.uint32) ^ k)
    k = _mix32((seed >> 32).to(tl.uint32) ^ k)
    k0 = _mix32(seed.to(tl.uint32) ^ k)
    k1 = _mix32(k0 ^ 0x85EBCA6B)
    return k0, k1


@_helper
def _draw_t(j, k0, k1):
    # hash id j (uint32) -> t = 2 * (r >> 9) + 1 (int64, odd, < 2**24): the uniform t / 2**24
    # (reference.draw_bits)
    r = _mix32(_mix32(j + k0) ^ k1)
    return (r >> 9).to(tl.int64) * 2 + 1


@_helper
def _scale(total, t):
    # floor(total * t / 2**24), exactly, for int64 total < 2**50 and t < 2**24
    return (total >> 24) * t + (((total & 0xFFFFFF) * t) >> 24)


@_helper
def _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK: tl.constexpr):
    # s [BLOCK] float32 = logits * inv_t, -inf outside the vocabulary or where the bitmask forbids
    inb = offs < V
    x = tl.load(lrow + offs.to(tl.int64) * stride_lv, mask=inb, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        words = tl.load(mrow_ptr + offs // 32, mask=inb, other=-1)
        words = tl.where(has_row_mask, words, -1)
        x = tl.where(((words >> (offs % 32)) & 1) != 0, x, float("-inf"))
    return x * inv_t


@_helper
def _quanta(s, mc, low):
    # q = floor(exp(s - mc) * 2**32) (int64) on {s > low}, 0 elsewhere; mc = the chunk's max
    e = _exp(s - tl.where(mc == float("-inf"), 0.0, mc)) * 4294967296.0
    return tl.where(s > low, e.to(tl.int64), 0)


@_helper
def _pick_chunk(ms, zs, cs, t):
    # the chunks' max and quanta sums -> the chunk c with cum_{c-1} <= g < cum_c over the chunk
    # weights W_c = int64(float(Z_c) * exp(m_c - m)), g = floor(sum(W) * t / 2**24)
    m = tl.max(ms, 0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    w = _chunk_mass(ms, zs, safe_m).to(tl.int64)
    cum = tl.cumsum(w, 0)
    g = _scale(tl.max(cum, 0), t)
    return tl.sum((cum <= g).to(tl.int32), 0)


@_helper
def _pick_in_tile(s, mc, low, zc, offs, t):
    # the token i of the chunk tile with cum_{i-1} <= h < cum_i over its quanta, h = floor(zc * t / 2**24)
    cum = tl.cumsum(_quanta(s, mc, low), 0)
    return tl.min(offs, 0) + tl.sum((cum <= _scale(zc, t)).to(tl.int32), 0)


@_helper
def _row_chunks(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, low, prev,
                HAS_MASK: tl.constexpr, CHUNK: tl.constexpr, SP: tl.constexpr):  # fmt: skip
    # one pass over the row by chunks -> each chunk's max and quanta sum over {s > low}, as
    # [SP] vectors (what _split_pass1_kernel stores per chunk). prev: the chunks' maxima from
    # an earlier pass (+inf: none); a chunk whose max is at or below low is not read (its
    # weight is 0 either way; its max is left at -inf)
    cs = tl.arange(0, SP)
    ms = tl.full([SP], float("-inf"), tl.float32)
    zs = tl.zeros([SP], tl.int64)
    for start in range(0, V, CHUNK):
        c = start // CHUNK
        if tl.max(tl.where(cs == c, prev, float("-inf")), 0) > low:
            s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + tl.arange(0, CHUNK), V, inv_t,
                             HAS_MASK)
            mc = tl.max(s, 0)
            zc = tl.sum(_quanta(s, mc, low), 0)
            ms = tl.where(cs == c, mc, ms)
            zs = tl.where(cs == c, zc, zs)
    return ms, zs, cs


@_helper
def _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1,
              HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # inverse-CDF draw j over {s > low}: the chunk (hash id 2j), then the token in it (id 2j + 1)
    # -> (token, its score). The score is loaded again: taken from the tile, it would keep the
    # tile alive through the running sum (the draw kernel: 96 -> 168 registers)
    c = _pick_chunk(ms, zs, cs, _draw_t(2 * j, k0, k1))
    offs = c * CHUNK + tl.arange(0, CHUNK)
    s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
    mc = tl.sum(tl.where(cs == c, ms, 0.0), 0)
    zc = tl.sum(tl.where(cs == c, zs, 0), 0)
    x = _pick_in_tile(s, mc, low, zc, offs, _draw_t(2 * j + 1, k0, k1))
    return x, tl.load(lrow + x.to(tl.int64) * stride_lv).to(tl.float32) * inv_t


@_helper
def _row_draws(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1,
               HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # draws j .. j + 3 over {s > low} (_row_draw) -> their tokens, then their scores
    x0, q0 = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1, HAS_MASK, CHUNK)
    x1, q1 = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 1, k0, k1, HAS_MASK,
                       CHUNK)
    x2, q2 = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 2, k0, k1, HAS_MASK,
                       CHUNK)
    x3, q3 = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 3, k0, k1, HAS_MASK,
                       CHUNK)
    return x0, x1, x2, x3, q0, q1, q2, q3


@_helper
def _chunk_mass(ms, zs, m):
    # the chunks' masses sum exp(s - m) over each chunk, in quanta (2**32 = exp(0)), from their
    # maxima ms and quanta sums zs; m > -inf
    return tl.where(ms == float("-inf"), 0.0, zs.to(tl.float32) * tl.exp(ms - m))


@_helper
def _log_z(ms, zs):
    # log sum exp(s - m) from the chunks' quanta sums (the logprob's normaliser), m = max(ms)
    m = tl.max(ms, 0)
    z = tl.sum(_chunk_mass(ms, zs, tl.where(m == float("-inf"), 0.0, m)), 0) * (1.0 / 4294967296.0)
    return tl.log(tl.where(z > 0.0, z, 1.0))  # 0 only on an empty row (logprob -inf anyway)


@_helper
def _tile_sums(s, m, q0, q1, q2, q3, k_on):
    # one tile of scores -> the mass sum exp(s - m) (and count, if top-k is on) above q0..q3
    e = _exp(s - m)
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


@_helper
def _test_loop(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, m, q0, q1, q2, q3, k_on, ms, cs, low,
               HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # the test pass over the row: _tile_sums added block by block, over the blocks holding a
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
            s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            b0, b1, b2, b3, n0, n1, n2, n3 = _tile_sums(s, m, q0, q1, q2, q3, k_on)
            mass0 += b0
            mass1 += b1
            mass2 += b2
            mass3 += b3
            cnt0 += n0
            cnt1 += n1
            cnt2 += n2
            cnt3 += n3
    return mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3


@_helper
def _filter_on(top_k, top_p, min_p, V):
    # -> (top-k on, top-p on, any filter on)
    k_on = (top_k > 0) & (top_k < V)
    cut_p = top_p < 1.0
    return k_on, cut_p, k_on | cut_p | (min_p > 0.0)


@_helper
def _first_kept(x0, x1, x2, x3, q0, q1, q2, q3, m, zz, mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3,
                kmax, cut_p, top_p, min_p, v0, v1, v2, v3):  # fmt: skip
    # the first of the draws x0..x3 (scores q0..q3) that every filter keeps (ties at a threshold
    # are kept), from the count and mass strictly above each score, or from its verdict v
    # (_verdict: 1 kept, -1 cut, 0 measured) -> (token, none kept)
    pz = top_p * zz
    keep0 = (v0 == 1) | ((v0 == 0) & (cnt0 < kmax) & ((cut_p == 0) | (mass0 < pz)) & (tl.exp(q0 - m) >= min_p))
    keep1 = (v1 == 1) | ((v1 == 0) & (cnt1 < kmax) & ((cut_p == 0) | (mass1 < pz)) & (tl.exp(q1 - m) >= min_p))
    keep2 = (v2 == 1) | ((v2 == 0) & (cnt2 < kmax) & ((cut_p == 0) | (mass2 < pz)) & (tl.exp(q2 - m) >= min_p))
    keep3 = (v3 == 1) | ((v3 == 0) & (cnt3 < kmax) & ((cut_p == 0) | (mass3 < pz)) & (tl.exp(q3 - m) >= min_p))
    tok = tl.where(keep2, x2, x3)
    tok = tl.where(keep1, x1, tok)
    tok = tl.where(keep0, x0, tok)
    return tok, (keep0 | keep1 | keep2 | keep3) == 0


VERDICT_SLACK = tl.constexpr(1.0 / 1024)  # of Z: how far a bound must clear a threshold (rounding: ~1e-6)


@_helper
def _verdict(q, ct, m, ms, w, z, cs, kmax, k_on, cut_p, top_p, min_p):
    # a draw of score q in chunk ct against pass 1's chunk results alone (m = max(ms); w, z: the
    # chunks' masses and their total, _chunk_mass) -> 1:
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
    keep_min = e >= min_p  # (as _first_kept)
    keep = keep_min & ((k_on == 0) | (n_up < kmax.to(tl.float32))) & ((cut_p == 0) | (mass + slack < top_p * z))
    cut = (keep_min == 0) | (k_on & (n_lo >= kmax)) | (cut_p & (tops - slack >= top_p * z))
    return tl.where(cut, -1, tl.where(keep, 1, 0))


@_helper
def _test_low(q0, q1, q2, q3, v0, v1, v2, v3):
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


@_helper
def _tested_sum(p, rd):
    # one of the test pass's per-chunk sums p [SP] (loaded whether tested or not: no load waits
    # on rd), added in chunk order over the chunks it tested (rd)
    return tl.sum(tl.where(rd, p, 0.0), 0)


# fmt: off
@_helper
def _decide(x0, x1, x2, x3, q0, q1, q2, q3, v0, v1, v2, v3, m, top_k, top_p, min_p, lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, sums_ptr, S, ms, zs, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, DRAWN: tl.constexpr, SPLIT2: tl.constexpr, SP: tl.constexpr):
    # fmt: on
    # The first of the draws x0..x3 (samples of softmax(s); scores q0..q3) that the filters keep;
    # a draw is kept iff count / mass strictly above its score pass top-k / top-p and
    # e >= min_p (m = max(s); -inf: an empty row, token x0). Each draw's verdict (_verdict, from
    # pass 1's chunk maxima ms and quanta sums zs, which also give Z) settles it or leaves it to
    # the test pass, which measures the four at once on the chunks whose max is above _test_low
    # of the verdicts; min-p alone needs none. DRAWN: the verdicts are v0..v3 (the draw
    # kernel's), else they are found here. SPLIT2: _split_pass2_kernel did the test pass per
    # chunk (its sums at sums_ptr), added here in chunk order; else _test_loop does it here. All
    # four cut: rounds of four draws from {s > low} and one test pass each, both over the chunks
    # that still hold a token above it (see the module docstring).
    kmax = tl.where(top_k > 0, top_k, 2147483647)
    k_on, cut_p, active = _filter_on(top_k, top_p, min_p, V)
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
        w = _chunk_mass(ms, zs, m)
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
                u0 = _verdict(q0, x0 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u1 = _verdict(q1, x1 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u2 = _verdict(q2, x2 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
                u3 = _verdict(q3, x3 // CHUNK, m, ms, w, zq, c, kmax, k_on, cut_p, top_p, min_p)
            tlow = _test_low(q0, q1, q2, q3, u0, u1, u2, u3)
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
                    lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, m, q0, q1, q2, q3, k_on, ms, c, tlow, HAS_MASK,
                    BLOCK, CHUNK)
        tok, searching = _first_kept(x0, x1, x2, x3, q0, q1, q2, q3, m, zz, mass0, mass1, mass2, mass3,
                                     cnt0, cnt1, cnt2, cnt3, kmax, cut_p, top_p, min_p, u0, u1, u2, u3)
        if searching:
            # every token scoring at or below a cut draw is cut: draw four again above the
            # highest, and test them in one pass
            low = tl.maximum(tl.maximum(q0, q1), tl.maximum(q2, q3))
            j = tl.full((), NDRAW, tl.uint32)
            rms = ms
            while searching:
                # (a chunk whose max is at or below low is read by neither pass)
                rms, rzs, cs = _row_chunks(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, low, rms, HAS_MASK,
                                           CHUNK, SP)
                x0, x1, x2, x3, q0, q1, q2, q3 = _row_draws(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, rms,
                                                            rzs, cs, low, j, k0, k1, HAS_MASK, CHUNK)
                qmin = tl.minimum(tl.minimum(q0, q1), tl.minimum(q2, q3))
                mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3 = _test_loop(
                    lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, m, q0, q1, q2, q3, k_on, rms, cs, qmin,
                    HAS_MASK, BLOCK, CHUNK)
                tok, searching = _first_kept(x0, x1, x2, x3, q0, q1, q2, q3, m, zz, mass0, mass1, mass2, mass3,
                                             cnt0, cnt1, cnt2, cnt3, kmax, cut_p, top_p, min_p, 0, 0, 0, 0)
                low = tl.maximum(tl.maximum(q0, q1), tl.maximum(q2, q3))
                j += NDRAW
    return tok


@_helper
def _sample_row(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, m, top_k, top_p, min_p, k0, k1,
                HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, SP: tl.constexpr):  # fmt: skip
    # a sampling row in one program, after its pass 1 by chunks (_row_chunks): the four draws
    # (a tile each), then the first kept one (_decide, test pass in the loop)
    ninf = float("-inf")
    j0 = tl.full((), 0, tl.uint32)
    k_on, cut_p, active = _filter_on(top_k, top_p, min_p, V)
    if active:
        x0, x1, x2, x3, q0, q1, q2, q3 = _row_draws(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, ninf,
                                                    j0, k0, k1, HAS_MASK, CHUNK)
    else:  # the token is x0 (_decide)
        x0, q0 = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, ninf, j0, k0, k1, HAS_MASK,
                           CHUNK)
        x1 = x0
        x2 = x0
        x3 = x0
        q1 = q0
        q2 = q0
        q3 = q0
    return _decide(x0, x1, x2, x3, q0, q1, q2, q3, 0, 0, 0, 0, m, top_k, top_p, min_p, lrow, stride_lv, mrow_ptr,
                   has_row_mask, V, inv_t, k0, k1, lrow, 1, ms, zs, HAS_MASK, BLOCK, CHUNK, False, False, SP)


@_helper
def _chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP: tl.constexpr,
               LAST_FIRST: tl.constexpr = False):  # fmt: skip
    # program (row, c) of a split pass -> (row index, c, row as int64, the row's logits and
    # bitmask pointers, whether the row is masked). LAST_FIRST: the programs take the (row, c)
    # in reverse order, so a pass after pass 1 starts on the tiles pass 1 read last (still in L2)
    pid = tl.program_id(0)
    if LAST_FIRST:
        pid = tl.num_programs(0) - 1 - pid
    r = pid // S
    c = pid - r * S
    row, lrow, mrow_ptr, has_row_mask = _row_ptrs(r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                  HAS_ROW_MAP)
    return r, c, row, lrow, mrow_ptr, has_row_mask


@_helper
def _row_ptrs(r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP: tl.constexpr):
    # row r -> (row as int64, its logits and bitmask pointers, whether the row is masked)
    row = r.to(tl.int64)
    has_row_mask = True
    if HAS_ROW_MAP:
        has_row_mask = tl.load(mask_row_ptr + r) != 0
    return row, logits_ptr + row * stride_lb, mask_ptr + row * stride_mb, has_row_mask


@_helper
def _tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):
    # tile c of a row's masked logits as [CHUNK / G, G], G = min(32, CHUNK): token
    # c * CHUNK + G * i + j at [i, j] (-inf outside V or where the bitmask forbids), and the
    # tokens' indices in the tile. A row of the tile lies in one bitmask word, so each word is
    # loaded once and tested against the column's bit (no per-token gather of its word)
    G: tl.constexpr = 32 if CHUNK >= 32 else CHUNK
    start = c * CHUNK + G * tl.arange(0, CHUNK // G)  # each row's first token
    col = tl.arange(0, G)
    offs = start[:, None] + col[None, :]
    x = tl.load(lrow + offs.to(tl.int64) * stride_lv, mask=offs < V, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        words = tl.load(mrow_ptr + start // 32, mask=start < V, other=-1)
        words = tl.where(has_row_mask, words, -1)
        if G == 32:  # one AND a token against the column's bit
            ok = (words[:, None] & (1 << col)[None, :]) != 0
        else:
            ok = ((words[:, None] >> ((start % 32)[:, None] + col[None, :])) & 1) != 0
        x = tl.where(ok, x, float("-inf"))
    return x, offs - c * CHUNK


@_helper
def _argmax2d(x, local, CHUNK: tl.constexpr):
    # the max of a 2-D tile and its lowest index (NaN max: index 0)
    m = tl.max(x)
    bi = tl.min(tl.where(x == m, local, CHUNK))
    return m, tl.where(bi == CHUNK, 0, bi)


@_helper
def _chunk_program(logits_ptr, stride_lb, stride_lv, mask_ptr, stride_mb, mask_row_ptr, V, S,
                   HAS_MASK: tl.constexpr, HAS_ROW_MAP: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # program (row, c) of a split pass -> (row index, c, row as int64, the row's logits pointer,
    # x = tile c of its masked logits); the tile is loaded first, before anything about the row
    # is known (no load waits on another)
    r, c, row, lrow, mrow_ptr, has_row_mask = _chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                         S, HAS_ROW_MAP)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, 1.0, HAS_MASK)
    return r, c, row, lrow, x


# fmt: off
@triton.jit
def _split_pass1_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    temp_ptr,  # [B] float32
    pm_ptr, pz_ptr, pi_ptr,  # out: [B, S] float32 max s, int64 quanta sum, int32 greedy argmax
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,  # the launches after this one start early and wait for it (gdc_wait)
):
    # fmt: on
    if PDL:
        gdc_launch_dependents()
    # program (row, c) runs pass 1 on tokens [c * CHUNK, (c + 1) * CHUNK) of the row, one tile:
    # the max of s, its lowest index (greedy rows) and the quanta sum (sampling rows, or for the
    # logprob). CHUNK depends on V only, so a row's result depends on that row.
    r, c, row, lrow, mrow_ptr, has_row_mask = _chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                         S, HAS_ROW_MAP)
    x, local = _tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
    temp = tl.load(temp_ptr + r)
    greedy = temp == 0
    if greedy:
        s = x
        m, bi = _argmax2d(x, local, CHUNK)
        tl.store(pi_ptr + row * S + c, c * CHUNK + bi)
    else:
        s = x * tl.math.div_rn(1.0, temp)  # IEEE, as torch
        m = tl.max(s)
    tl.store(pm_ptr + row * S + c, m)
    if RETURN_LOGPROBS | (greedy == 0):
        tl.store(pz_ptr + row * S + c, tl.sum(_quanta(s, m, float("-inf"))))


# fmt: off
@triton.jit
def _split_greedy_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    pm_ptr, pi_ptr,  # scratch [B, S]: each chunk's max and its lowest argmax
    count_ptr,  # [>= B] int32: chunks of the row finished; zero on entry, reset to zero on exit
    tokens_ptr, empty_ptr,  # out: [B] int64 (-1: nothing allowed), bool
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PACKED: tl.constexpr,  # bfloat16 logits: value and index in one int32 key (CHUNK <= 65536)
    MASK2D: tl.constexpr,  # the tile as [CHUNK / 32, 32]: one bitmask word per 32 tokens
    TILES: tl.constexpr,  # (PACKED) program c takes tiles c * TILES .. (c + 1) * TILES - 1 in turn
):
    # fmt: on
    # program (row, c) of an all-greedy batch: the max of tile c and its lowest index; the row's
    # last program to finish (an atomic count) takes the S chunks' results in chunk order and
    # writes the token -- one launch, where the other kinds end in _sample_kernel. The argmax
    # is exact, whichever program finishes last.
    if PACKED or MASK2D:
        # [CHUNK / 32, 32] (_tile2d): each word of the bitmask is loaded once and tested against
        # the column's bit (no per-token gather of its word)
        r, c, row, lrow, mrow_ptr, has_row_mask = _chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb,
                                                             mask_row_ptr, S, HAS_ROW_MAP)
        if not PACKED:  # (the packed keys read their TILES tiles below)
            x, local = _tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
    else:
        r, c, row, lrow, x = _chunk_program(logits_ptr, stride_lb, stride_lv, mask_ptr, stride_mb, mask_row_ptr,
                                            V, S, HAS_MASK, HAS_ROW_MAP, CHUNK)
        local = tl.arange(0, CHUNK)
    if PACKED:
        # x holds bfloat16 values (low 16 bits zero): the float's bits made monotone as an int32
        # in the high half (b >= 0: b; a negative float of magnitude bits M: -M, so -0.0 and +0.0
        # are both 0; (b ^ (sg & 0x7FFFFFFF)) - sg with sg = b >> 31, three integer operations),
        # 65535 - index in the low half, so one integer max gives the max and, among equal
        # values, the lowest index (a plain max instead of a max carrying an index)
        # TILES tiles in turn (_tile2d): a later one wins only with a larger value
        best = tl.full((), -2147483648, tl.int32)
        bt = 0
        for t in tl.static_range(TILES):
            x, local = _tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c * TILES + t, V, HAS_MASK, CHUNK)
            b = x.to(tl.int32, bitcast=True)
            sg = b >> 31
            tb = tl.max((b ^ (sg & 0x7FFFFFFF)) - sg + (65535 - local))
            win = (tb & -65536) > (best & -65536)
            best = tl.where(win, tb, best)
            bt = tl.where(win, t, bt)
        bi = bt * CHUNK + 65535 - (best & 65535)
        kh = best & -65536
        m = tl.where(kh < 0, (-kh) | -2147483648, kh).to(tl.float32, bitcast=True)
    elif MASK2D:
        m, bi = _argmax2d(x, local, CHUNK)
    else:
        m, bi = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(pm_ptr + row * S + c, m)
    tl.store(pi_ptr + row * S + c, c * (CHUNK * TILES) + bi)
    tl.debug_barrier()  # this program's stores before its count (released by the atomic)
    done = tl.atomic_add(count_ptr + r, 1, sem="acq_rel")
    if done == S - 1:
        cs = tl.arange(0, SP)
        ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(pi_ptr + row * S + cs, mask=cs < S, other=0, cache_modifier=".cg")
        mx, bc = tl.max(ms, 0, return_indices=True, return_indices_tie_break_left=True)
        empty = mx == float("-inf")
        tok = tl.where(empty, -1, tl.sum(tl.where(cs == bc, idxs, 0), 0))
        tl.store(tokens_ptr + r, tok.to(tl.int64))
        tl.store(empty_ptr + r, empty)
        tl.store(count_ptr + r, 0)


# fmt: off
@triton.jit
def _split_draw_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B] float32, int64, float32, float32
    seed_ptr, step_ptr,  # [B] int64
    pm_ptr, pz_ptr,  # [B, S] float32, int64 written by _split_pass1_kernel
    dx_ptr, dq_ptr, dv_ptr,  # out: [B, NDRAW] int32 drawn tokens, float32 their scores, int32 verdicts
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PDL: tl.constexpr,  # launched early, as a dependent of pass 1
):
    # fmt: on
    if PDL:  # every program waits, so this launch ends after pass 1 (the later ones rely on it)
        gdc_launch_dependents()
        gdc_wait()
    # program (row, j): inverse-CDF draw j of a sampling row (only j = 0 without a filter): the
    # chunk from the chunks' weights, then the token from that one tile's running quanta sum;
    # and the draw's verdict from the chunks' results (_verdict: kept or cut for sure, or test)
    pid = tl.program_id(0)
    r = pid // NDRAW
    j = pid - r * NDRAW
    row, lrow, mrow_ptr, has_row_mask = _row_ptrs(r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                  HAS_ROW_MAP)
    temp = tl.load(temp_ptr + r)
    top_k = tl.load(top_k_ptr + r)
    top_p = tl.load(top_p_ptr + r)
    min_p = tl.load(min_p_ptr + r)
    k_on, cut_p, active = _filter_on(top_k, top_p, min_p, V)
    if (temp != 0) & ((j == 0) | active):
        cs = tl.arange(0, SP)
        ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"))
        m = tl.max(ms, 0)
        if m > float("-inf"):
            zs = tl.load(pz_ptr + row * S + cs, mask=cs < S, other=0)
            inv_t = tl.math.div_rn(1.0, temp)
            k0, k1 = _row_keys(tl.load(seed_ptr + r), tl.load(step_ptr + r))
            x, q = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, float("-inf"),
                             j.to(tl.uint32), k0, k1, HAS_MASK, CHUNK)
            tl.store(dx_ptr + row * NDRAW + j, x)
            tl.store(dq_ptr + row * NDRAW + j, q)
            if active:
                kmax = tl.where(top_k > 0, top_k, 2147483647)
                w = _chunk_mass(ms, zs, m)
                v = _verdict(q, x // CHUNK, m, ms, w, tl.sum(w, 0), cs, kmax, k_on, cut_p, top_p, min_p)
                tl.store(dv_ptr + row * NDRAW + j, v)


# fmt: off
@triton.jit
def _split_plain_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    temp_ptr,  # [B] float32
    seed_ptr, step_ptr,  # [B] int64
    pm_ptr, pz_ptr, pi_ptr,  # [B, S] written by _split_pass1_kernel
    tokens_ptr, empty_ptr, logprobs_ptr,  # out: [B] int64, bool, float32
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PDL: tl.constexpr,  # launched early, as a dependent of pass 1
):
    # fmt: on
    # program r ends row r of a call where no row has a filter (kinds "plain"), in place of the
    # draw kernel and the per-row kernel: a greedy row's token from the chunks' maxima and
    # argmaxes, a sampling row's from its draw 0 (which _decide would return: the token is x0
    # without a filter), and the logprob
    r = tl.program_id(0)
    row, lrow, mrow_ptr, has_row_mask = _row_ptrs(r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                  HAS_ROW_MAP)
    temp = tl.load(temp_ptr + r)
    k0, k1 = _row_keys(tl.load(seed_ptr + r), tl.load(step_ptr + r))
    if PDL:
        gdc_wait()
    cs = tl.arange(0, SP)
    ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"))
    idxs = tl.load(pi_ptr + row * S + cs, mask=cs < S, other=0)  # (greedy rows')
    zs = tl.load(pz_ptr + row * S + cs, mask=cs < S, other=0)  # (sampling rows', or for the logprob)
    m, bc = tl.max(ms, 0, return_indices=True, return_indices_tie_break_left=True)
    tok = tl.sum(tl.where(cs == bc, idxs, 0), 0)  # greedy: the first chunk's lowest argmax
    q = m  # (its score)
    empty = m == float("-inf")
    if (temp != 0) & (empty == 0):
        inv_t = tl.math.div_rn(1.0, temp)  # IEEE, as torch
        tok, q = _row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, float("-inf"),
                           tl.full((), 0, tl.uint32), k0, k1, HAS_MASK, CHUNK)
    tl.store(tokens_ptr + r, tl.where(empty, -1, tok).to(tl.int64))
    tl.store(empty_ptr + r, empty)
    if RETURN_LOGPROBS:
        tl.store(logprobs_ptr + r, tl.where(empty, float("-inf"), q - m - _log_z(ms, zs)))


# fmt: off
@triton.jit
def _split_pass2_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [B] float32, int64, float32, float32
    pm_ptr,  # [B, S] float32 written by _split_pass1_kernel
    dq_ptr, dv_ptr,  # [B, NDRAW] float32, int32 written by _split_draw_kernel
    ps_ptr,  # out: [B, 8, S] float32: mass above q0..q3, count above q0..q3
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    K_ON: tl.constexpr,  # some row has top-k on (else the counts are left out)
    TILE2D: tl.constexpr,  # the tile as [CHUNK / 32, 32] (_tile2d), else flat
    PDL: tl.constexpr,  # launched early: waits for the draws, then reads what it needs
):
    # fmt: on
    # program (row, c): the test pass of _decide on tokens [c * CHUNK, (c + 1) * CHUNK) of a
    # sampling row with top-k or top-p on (other rows: nothing), only where the chunk's max is
    # above _test_low of the draws' verdicts: a chunk at or below it adds nothing to any mass or
    # count the decision needs, and a row the verdicts decide reads nothing (on a real model's
    # peaked logits, most rows). The tile is read after the draws, so a pass that reads every
    # tile loses the overlap of its first wave with the draws.
    # The tiles are taken last first: top-p 57.7 -> 54.1 us (H200, fp32, B = 128, V = 128,256;
    # no change at B = 512, whose 256 MB of logits leave nothing in L2). TILE2D (2-byte logits)
    # reads the tile as [CHUNK / 32, 32] as pass 1 does: 60.1 -> 57.3 us for bf16 there, but
    # 54.0 -> 61.7 for fp32 (96 against 125 registers, and more instructions a token)
    r, c, row, lrow, mrow_ptr, has_row_mask = _chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                         S, HAS_ROW_MAP, True)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    # every load that decides whether to read the tile at once (one round trip; for rows
    # without a test they read what the draws left, unused)
    temp = tl.load(temp_ptr + r)
    top_k = tl.load(top_k_ptr + r)
    top_p = tl.load(top_p_ptr + r)
    min_p = tl.load(min_p_ptr + r)
    dq = dq_ptr + row * NDRAW
    dv = dv_ptr + row * NDRAW
    q0 = tl.load(dq)
    q1 = tl.load(dq + 1)
    q2 = tl.load(dq + 2)
    q3 = tl.load(dq + 3)
    v0 = tl.load(dv)
    v1 = tl.load(dv + 1)
    v2 = tl.load(dv + 2)
    v3 = tl.load(dv + 3)
    mc = tl.load(pm_ptr + row * S + c)
    k_on, cut_p, active = _filter_on(top_k, top_p, min_p, V)
    # (one condition: the compiler would wait for the first loads before issuing the others.
    # An empty row has no draws: its max is -inf)
    if (temp != 0) & (k_on | cut_p) & (mc > _test_low(q0, q1, q2, q3, v0, v1, v2, v3)):
        if TILE2D:
            x, _local = _tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
        else:
            x = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, c * CHUNK + tl.arange(0, CHUNK), V, 1.0,
                             HAS_MASK)
        cs = tl.arange(0, SP)
        m = tl.max(tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf")), 0)
        s = x * tl.math.div_rn(1.0, temp)  # as _load_scores with inv_t (x * 1.0 is exact)
        sums = _tile_sums(s, m, q0, q1, q2, q3, k_on if K_ON else False)
        mass0, mass1, mass2, mass3, cnt0, cnt1, cnt2, cnt3 = sums
        out = ps_ptr + row * 8 * S + c
        tl.store(out, mass0)
        tl.store(out + S, mass1)
        tl.store(out + 2 * S, mass2)
        tl.store(out + 3 * S, mass3)
        if K_ON:  # (a constant: the counts' code is left out)
            if k_on:
                tl.store(out + 4 * S, cnt0.to(tl.float32))
                tl.store(out + 5 * S, cnt1.to(tl.float32))
                tl.store(out + 6 * S, cnt2.to(tl.float32))
                tl.store(out + 7 * S, cnt3.to(tl.float32))


# fmt: off
@triton.jit
def _sample_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V] fp32 | bf16 | fp16
    mask_ptr, stride_mb, mask_row_ptr,  # [B, W] int32; [B] int32 (HAS_ROW_MAP): 1 = row is masked
    temp_ptr,  # [B] float32
    top_k_ptr, top_p_ptr, min_p_ptr,  # [B] int64, float32, float32
    seed_ptr, step_ptr,  # [B] int64
    tokens_ptr, empty_ptr, logprobs_ptr,  # [B] int64, bool, float32
    pm_ptr, pz_ptr, pi_ptr,  # SPLIT: [B, S] float32, int64, int32 written by _split_pass1_kernel
    dx_ptr, dq_ptr, dv_ptr,  # SPLIT: [B, NDRAW] drawn tokens, scores, verdicts (_split_draw_kernel)
    ps_ptr,  # SPLIT2: [B, 8, S] float32 written by _split_pass2_kernel
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,  # pass 1 and the draws ran over (row, chunk) programs: combine them
    SPLIT2: tl.constexpr,  # (with SPLIT) the test pass too
    SP: tl.constexpr,  # next power of 2 >= S
    PDL: tl.constexpr,  # (SPLIT) launched early: wait for the split passes before their results
):
    # fmt: on
    pid = tl.program_id(0)
    row, lrow, mrow_ptr, has_row_mask = _row_ptrs(pid, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr,
                                                  HAS_ROW_MAP)
    temp = tl.load(temp_ptr + pid)
    greedy = temp == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp)))  # IEEE, as torch
    k0, k1 = _row_keys(tl.load(seed_ptr + pid), tl.load(step_ptr + pid))
    top_k = tl.load(top_k_ptr + pid)
    top_p = tl.load(top_p_ptr + pid)
    min_p = tl.load(min_p_ptr + pid)
    cs = tl.arange(0, SP)
    log_z = 0.0
    if SPLIT:
        if PDL:
            gdc_wait()
        # the chunks' results, in chunk order: max, argmax (lowest id), quanta sum
        ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"))
        idxs = tl.load(pi_ptr + row * S + cs, mask=cs < S, other=0)  # with ms: no load waits on another
        zs = tl.load(pz_ptr + row * S + cs, mask=cs < S, other=0)  # (greedy rows: unused unless logprobs)
        m, bc = tl.max(ms, 0, return_indices=True, return_indices_tie_break_left=True)
        if RETURN_LOGPROBS:
            log_z = _log_z(ms, zs)
        if greedy:  # the first chunk holding the max, its lowest argmax: the row's lowest argmax
            tok = tl.sum(tl.where(cs == bc, idxs, 0), 0)
        else:  # the draws' tokens, scores and verdicts load with the chunks' results (an empty row's: unused)
            # (cast: an all-greedy call passes placeholders of another type, never read)
            dx = dx_ptr + row * NDRAW
            dq = dq_ptr + row * NDRAW
            dv = dv_ptr + row * NDRAW
            tok = _decide(tl.load(dx).to(tl.int32), tl.load(dx + 1).to(tl.int32), tl.load(dx + 2).to(tl.int32),
                          tl.load(dx + 3).to(tl.int32), tl.load(dq).to(tl.float32), tl.load(dq + 1).to(tl.float32),
                          tl.load(dq + 2).to(tl.float32), tl.load(dq + 3).to(tl.float32), tl.load(dv).to(tl.int32),
                          tl.load(dv + 1).to(tl.int32), tl.load(dv + 2).to(tl.int32), tl.load(dv + 3).to(tl.int32), m,
                          top_k, top_p, min_p, lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1,
                          ps_ptr + row * 8 * S, S, ms, zs, HAS_MASK, BLOCK, CHUNK, True, SPLIT2, SP)
    elif greedy:  # one pass: m = max(s) and its lowest argmax
        arange = tl.arange(0, BLOCK)
        m = float("-inf")
        tok = 0
        z = 0.0
        for start in range(0, V, BLOCK):
            s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            bm, bi = tl.max(s, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.where(bm > m, start + bi, tok)
            if RETURN_LOGPROBS:
                new_m = tl.maximum(m, bm)
                safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
                z = z * tl.exp(m - safe_m) + tl.sum(tl.exp(s - safe_m), 0)
            m = tl.maximum(m, bm)
        log_z = tl.log(tl.where(m == float("-inf"), 1.0, z))
    else:  # pass 1 by chunks; the draws (a tile each); then the first kept one
        tok = 0
        ms, zs, cs = _row_chunks(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, float("-inf"), float("inf"),
                                 HAS_MASK, CHUNK, SP)
        m = tl.max(ms, 0)
        if RETURN_LOGPROBS:
            log_z = _log_z(ms, zs)
        if m > float("-inf"):
            tok = _sample_row(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, m, top_k, top_p, min_p,
                              k0, k1, HAS_MASK, BLOCK, CHUNK, SP)
    empty = m == float("-inf")

    tok = tl.where(empty, -1, tok)
    tl.store(tokens_ptr + pid, tok.to(tl.int64))
    tl.store(empty_ptr + pid, empty)
    if RETURN_LOGPROBS:
        st = tl.load(lrow + tl.maximum(tok, 0).to(tl.int64) * stride_lv).to(tl.float32) * inv_t
        lp = tl.where(empty, float("-inf"), st - m - log_z)
        tl.store(logprobs_ptr + pid, lp)


# fmt: off
@triton.jit
def _apply_bitmask_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb,  # [B, W] int32
    rows_ptr,  # [N] int32 rows to mask (HAS_ROWS), else program id
    V,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # fmt: on
    pid = tl.program_id(0)
    if HAS_ROWS:
        row = tl.load(rows_ptr + pid).to(tl.int64)
    else:
        row = pid.to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    words = tl.load(mask_ptr + row * stride_mb + offs // 32, mask=inb, other=-1)
    forbidden = ((words >> (offs % 32)) & 1) == 0
    ptrs = logits_ptr + row * stride_lb + offs.to(tl.int64) * stride_lv
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty), mask=inb & forbidden)


# tuning knobs (benchmarks/bench_sampling.py --sweep sets them); BLOCK depends on V only
BLOCK_MAX = 8192
NUM_WARPS = 16
# split passes: programs per row = cdiv(V, CHUNK), CHUNK = reference.chunk_size(V) (V only,
# never B: it is part of what a seed samples)
SPLIT_WARPS = 8  # 16 tokens a thread
# the draws: 4 warps (H200, against 8: top-p 56.1 -> 52.7 us at fp32, B = 128, V = 128,256, and
# 23.5 -> 22.1 on the model's logits at B = 128; 11.5 -> 11.8 at B = 1). Their B * 4 programs
# then fit in one wave; a program's work is one tile and its running sum
DRAW_WARPS = 4
# the all-greedy kernel: a tile of CHUNK tokens of 4-byte logits, 2 * CHUNK of 2-byte ones (any
# tile gives the same argmax), 4 warps; H200, B = 128, V = 128,256: bf16 13.0 us (16.6 with CHUNK
# and 8 warps), fp32 21.2 (22.4)
GREEDY_WARPS = 4
# bfloat16 (packed keys): a program takes GREEDY_TILES tiles of CHUNK in turn (H200, µs, against
# one tile of 2 * CHUNK: B = 128, V = 128,256 12.16 -> 11.98; V = 262,144 24.96 -> 24.27;
# B = 512, V = 49,152 19.68 -> 18.75; B = 128, V = 49,152 6.29 -> 6.05; 4 tiles: slower)
GREEDY_TILES = 2
PASS2_WARPS = 4  # the test pass: 32 tokens a thread (H200: 1.3-1.8x faster than 8 at B >= 128)
# "auto": split when a row has more than one chunk; "1": always; "0": never (one program per row)
SPLIT = os.environ.get("DEEPINFER_SAMPLE_SPLIT", "auto")
# with the split: "1" runs the top-k / top-p test pass over (row, chunk) programs too; "0" in the
# per-row kernel (one program streams the row: latency-bound)
SPLIT2 = os.environ.get("DEEPINFER_SAMPLE_SPLIT2", "1")
# with the split, an all-greedy call without logprobs: "1" one launch (_split_greedy_kernel),
# "0" pass 1 then the per-row kernel
GREEDY1 = os.environ.get("DEEPINFER_SAMPLE_GREEDY1", "1")
# with the split on a GPU that has it: "1" each launch after pass 1 starts while the one before
# ends (programmatic dependent launch) and waits for it only before reading its results
PDL = os.environ.get("DEEPINFER_SAMPLE_PDL", "1")
# that kernel's tile as [CHUNK / 32, 32] (one bitmask word a row) "1", or flat "0" (bfloat16: always 2-D)
MASK2D = os.environ.get("DEEPINFER_SAMPLE_MASK2D", "1")
_counts: dict[torch.device, torch.Tensor] = {}
_pdl_ok: dict[torch.device, bool] = {}


def _row_counts(dev: torch.device, B: int) -> torch.Tensor:
    """[>= B] int32 zeros for _split_greedy_kernel, kept per device: every call leaves them at
    zero, so no launch clears them. (One stream at a time: two concurrent calls would share
    them.) Inside a CUDA-graph capture a missing buffer is made for that graph alone."""
    buf = _counts.get(dev)
    if buf is not None and buf.numel() >= B:
        return buf
    buf = torch.zeros(max(B, 1024), dtype=torch.int32, device=dev)
    if not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _counts[dev] = buf
    return buf


def _pdl_device(dev: torch.device) -> bool:
    """Whether launches on ``dev`` can use programmatic dependent launch (a CUDA device of compute
    capability 9 or later, a Triton that has it, not the interpreter); kept per device."""
    ok = _pdl_ok.get(dev)
    if ok is None:
        ok = _HAS_PDL and not _INTERPRET and dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        _pdl_ok[dev] = ok
    return ok


def _block(V: int) -> int:
    return min(BLOCK_MAX, triton.next_power_of_2(V))


def _split_chunk(V: int) -> int:
    return reference.chunk_size(V)


def _use_split(B: int, V: int) -> bool:
    if SPLIT not in ("auto", "0", "1"):
        raise ValueError(f"DEEPINFER_SAMPLE_SPLIT must be auto, 0 or 1, got {SPLIT!r}")
    return SPLIT == "1" or (SPLIT == "auto" and V > _split_chunk(V))


def _launch_opts(warps: int | None = None) -> dict:
    # no FMA contraction: s = x * inv_t rounds as in torch
    return {} if _INTERPRET else {"num_warps": warps or NUM_WARPS, "enable_fp_fusion": False}


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    """Triton version of :func:`reference.apply_bitmask_` (arguments already validated)."""
    B, V = logits.shape
    block = min(1024, triton.next_power_of_2(V))
    rows = indices.to(device=logits.device, dtype=torch.int32) if indices is not None else None
    n = rows.numel() if rows is not None else B
    if n == 0:
        return logits
    grid = (n, triton.cdiv(V, block))
    _apply_bitmask_kernel[grid](
        logits, logits.stride(0), logits.stride(1),
        bitmask, bitmask.stride(0),
        rows if rows is not None else bitmask,
        V, HAS_ROWS=rows is not None, BLOCK=block,
        **({} if _INTERPRET else {"num_warps": 4}),
    )  # fmt: skip
    return logits


def sample(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    indices: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    return_logprobs: bool = False,
    kinds: str = "filter",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton version of :func:`reference.sample`.

    Arguments are validated [B] tensors on logits' device: temperature / top_p / min_p float32,
    top_k / seed / step int64 (``deepinfer.kernels.sample`` prepares them). One launch when V
    is one chunk; else up to four (pass 1, the draws, the test pass, the per-row decision),
    plus one small scatter when ``indices`` is given. ``kinds`` (known on the host) leaves out
    launches no row needs: "greedy" (every row greedy: no draws), "plain" (no row samples with
    a filter: pass 1, then one program a row draws and ends it), "sample" (no row samples with
    top-k or top-p: no test pass), "top_p" (no row samples with top-k: the test pass without
    the counts), "filter" (all of them).
    """
    B, V = logits.shape
    dev = logits.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    empty = torch.empty(B, dtype=torch.bool, device=dev)
    logprobs = torch.empty(B, dtype=torch.float32, device=dev) if return_logprobs else tokens
    if B == 0:
        return tokens, empty, (logprobs if return_logprobs else None)
    row_map = None
    if bitmask is not None and indices is not None:
        row_map = torch.zeros(B, dtype=torch.int32, device=dev)
        row_map[indices.to(device=dev, dtype=torch.int64)] = 1
    mask_args = (
        bitmask if bitmask is not None else tokens, bitmask.stride(0) if bitmask is not None else 0,
        row_map if row_map is not None else tokens,
    )  # fmt: skip
    flags = dict(HAS_MASK=bitmask is not None, HAS_ROW_MAP=row_map is not None)
    split = _use_split(B, V)
    if SPLIT2 not in ("0", "1"):
        raise ValueError(f"DEEPINFER_SAMPLE_SPLIT2 must be 0 or 1, got {SPLIT2!r}")
    split2 = split and kinds in ("top_p", "filter") and SPLIT2 == "1"
    chunk = _split_chunk(V)
    S = triton.cdiv(V, chunk)
    SP = triton.next_power_of_2(S)
    pm = pz = pi = dx = dq = dv = ps = tokens  # unused without the split
    if split and kinds == "greedy" and not return_logprobs and GREEDY1 == "1":
        packed = logits.dtype == torch.bfloat16 and chunk <= 65536
        # a program takes CHUNK tokens of 4-byte logits, 2 * CHUNK of 2-byte ones (two tiles in
        # turn when packed); any tiling gives the same argmax
        tiles = GREEDY_TILES if packed else 1
        gchunk = min(chunk * (1 if packed else max(1, 4 // logits.element_size())), triton.next_power_of_2(V))
        gS = triton.cdiv(V, gchunk * tiles)
        pm = torch.empty(B, gS, dtype=torch.float32, device=dev)
        pi = torch.empty(B, gS, dtype=torch.int32, device=dev)
        _split_greedy_kernel[(B * gS,)](
            logits, logits.stride(0), logits.stride(1), *mask_args, pm, pi, _row_counts(dev, B),
            tokens, empty, V, gS, CHUNK=gchunk, SP=triton.next_power_of_2(gS),
            PACKED=packed, MASK2D=MASK2D == "1" and gchunk >= 32, TILES=tiles,
            **flags, **_launch_opts(GREEDY_WARPS),
        )  # fmt: skip
        return tokens, empty, None
    pdl = split and PDL == "1" and _pdl_device(dev)
    chained = {"launch_pdl": True} if pdl else {}  # (pass 1 waits for everything before it)
    if split:
        lv = (logits, logits.stride(0), logits.stride(1))
        pm = torch.empty(B, S, dtype=torch.float32, device=dev)
        pz = torch.empty(B, S, dtype=torch.int64, device=dev)
        pi = torch.empty(B, S, dtype=torch.int32, device=dev)
        _split_pass1_kernel[(B * S,)](
            *lv, *mask_args, temperature, pm, pz, pi, V, S,
            RETURN_LOGPROBS=return_logprobs, CHUNK=chunk, PDL=pdl, **flags, **_launch_opts(SPLIT_WARPS),
        )  # fmt: skip
        if kinds == "plain":  # no filter: the draw (or the argmax) ends the row
            _split_plain_kernel[(B,)](
                *lv, *mask_args, temperature, seed, step, pm, pz, pi, tokens, empty, logprobs, V, S,
                RETURN_LOGPROBS=return_logprobs, CHUNK=chunk, SP=SP, PDL=pdl, **flags, **_launch_opts(DRAW_WARPS),
                **chained,
            )  # fmt: skip
            return tokens, empty, (logprobs if return_logprobs else None)
        if kinds != "greedy":
            dx = torch.empty(B, N_DRAWS, dtype=torch.int32, device=dev)
            dq = torch.empty(B, N_DRAWS, dtype=torch.float32, device=dev)
            dv = torch.empty(B, N_DRAWS, dtype=torch.int32, device=dev)
            _split_draw_kernel[(B * N_DRAWS,)](
                *lv, *mask_args, temperature, top_k, top_p, min_p, seed, step, pm, pz, dx, dq, dv, V, S,
                CHUNK=chunk, SP=SP, PDL=pdl, **flags, **_launch_opts(DRAW_WARPS), **chained,
            )  # fmt: skip
        if split2:
            ps = torch.empty(B, 8, S, dtype=torch.float32, device=dev)
            _split_pass2_kernel[(B * S,)](
                *lv, *mask_args, temperature, top_k, top_p, min_p, pm, dq, dv, ps, V, S,
                CHUNK=chunk, SP=SP, K_ON=kinds == "filter", TILE2D=logits.element_size() < 4, PDL=pdl, **flags,
                **_launch_opts(PASS2_WARPS), **chained,
            )  # fmt: skip
    _sample_kernel[(B,)](
        logits, logits.stride(0), logits.stride(1),
        *mask_args,
        temperature,
        top_k, top_p, min_p,
        seed, step,
        tokens, empty, logprobs,
        pm, pz, pi, dx, dq, dv, ps,
        V, S,
        RETURN_LOGPROBS=return_logprobs, BLOCK=_block(V), CHUNK=chunk,
        SPLIT=split, SPLIT2=split2, SP=SP, PDL=pdl, **flags,
        **_launch_opts(), **chained,
    )  # fmt: skip
    return tokens, empty, (logprobs if return_logprobs else None)


__all__ = ["apply_bitmask_", "sample", "reference"]
