"""Triton kernels: bitmask apply, and the fused mask + temperature + top-k/top-p/min-p + sampling.

One program per row loops over the vocabulary in ``BLOCK`` chunks, so a row's result depends
only on that row's inputs (batch invariance) and ``BLOCK`` depends only on V.

Split pass 1 (``SPLIT``, default when V is over one chunk): a first, lean kernel runs pass 1
on (row, chunk) programs, one ``CHUNK``-token tile each (``CHUNK`` from V only): greedy rows
write the chunk's max and its lowest index, sampling rows its max and 4 best keys. The per-row
kernel then combines the row's chunks in chunk order (greedy: the first chunk holding the max,
so the lowest id on ties; sampling: the row's 4 best keys, key desc then id asc, are among the
chunks' 4 best) and goes on as below. Same tokens as without the split; only the logprob's
normaliser is summed in another order.

Sampling is the Gumbel-max trick with counter-based noise (``reference.uniform_noise``, the
same 32-bit integer hash in both backends): token = argmax over the kept set of ``s_i + g_i``.
The kept set is ``{i : s_i >= tau}`` for an unknown threshold tau (top-k, top-p and min-p
are all thresholds on the score s), found without sorting:

    pass 1: m = max(s); c0..c3 = the 4 best keys s + g (key order)   # greedy: m and argmax only
    min-p only: no pass; kept(c) <=> exp(s_c - m) >= min_p
    pass 2 (top-k / top-p): count and mass above s_c0..s_c3 and q4 = (max s_cj + m) / 2 at
            once, Z = sum exp(s - m); token = the first kept c_j     # every higher key is cut
    all four cut (probability ~ (1 - kept mass)**4): [low, high] = [max s_cj, q4] if q4 is
      kept, else [q4, m] (the first dual-pivot test, for free); then rounds
      propose pass: c = argmax of s+g above low (blocks that cannot win skip the noise)
      test pass at p0 = s_c, p1 = (s_c + high) / 2 (dual pivot, as FlashInfer):
            p0 kept -> token = c; p1 cut -> low = p1; else low = p0, high = p1

The candidates are a prefix of all tokens in key order, so the first kept one is the argmax
over the kept set; every later candidate is the argmax of an upper set holding the kept set,
so the first kept one is again the answer. Either way the reference's token. Passes over V:
greedy 1; top-p / top-k 2 (4, plus 2 a further round, in the rare fallback); min-p alone 1. No host
synchronisation, no sort, no extra memory.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import reference

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Device helpers are inlined by the compiler; under the interpreter each @triton.jit call
# re-patches triton.language (~0.4 ms), so there they are plain functions (same code).
_helper = (lambda fn: fn) if _INTERPRET else triton.jit


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


if _INTERPRET:

    def _log2(x):
        return tl.log2(x)

else:

    @triton.jit
    def _log2(x):
        # MUFU lg2 (rel. error ~2**-22): tl.log2 is a ~20-instruction libdevice polynomial
        return tl.inline_asm_elementwise(
            "lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@_helper
def _gumbel(offs, k0, k1):
    # offs: int32 [BLOCK] token ids -> Gumbel noise [BLOCK] float32 (reference.gumbel_noise)
    r = _mix32(_mix32(offs.to(tl.uint32) + k0) ^ k1)
    u = ((r >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -0.6931471805599453 * _log2(-_log2(u))


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


# max over u of -log(-log(u)) is 16.64 (u = 1 - 2**-24); a block whose best score plus this
# cannot beat the best key so far needs no noise (fl(s + g) <= fl(bm + GMAX) by monotone rounding)


@_helper
def _propose(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, low,
             HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # -> argmax of s + g over {s > low} (blocks that cannot beat the best key skip the noise)
    arange = tl.arange(0, BLOCK)
    best_key = float("-inf")
    tok = 0
    for start in range(0, V, BLOCK):
        offs = start + arange
        s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
        s_up = tl.where(s > low, s, float("-inf"))
        if tl.max(s_up, 0) + 17.0 > best_key:
            key = s_up + _gumbel(offs, k0, k1)
            bk, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.where(bk > best_key, start + bi, tok)
            best_key = tl.maximum(best_key, bk)
    return tok


@_helper
def _insert(key, tok, c0, t0, c1, t1, c2, t2, c3, t3):
    # insert (key, tok) into the 4 best (key desc) so far; an equal key goes after the ones
    # already there (they have lower token ids: blocks go up, ties within a block go left)
    n0 = tl.where(key > c0, key, c0)
    u0 = tl.where(key > c0, tok, t0)
    n1 = tl.where(key > c0, c0, tl.where(key > c1, key, c1))
    u1 = tl.where(key > c0, t0, tl.where(key > c1, tok, t1))
    n2 = tl.where(key > c1, c1, tl.where(key > c2, key, c2))
    u2 = tl.where(key > c1, t1, tl.where(key > c2, tok, t2))
    n3 = tl.where(key > c2, c2, tl.where(key > c3, key, c3))
    u3 = tl.where(key > c2, t2, tl.where(key > c3, tok, t3))
    return n0, u0, n1, u1, n2, u2, n3, u3


@_helper
def _candidates(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1,
                HAS_MASK: tl.constexpr, WITH_Z: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # pass 1 -> the 4 best keys s + g with their tokens (key desc, lowest id on ties; key -inf
    # where fewer than 4 tokens are allowed), max(s), sum(exp(s - max s)) if WITH_Z
    arange = tl.arange(0, BLOCK)
    ninf = float("-inf")
    c0 = ninf
    c1 = ninf
    c2 = ninf
    c3 = ninf
    t0 = 0
    t1 = 0
    t2 = 0
    t3 = 0
    m = ninf
    z = 0.0
    for start in range(0, V, BLOCK):
        offs = start + arange
        s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
        bm = tl.max(s, 0)
        if bm + 17.0 > c3:  # else no key of this block can enter the 4 best
            key = s + _gumbel(offs, k0, k1)
            bk, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            while bk > c3:
                c0, t0, c1, t1, c2, t2, c3, t3 = _insert(bk, start + bi, c0, t0, c1, t1, c2, t2, c3, t3)
                key = tl.where(arange == bi, ninf, key)
                bk, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
        if WITH_Z:
            new_m = tl.maximum(m, bm)
            safe_m = tl.where(new_m == ninf, 0.0, new_m)
            z = z * tl.exp(m - safe_m) + tl.sum(tl.exp(s - safe_m), 0)
        m = tl.maximum(m, bm)
    return c0, t0, c1, t1, c2, t2, c3, t3, m, z


# fmt: off
@_helper
def _filter(c0, t0, c1, t1, c2, t2, c3, t3, m, top_k, top_p, min_p, lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    # Top-k / top-p / min-p without a sort. The kept set is {s >= tau}; the answer is the first
    # of the key-ordered candidates c0..c3 that is kept (every key above it belongs to a cut
    # token). One test pass measures count and mass above the four candidate scores at once;
    # min-p alone needs no pass (e_i >= min_p is known from m). Only when all four are cut
    # (probability ~ (1 - kept mass)**4) do pivot rounds follow (see the module docstring).
    arange = tl.arange(0, BLOCK)
    kmax = tl.where(top_k > 0, top_k, 2147483647)
    cut_p = top_p < 1.0
    k_on = (top_k > 0) & (top_k < V)
    active = k_on | cut_p | (min_p > 0.0)
    tok = t0
    if active & (m > float("-inf")):
        # candidate scores (+inf where a slot is empty: never counted, marked cut below)
        v0 = c0 > float("-inf")
        v1 = c1 > float("-inf")
        v2 = c2 > float("-inf")
        v3 = c3 > float("-inf")
        q0 = tl.where(v0, tl.load(lrow + t0.to(tl.int64) * stride_lv).to(tl.float32) * inv_t, float("inf"))
        q1 = tl.where(v1, tl.load(lrow + t1.to(tl.int64) * stride_lv).to(tl.float32) * inv_t, float("inf"))
        q2 = tl.where(v2, tl.load(lrow + t2.to(tl.int64) * stride_lv).to(tl.float32) * inv_t, float("inf"))
        q3 = tl.where(v3, tl.load(lrow + t3.to(tl.int64) * stride_lv).to(tl.float32) * inv_t, float("inf"))
        ninf = float("-inf")
        qmax = tl.maximum(tl.maximum(tl.where(v0, q0, ninf), tl.where(v1, q1, ninf)),
                          tl.maximum(tl.where(v2, q2, ninf), tl.where(v3, q3, ninf)))
        q4 = qmax * 0.5 + m * 0.5  # brackets tau for the rounds should all four be cut
        zz = 0.0
        mass0 = 0.0
        mass1 = 0.0
        mass2 = 0.0
        mass3 = 0.0
        mass4 = 0.0
        cnt0 = 0
        cnt1 = 0
        cnt2 = 0
        cnt3 = 0
        cnt4 = 0
        if k_on:
            for start in range(0, V, BLOCK):
                s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
                e = tl.exp(s - m)
                zz += tl.sum(e, 0)
                cnt0 += tl.sum((s > q0).to(tl.int32), 0)
                cnt1 += tl.sum((s > q1).to(tl.int32), 0)
                cnt2 += tl.sum((s > q2).to(tl.int32), 0)
                cnt3 += tl.sum((s > q3).to(tl.int32), 0)
                cnt4 += tl.sum((s > q4).to(tl.int32), 0)
                mass0 += tl.sum(tl.where(s > q0, e, 0.0), 0)
                mass1 += tl.sum(tl.where(s > q1, e, 0.0), 0)
                mass2 += tl.sum(tl.where(s > q2, e, 0.0), 0)
                mass3 += tl.sum(tl.where(s > q3, e, 0.0), 0)
                mass4 += tl.sum(tl.where(s > q4, e, 0.0), 0)
        elif cut_p:  # top-p without top-k: masses only
            for start in range(0, V, BLOCK):
                s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
                e = tl.exp(s - m)
                zz += tl.sum(e, 0)
                mass0 += tl.sum(tl.where(s > q0, e, 0.0), 0)
                mass1 += tl.sum(tl.where(s > q1, e, 0.0), 0)
                mass2 += tl.sum(tl.where(s > q2, e, 0.0), 0)
                mass3 += tl.sum(tl.where(s > q3, e, 0.0), 0)
                mass4 += tl.sum(tl.where(s > q4, e, 0.0), 0)
        # cut: a token scoring exactly q would be filtered out, i.e. q < tau
        pz = top_p * zz
        cut0 = (v0 == 0) | (cnt0 >= kmax) | (cut_p & (mass0 >= pz)) | (tl.exp(q0 - m) < min_p)
        cut1 = (v1 == 0) | (cnt1 >= kmax) | (cut_p & (mass1 >= pz)) | (tl.exp(q1 - m) < min_p)
        cut2 = (v2 == 0) | (cnt2 >= kmax) | (cut_p & (mass2 >= pz)) | (tl.exp(q2 - m) < min_p)
        cut3 = (v3 == 0) | (cnt3 >= kmax) | (cut_p & (mass3 >= pz)) | (tl.exp(q3 - m) < min_p)
        cut4 = (cnt4 >= kmax) | (cut_p & (mass4 >= pz)) | (tl.exp(q4 - m) < min_p)
        tok = tl.where(cut2, t3, t2)
        tok = tl.where(cut1, tok, t1)
        tok = tl.where(cut0, tok, t0)
        searching = cut0 & cut1 & cut2 & cut3
        if searching:
            # tau is above every candidate's score (and above q4 if q4 is cut): propose the
            # Gumbel argmax above that, then test it at two pivots per pass (dual-pivot rounds,
            # as FlashInfer)
            low = tl.where(cut4, q4, qmax)
            high = tl.where(cut4, m, q4)  # a score known to be kept
            tok = _propose(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, low, HAS_MASK, BLOCK)
            while searching:
                sc = tl.load(lrow + tok.to(tl.int64) * stride_lv).to(tl.float32) * inv_t
                p0 = sc
                p1 = sc * 0.5 + high * 0.5
                zz = 0.0
                mass0 = 0.0
                mass1 = 0.0
                cnt0 = 0
                cnt1 = 0
                if k_on | cut_p:
                    for start in range(0, V, BLOCK):
                        s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t,
                                         HAS_MASK)
                        e = tl.exp(s - m)
                        a0 = s > p0
                        a1 = s > p1
                        zz += tl.sum(e, 0)
                        cnt0 += tl.sum(a0.to(tl.int32), 0)
                        cnt1 += tl.sum(a1.to(tl.int32), 0)
                        mass0 += tl.sum(tl.where(a0, e, 0.0), 0)
                        mass1 += tl.sum(tl.where(a1, e, 0.0), 0)
                cut0 = (cnt0 >= kmax) | (cut_p & (mass0 >= top_p * zz)) | (tl.exp(p0 - m) < min_p)
                cut1 = (cnt1 >= kmax) | (cut_p & (mass1 >= top_p * zz)) | (tl.exp(p1 - m) < min_p)
                low = tl.where(cut1, p1, p0)
                high = tl.where(cut1, high, p1)
                if cut0:  # else tok is kept, hence the argmax over the kept set
                    tok = _propose(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, low, HAS_MASK,
                                   BLOCK)
                searching = cut0
    return tok


@_helper
def _pick(keys, toks, live):
    # the best live (key, token) by key desc, token asc -> (key, token, live without it);
    # token 0 where no live key is finite (as _candidates leaves an empty slot)
    kk = tl.where(live, keys, float("-inf"))
    bk = tl.max(kk, 0)
    cand = live & (kk == bk)
    bt = tl.min(tl.where(cand, toks, 2147483647), 0)
    live = live & ((cand & (toks == bt)) == 0)
    return bk, tl.where(bk > float("-inf"), bt, 0), live


# fmt: off
@triton.jit
def _split_pass1_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V]
    mask_ptr, stride_mb, mask_row_ptr,  # as _sample_kernel
    temp_ptr, seed_ptr, step_ptr,  # [B] float32, int64, int64
    pf_ptr, pi_ptr,  # out: [B, 6, S] float32 (max, sum exp(s - max), 4 best keys), [B, 4, S] int32 tokens
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # fmt: on
    # program (row, c) runs pass 1 on tokens [c * CHUNK, (c + 1) * CHUNK) of the row, one tile:
    # greedy rows: max and its lowest index; sampling rows: max and the 4 best Gumbel keys (key
    # desc, lowest id on ties). CHUNK depends on V only, so a row's result depends on that row.
    pid = tl.program_id(0)
    r = pid // S
    c = pid - r * S
    row = r.to(tl.int64)
    lrow = logits_ptr + row * stride_lb
    mrow_ptr = mask_ptr + row * stride_mb
    has_row_mask = True
    if HAS_ROW_MAP:
        has_row_mask = tl.load(mask_row_ptr + r) != 0
    temp = tl.load(temp_ptr + r)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    # the tile is loaded before the row's kind is known (no load waits on another)
    x = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, 1.0, HAS_MASK)
    pf_row = pf_ptr + row * 6 * S + c
    pi_row = pi_ptr + row * 4 * S + c
    greedy = temp == 0
    if greedy:
        m, bi = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(pi_row, c * CHUNK + bi)
        s = x
    else:
        inv_t = tl.math.div_rn(1.0, temp)  # IEEE, as torch
        s = x * inv_t
        m = tl.max(s, 0)
        k0, k1 = _row_keys(tl.load(seed_ptr + r), tl.load(step_ptr + r))
        key = s + _gumbel(offs, k0, k1)
        arange = tl.arange(0, CHUNK)
        for j in tl.static_range(4):
            bk, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(pf_row + (2 + j) * S, bk)
            tl.store(pi_row + j * S, c * CHUNK + bi)
            key = tl.where(arange == bi, float("-inf"), key)
    tl.store(pf_row, m)
    if RETURN_LOGPROBS:
        safe_m = tl.where(m == float("-inf"), 0.0, m)
        tl.store(pf_row + S, tl.sum(tl.exp(s - safe_m), 0))


# fmt: off
@triton.jit
def _sample_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V] fp32 | bf16 | fp16
    mask_ptr, stride_mb, mask_row_ptr,  # [B, W] int32; [B] int32 (HAS_ROW_MAP): 1 = row is masked
    temp_ptr,  # [B] float32
    top_k_ptr, top_p_ptr, min_p_ptr,  # [B] int64, float32, float32
    seed_ptr, step_ptr,  # [B] int64
    tokens_ptr, empty_ptr, logprobs_ptr,  # [B] int64, bool, float32
    pf_ptr, pi_ptr,  # SPLIT: [B, 6, S] float32, [B, 4, S] int32 written by _split_pass1_kernel
    V, S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT: tl.constexpr,  # pass 1 was done by _split_pass1_kernel: combine its S chunk results
    SP: tl.constexpr,  # next power of 2 >= S
    SP4: tl.constexpr,  # next power of 2 >= 4 * S
):
    # fmt: on
    pid = tl.program_id(0)
    row = pid.to(tl.int64)
    lrow = logits_ptr + row * stride_lb
    mrow_ptr = mask_ptr + row * stride_mb
    has_row_mask = True
    if HAS_ROW_MAP:
        has_row_mask = tl.load(mask_row_ptr + pid) != 0
    temp = tl.load(temp_ptr + pid)
    greedy = temp == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp)))  # IEEE, as torch
    seed = tl.load(seed_ptr + pid)
    step = tl.load(step_ptr + pid)
    k0, k1 = _row_keys(seed, step)
    arange = tl.arange(0, BLOCK)

    top_k = tl.load(top_k_ptr + pid)
    top_p = tl.load(top_p_ptr + pid)
    min_p = tl.load(min_p_ptr + pid)
    if SPLIT:
        # the chunks' results, in chunk order: max, argmax (lowest id), sum exp(s - max), 4 best keys
        pf_row = pf_ptr + row * 6 * S
        pi_row = pi_ptr + row * 4 * S
        c = tl.arange(0, SP)
        ms = tl.load(pf_row + c, mask=c < S, other=float("-inf"))
        idxs = tl.load(pi_row + c, mask=c < S, other=0)  # with ms: no load waits on another
        m, bc = tl.max(ms, 0, return_indices=True, return_indices_tie_break_left=True)
        z = 0.0
        if RETURN_LOGPROBS:
            safe_m = tl.where(m == float("-inf"), 0.0, m)
            zs = tl.load(pf_row + S + c, mask=c < S, other=0.0)
            z = tl.sum(tl.where(ms == float("-inf"), 0.0, zs * tl.exp(ms - safe_m)), 0)
        if greedy:  # the first chunk holding the max, its lowest argmax: the row's lowest argmax
            tok = tl.sum(tl.where(c == bc, idxs, 0), 0)
        else:  # the 4 best keys of the row are among the chunks' 4 best; then the filter as below
            e = tl.arange(0, SP4)
            keys = tl.load(pf_row + 2 * S + e, mask=e < 4 * S, other=float("-inf"))
            toks = tl.load(pi_row + e, mask=e < 4 * S, other=0)
            live = e < 4 * S
            c0, t0, live = _pick(keys, toks, live)
            c1, t1, live = _pick(keys, toks, live)
            c2, t2, live = _pick(keys, toks, live)
            c3, t3, live = _pick(keys, toks, live)
            tok = _filter(c0, t0, c1, t1, c2, t2, c3, t3, m, top_k, top_p, min_p, lrow, stride_lv, mrow_ptr,
                          has_row_mask, V, inv_t, k0, k1, HAS_MASK, BLOCK)
    elif greedy:  # one pass: m = max(s) and its lowest argmax
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
    else:  # pass 1: the 4 best Gumbel keys; then the first kept one (test pass, if top-k / top-p)
        c0, t0, c1, t1, c2, t2, c3, t3, m, z = _candidates(
            lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, k0, k1, HAS_MASK, RETURN_LOGPROBS, BLOCK
        )
        tok = _filter(c0, t0, c1, t1, c2, t2, c3, t3, m, top_k, top_p, min_p, lrow, stride_lv, mrow_ptr,
                      has_row_mask, V, inv_t, k0, k1, HAS_MASK, BLOCK)
    empty = m == float("-inf")

    tok = tl.where(empty, -1, tok)
    tl.store(tokens_ptr + pid, tok.to(tl.int64))
    tl.store(empty_ptr + pid, empty)
    if RETURN_LOGPROBS:
        st = tl.load(lrow + tl.maximum(tok, 0).to(tl.int64) * stride_lv).to(tl.float32) * inv_t
        lp = tl.where(empty, float("-inf"), st - m - tl.log(tl.where(empty, 1.0, z)))
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
# split pass 1: programs per row = cdiv(V, CHUNK), CHUNK depends on V only (never on B)
SPLIT_CHUNK_MAX = 4096
SPLIT_WARPS = 8  # 16 tokens a thread: 64 registers (fp32), 4 programs per SM
# "auto": split when a row has more than one chunk; "1": always; "0": never (one program per row)
SPLIT = os.environ.get("DEEPINFER_SAMPLE_SPLIT", "auto")


def _block(V: int) -> int:
    return min(BLOCK_MAX, triton.next_power_of_2(V))


def _split_chunk(V: int) -> int:
    return min(SPLIT_CHUNK_MAX, triton.next_power_of_2(V))


def _use_split(B: int, V: int) -> bool:
    if SPLIT not in ("auto", "0", "1"):
        raise ValueError(f"DEEPINFER_SAMPLE_SPLIT must be auto, 0 or 1, got {SPLIT!r}")
    return SPLIT == "1" or (SPLIT == "auto" and V > _split_chunk(V))


def _launch_opts() -> dict:
    # no FMA contraction: s = x * inv_t and key = s + g round as in torch
    return {} if _INTERPRET else {"num_warps": NUM_WARPS, "enable_fp_fusion": False}


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton version of :func:`reference.sample`.

    Arguments are validated [B] tensors on logits' device: temperature / top_p / min_p float32,
    top_k / seed / step int64 (``deepinfer.kernels.sample`` prepares them); one launch (two with
    the split pass 1), plus one small scatter when ``indices`` is given.
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
    split = _use_split(B, V)
    S = 1
    pf = pi = tokens  # unused without the split
    if split:
        # pass 1 over (row, chunk) programs; the per-row kernel combines the chunks' results
        chunk = _split_chunk(V)
        S = triton.cdiv(V, chunk)
        pf = torch.empty(B, 6, S, dtype=torch.float32, device=dev)
        pi = torch.empty(B, 4, S, dtype=torch.int32, device=dev)
        _split_pass1_kernel[(B * S,)](
            logits, logits.stride(0), logits.stride(1),
            *mask_args,
            temperature, seed, step,
            pf, pi,
            V, S,
            HAS_MASK=bitmask is not None, HAS_ROW_MAP=row_map is not None,
            RETURN_LOGPROBS=return_logprobs, CHUNK=chunk,
            **({} if _INTERPRET else {"num_warps": SPLIT_WARPS, "enable_fp_fusion": False}),
        )  # fmt: skip
    _sample_kernel[(B,)](
        logits, logits.stride(0), logits.stride(1),
        *mask_args,
        temperature,
        top_k, top_p, min_p,
        seed, step,
        tokens, empty, logprobs,
        pf, pi,
        V, S,
        HAS_MASK=bitmask is not None, HAS_ROW_MAP=row_map is not None,
        RETURN_LOGPROBS=return_logprobs, BLOCK=_block(V),
        SPLIT=split, SP=triton.next_power_of_2(S), SP4=triton.next_power_of_2(4 * S),
        **_launch_opts(),
    )  # fmt: skip
    return tokens, empty, (logprobs if return_logprobs else None)


__all__ = ["apply_bitmask_", "sample", "reference"]
