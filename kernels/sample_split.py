"""The split sampling passes: (row, chunk) programs, CHUNK tokens each.

When V is over one chunk (``SampleTuning.split``) each pass runs over (row, chunk) programs,
``CHUNK`` from V only, so a row's token depends on that row alone: ``_split_pass1_kernel`` (per
chunk: max, sum of exp, greedy argmax), ``_split_draw_kernel`` ((row, draw) programs: the chunk
that holds the draw from the chunks' masses, then one tile's cumulative sum),
``_split_pass2_kernel`` (the test pass per chunk), and the per-row ``sample_rows._sample_kernel``
adds the chunks' results in chunk order and decides. A batch whose sampling rows have no filter
is two launches, pass 1 and ``_split_plain_kernel`` (one program a row: draw 0, or a greedy
row's argmax). (An all-greedy batch without logprobs is one launch: ``sample_greedy``.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .sample_filters import filter_on, test_low, tile_sums, verdict
from .sample_topk import group_maxima
from .triton_common import (
    N_DRAWS,
    NDRAW,
    RowArgs,
    argmax2d,
    chunk_mass,
    chunk_row,
    chunks_log_z,
    dependent,
    gdc_launch_dependents,
    gdc_wait,
    launch_opts,
    load_scores,
    quanta,
    row_draw,
    row_keys,
    row_ptrs,
    tile2d,
)


@triton.jit
def _split_pass1_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # as sample_rows._sample_kernel
    temp_ptr,  # [B] float32
    top_k_ptr,  # [B] int64 (TOPK)
    pm_ptr,
    pz_ptr,
    pi_ptr,  # out: [B, S] float32 max s, int64 quanta sum, int32 greedy argmax
    gm_ptr,  # out (TOPK): [B, S, CHUNK / G] float32 the groups' maxima (group_maxima)
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,  # the launches after this one start early and wait for it (gdc_wait)
    TOPK: tl.constexpr,  # some row may have top-k: its chunks store their groups' maxima
    KC: tl.constexpr,  # SampleTuning.topk_max: top-k rows with top_k <= KC
):
    if PDL:
        gdc_launch_dependents()
    # program (row, c) runs pass 1 on tokens [c * CHUNK, (c + 1) * CHUNK) of the row, one tile:
    # the max of s, its lowest index (greedy rows) and the quanta sum (sampling rows, or for the
    # logprob). CHUNK depends on V only, so a row's result depends on that row.
    r, c, row, lrow, mrow_ptr, has_row_mask = chunk_row(
        logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP
    )
    x, local = tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
    temp = tl.load(temp_ptr + r)
    greedy = temp == 0
    if greedy:
        s = x
        m, bi = argmax2d(x, local, CHUNK)
        tl.store(pi_ptr + row * S + c, c * CHUNK + bi)
    else:
        s = x * tl.math.div_rn(1.0, temp)  # IEEE, as torch
        m = tl.max(s)
        if TOPK:
            top_k = tl.load(top_k_ptr + r)
            if (top_k > 0) & (top_k < V) & (top_k <= KC):
                group_maxima(s, gm_ptr + (row * S + c) * s.shape[0])
    tl.store(pm_ptr + row * S + c, m)
    if RETURN_LOGPROBS | (greedy == 0):
        tl.store(pz_ptr + row * S + c, tl.sum(quanta(s, m, float("-inf"))))


@triton.jit
def _split_draw_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # as sample_rows._sample_kernel
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,  # [B] float32, int64, float32, float32
    seed_ptr,
    step_ptr,  # [B] int64
    pm_ptr,
    pz_ptr,  # [B, S] float32, int64 written by _split_pass1_kernel
    dx_ptr,
    dq_ptr,
    dv_ptr,  # out: [B, NDRAW] int32 drawn tokens, float32 their scores, int32 verdicts
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PDL: tl.constexpr,  # launched early, as a dependent of pass 1
    TOPK: tl.constexpr,  # top-k rows are drawn by the per-row kernel (sample_topk)
):
    if PDL:  # every program waits, so this launch ends after pass 1 (the later ones rely on it)
        gdc_launch_dependents()
        gdc_wait()
    # program (row, j): inverse-CDF draw j of a sampling row (only j = 0 without a filter): the
    # chunk from the chunks' weights, then the token from that one tile's running quanta sum;
    # and the draw's verdict from the chunks' results (verdict: kept or cut for sure, or test)
    pid = tl.program_id(0)
    r = pid // NDRAW
    j = pid - r * NDRAW
    row, lrow, mrow_ptr, has_row_mask = row_ptrs(
        r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP
    )
    temp = tl.load(temp_ptr + r)
    top_k = tl.load(top_k_ptr + r)
    top_p = tl.load(top_p_ptr + r)
    min_p = tl.load(min_p_ptr + r)
    k_on, cut_p, active = filter_on(top_k, top_p, min_p, V)
    if k_on & (temp != 0) & TOPK:  # the per-row kernel draws above the k-th largest score itself:
        tl.store(dv_ptr + row * NDRAW + j, 1)  # "kept", so the test pass reads nothing of the row
    elif (temp != 0) & ((j == 0) | active):
        cs = tl.arange(0, SP)
        ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"))
        m = tl.max(ms, 0)
        if m > float("-inf"):
            zs = tl.load(pz_ptr + row * S + cs, mask=cs < S, other=0)
            inv_t = tl.math.div_rn(1.0, temp)
            k0, k1 = row_keys(tl.load(seed_ptr + r), tl.load(step_ptr + r))
            x, q = row_draw(
                lrow,
                stride_lv,
                mrow_ptr,
                has_row_mask,
                V,
                inv_t,
                ms,
                zs,
                cs,
                float("-inf"),
                j.to(tl.uint32),
                k0,
                k1,
                HAS_MASK,
                CHUNK,
            )
            tl.store(dx_ptr + row * NDRAW + j, x)
            tl.store(dq_ptr + row * NDRAW + j, q)
            if active:
                kmax = tl.where(top_k > 0, top_k, 2147483647)
                w = chunk_mass(ms, zs, m)
                v = verdict(q, x // CHUNK, m, ms, w, tl.sum(w, 0), cs, kmax, k_on, cut_p, top_p, min_p)
                tl.store(dv_ptr + row * NDRAW + j, v)


@triton.jit
def _split_plain_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # as sample_rows._sample_kernel
    temp_ptr,  # [B] float32
    seed_ptr,
    step_ptr,  # [B] int64
    pm_ptr,
    pz_ptr,
    pi_ptr,  # [B, S] written by _split_pass1_kernel
    tokens_ptr,
    empty_ptr,
    logprobs_ptr,  # out: [B] int64, bool, float32
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PDL: tl.constexpr,  # launched early, as a dependent of pass 1
):
    # program r ends row r of a call where no row has a filter (kinds "plain"), in place of the
    # draw kernel and the per-row kernel: a greedy row's token from the chunks' maxima and
    # argmaxes, a sampling row's from its draw 0 (which decide would return: the token is x0
    # without a filter), and the logprob
    r = tl.program_id(0)
    row, lrow, mrow_ptr, has_row_mask = row_ptrs(
        r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP
    )
    temp = tl.load(temp_ptr + r)
    k0, k1 = row_keys(tl.load(seed_ptr + r), tl.load(step_ptr + r))
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
        tok, q = row_draw(
            lrow,
            stride_lv,
            mrow_ptr,
            has_row_mask,
            V,
            inv_t,
            ms,
            zs,
            cs,
            float("-inf"),
            tl.full((), 0, tl.uint32),
            k0,
            k1,
            HAS_MASK,
            CHUNK,
        )
    tl.store(tokens_ptr + r, tl.where(empty, -1, tok).to(tl.int64))
    tl.store(empty_ptr + r, empty)
    if RETURN_LOGPROBS:
        tl.store(logprobs_ptr + r, tl.where(empty, float("-inf"), q - m - chunks_log_z(ms, zs)))


@triton.jit
def _split_pass2_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # as sample_rows._sample_kernel
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,  # [B] float32, int64, float32, float32
    pm_ptr,  # [B, S] float32 written by _split_pass1_kernel
    dq_ptr,
    dv_ptr,  # [B, NDRAW] float32, int32 written by _split_draw_kernel
    ps_ptr,  # out: [B, 8, S] float32: mass above q0..q3, count above q0..q3
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    K_ON: tl.constexpr,  # some row has top-k on (else the counts are left out)
    TILE2D: tl.constexpr,  # the tile as [CHUNK / 32, 32] (tile2d), else flat
    PDL: tl.constexpr,  # launched early: waits for the draws, then reads what it needs
):
    # program (row, c): the test pass of decide on tokens [c * CHUNK, (c + 1) * CHUNK) of a
    # sampling row with top-k or top-p on (other rows: nothing), only where the chunk's max is
    # above test_low of the draws' verdicts: a chunk at or below it adds nothing to any mass or
    # count the decision needs, and a row the verdicts decide reads nothing (on a real model's
    # peaked logits, most rows). The tile is read after the draws, so a pass that reads every
    # tile loses the overlap of its first wave with the draws.
    # The tiles are taken last first: top-p 57.7 -> 54.1 us (H200, fp32, B = 128, V = 128,256;
    # no change at B = 512, whose 256 MB of logits leave nothing in L2). TILE2D (2-byte logits)
    # reads the tile as [CHUNK / 32, 32] as pass 1 does: 60.1 -> 57.3 us for bf16 there, but
    # 54.0 -> 61.7 for fp32 (96 against 125 registers, and more instructions a token)
    r, c, row, lrow, mrow_ptr, has_row_mask = chunk_row(
        logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP, True
    )
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
    k_on, cut_p, active = filter_on(top_k, top_p, min_p, V)
    # (one condition: the compiler would wait for the first loads before issuing the others.
    # An empty row has no draws: its max is -inf)
    if (temp != 0) & (k_on | cut_p) & (mc > test_low(q0, q1, q2, q3, v0, v1, v2, v3)):
        if TILE2D:
            x, _local = tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
        else:
            x = load_scores(
                lrow, stride_lv, mrow_ptr, has_row_mask, c * CHUNK + tl.arange(0, CHUNK), V, 1.0, HAS_MASK
            )
        cs = tl.arange(0, SP)
        m = tl.max(tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf")), 0)
        s = x * tl.math.div_rn(1.0, temp)  # as load_scores with inv_t (x * 1.0 is exact)
        sums = tile_sums(s, m, q0, q1, q2, q3, k_on if K_ON else False)
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


# ---------------------------------------------------------------- launches


class SplitCall(NamedTuple):
    """What every split launch of one call shares: the rows, V, S chunks of CHUNK tokens a row
    (SP: the next power of 2 >= S), and whether the launches after pass 1 start early (PDL)."""

    rows: RowArgs
    V: int
    S: int
    chunk: int
    pdl: bool

    @property
    def SP(self) -> int:
        return triton.next_power_of_2(self.S)


def pass1(call: SplitCall, temperature: torch.Tensor, return_logprobs: bool, warps: int,
          top_k: torch.Tensor | None = None, kc: int = 1):  # fmt: skip
    """Pass 1 over (row, chunk) programs -> [B, S] each chunk's max (float32), quanta sum (int64)
    and lowest argmax (int32); with ``top_k`` (some row may have it) also, for its rows with
    top_k <= ``kc`` (``SampleTuning.topk_max``), the maxima of their groups of 32 tokens
    (``sample_topk.group_maxima``) as (maxima [B, S * groups a chunk] float32, [B, 2 * kc] int32 the
    per-row kernel's scratch for the groups and candidates it gathers), else None."""
    B = temperature.shape[0]
    dev = temperature.device
    pm = torch.empty(B, call.S, dtype=torch.float32, device=dev)
    pz = torch.empty(B, call.S, dtype=torch.int64, device=dev)
    pi = torch.empty(B, call.S, dtype=torch.int32, device=dev)
    cand = None
    gm = pm  # placeholder, never read
    if top_k is not None:
        gm = torch.empty(B, call.S * (call.chunk // min(32, call.chunk)), dtype=torch.float32, device=dev)
        cand = (gm, torch.empty(B, 2 * kc, dtype=torch.int32, device=dev))
    _split_pass1_kernel[(B * call.S,)](
        *call.rows.logits, *call.rows.mask, temperature, top_k if top_k is not None else temperature,
        pm, pz, pi, gm, call.V, call.S,
        RETURN_LOGPROBS=return_logprobs, CHUNK=call.chunk, PDL=call.pdl, TOPK=top_k is not None, KC=kc,
        **call.rows.flags, **launch_opts(warps),
    )  # fmt: skip
    return pm, pz, pi, cand


def plain(call: SplitCall, temperature: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
          pass1_results: tuple, out: tuple, return_logprobs: bool, warps: int) -> None:  # fmt: skip
    """No row samples with a filter: one program a row draws (or takes a greedy row's argmax)
    and writes ``out`` = (tokens, empty, logprobs)."""
    B = temperature.shape[0]
    _split_plain_kernel[(B,)](
        *call.rows.logits, *call.rows.mask, temperature, seed, step, *pass1_results, *out, call.V, call.S,
        RETURN_LOGPROBS=return_logprobs, CHUNK=call.chunk, SP=call.SP, PDL=call.pdl, **call.rows.flags,
        **launch_opts(warps), **dependent(call.pdl),
    )  # fmt: skip


def draws(call: SplitCall, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          min_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, pm: torch.Tensor, pz: torch.Tensor,
          warps: int, topk: bool = False):  # fmt: skip
    """The draws over (row, draw) programs -> [B, N_DRAWS] drawn tokens (int32), their scores
    (float32) and verdicts (int32). ``topk``: pass 1 stored the group maxima; rows with top-k are
    left to the per-row kernel (verdicts "kept": the test pass skips them)."""
    B = temperature.shape[0]
    dev = temperature.device
    dx = torch.empty(B, N_DRAWS, dtype=torch.int32, device=dev)
    dq = torch.empty(B, N_DRAWS, dtype=torch.float32, device=dev)
    dv = torch.empty(B, N_DRAWS, dtype=torch.int32, device=dev)
    _split_draw_kernel[(B * N_DRAWS,)](
        *call.rows.logits, *call.rows.mask, temperature, top_k, top_p, min_p, seed, step, pm, pz, dx, dq, dv,
        call.V, call.S, CHUNK=call.chunk, SP=call.SP, PDL=call.pdl, TOPK=topk, **call.rows.flags,
        **launch_opts(warps), **dependent(call.pdl),
    )  # fmt: skip
    return dx, dq, dv


def pass2(call: SplitCall, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          min_p: torch.Tensor, pm: torch.Tensor, dq: torch.Tensor, dv: torch.Tensor, k_on: bool,
          warps: int) -> torch.Tensor:  # fmt: skip
    """The test pass over (row, chunk) programs -> [B, 8, S] float32: each chunk's mass above the
    four draws' scores, then (``k_on``: some row has top-k) its count above them."""
    B = temperature.shape[0]
    logits = call.rows.logits[0]
    ps = torch.empty(B, 8, call.S, dtype=torch.float32, device=logits.device)
    _split_pass2_kernel[(B * call.S,)](
        *call.rows.logits, *call.rows.mask, temperature, top_k, top_p, min_p, pm, dq, dv, ps, call.V, call.S,
        CHUNK=call.chunk, SP=call.SP, K_ON=k_on, TILE2D=logits.element_size() < 4, PDL=call.pdl,
        **call.rows.flags, **launch_opts(warps), **dependent(call.pdl),
    )  # fmt: skip
    return ps
