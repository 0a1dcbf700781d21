"""The per-row sampling kernel: one program a row.

Without the split (V is one chunk, or ``SampleTuning.split == "never"``) ``_sample_kernel`` runs
every pass itself, looping over the row: greedy in one pass (the max and its lowest index),
sampling as pass 1 by chunks, the four draws (a tile each), then the first kept one
(``sample_filters.decide``, the test pass in the loop). After the split passes
(``sample_split``) it adds their per-chunk results in chunk order and decides. ``sample_row``
is also the DSpark verify kernel's target token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_filters import decide, filter_on
from .sample_topk import row_topk_low, topk_row
from .triton_common import (
    NDRAW,
    RowArgs,
    block_size,
    chunks_log_z,
    dependent,
    gdc_wait,
    helper,
    launch_opts,
    load_scores,
    row_chunks,
    row_draw,
    row_draws,
    row_keys,
    row_ptrs,
)
from .tuning import SMALL_ROWS, SampleTuning


@helper
def sample_row(
    lrow,
    stride_lv,
    mrow_ptr,
    has_row_mask,
    V,
    inv_t,
    ms,
    zs,
    cs,
    m,
    top_k,
    top_p,
    min_p,
    k0,
    k1,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
):
    # a sampling row in one program, after its pass 1 by chunks (row_chunks): the four draws
    # (a tile each; with top-k, above the k-th largest score: sample_topk), then the first kept
    # one (decide, test pass in the loop)
    ninf = float("-inf")
    j0 = tl.full((), 0, tl.uint32)
    k_on, cut_p, active = filter_on(top_k, top_p, min_p, V)
    if k_on:
        low = row_topk_low(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, top_k, HAS_MASK, BLOCK)
        dms, dzs, _cs = row_chunks(
            lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, low, ms, HAS_MASK, CHUNK, SP
        )
        x0, x1, x2, x3, q0, q1, q2, q3 = row_draws(
            lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, dms, dzs, cs, low, j0, k0, k1, HAS_MASK, CHUNK
        )
    elif active:
        x0, x1, x2, x3, q0, q1, q2, q3 = row_draws(
            lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, ninf, j0, k0, k1, HAS_MASK, CHUNK
        )
    else:  # the token is x0 (decide)
        x0, q0 = row_draw(
            lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, ninf, j0, k0, k1, HAS_MASK, CHUNK
        )
        x1 = x0
        x2 = x0
        x3 = x0
        q1 = q0
        q2 = q0
        q3 = q0
    return decide(
        x0,
        x1,
        x2,
        x3,
        q0,
        q1,
        q2,
        q3,
        0,
        0,
        0,
        0,
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
        lrow,
        1,
        ms,
        zs,
        HAS_MASK,
        BLOCK,
        CHUNK,
        False,
        False,
        SP,
    )


@triton.jit
def _sample_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V] fp32 | bf16 | fp16
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # [B, W] int32; [B] int32 (HAS_ROW_MAP): 1 = row is masked
    temp_ptr,  # [B] float32
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,  # [B] int64, float32, float32
    seed_ptr,
    step_ptr,  # [B] int64
    tokens_ptr,
    empty_ptr,
    logprobs_ptr,  # [B] int64, bool, float32
    pm_ptr,
    pz_ptr,
    pi_ptr,  # SPLIT: [B, S] float32, int64, int32 written by _split_pass1_kernel
    dx_ptr,
    dq_ptr,
    dv_ptr,  # SPLIT: [B, NDRAW] drawn tokens, scores, verdicts (_split_draw_kernel)
    ps_ptr,  # SPLIT2: [B, 8, S] float32 written by _split_pass2_kernel
    gm_ptr,  # TOPK: [B, S * CHUNK / G] float32 the groups' maxima (pass 1)
    gid_ptr,  # TOPK: [B, 2 * KC] int32 scratch (sample_topk.topk_row)
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,  # pass 1 and the draws ran over (row, chunk) programs: combine them
    SPLIT2: tl.constexpr,  # (with SPLIT) the test pass too
    SP: tl.constexpr,  # next power of 2 >= S
    PDL: tl.constexpr,  # (SPLIT) launched early: wait for the split passes before their results
    TOPK: tl.constexpr,  # (SPLIT) pass 1 stored the groups' maxima: top-k rows draw from their top groups
    KC: tl.constexpr,  # SampleTuning.topk_max
):
    pid = tl.program_id(0)
    row, lrow, mrow_ptr, has_row_mask = row_ptrs(
        pid, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP
    )
    temp = tl.load(temp_ptr + pid)
    greedy = temp == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp)))  # IEEE, as torch
    k0, k1 = row_keys(tl.load(seed_ptr + pid), tl.load(step_ptr + pid))
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
            log_z = chunks_log_z(ms, zs)
        k_on = (top_k > 0) & (top_k < V) & TOPK
        if greedy:  # the first chunk holding the max, its lowest argmax: the row's lowest argmax
            tok = tl.sum(tl.where(cs == bc, idxs, 0), 0)
        elif k_on & (m > float("-inf")):  # top-k: from the row's top groups, else by the row itself
            tok = 0
            done = top_k < 0  # (False)
            if top_k <= KC:
                tok, done = topk_row(gm_ptr, row, gid_ptr + row * 2 * KC, lrow, stride_lv, mrow_ptr,
                                     has_row_mask, V, inv_t, pm_ptr + row * S, S, ms, zs, m, top_k, top_p,
                                     min_p, k0, k1, HAS_MASK, CHUNK, KC, SP)  # fmt: skip
            if done == 0:
                tok = sample_row(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, m, top_k,
                                 top_p, min_p, k0, k1, HAS_MASK, BLOCK, CHUNK, SP)  # fmt: skip
        else:  # the draws' tokens, scores and verdicts load with the chunks' results (an empty row's: unused)
            # (cast: an all-greedy call passes placeholders of another type, never read)
            dx = dx_ptr + row * NDRAW
            dq = dq_ptr + row * NDRAW
            dv = dv_ptr + row * NDRAW
            tok = decide(
                tl.load(dx).to(tl.int32),
                tl.load(dx + 1).to(tl.int32),
                tl.load(dx + 2).to(tl.int32),
                tl.load(dx + 3).to(tl.int32),
                tl.load(dq).to(tl.float32),
                tl.load(dq + 1).to(tl.float32),
                tl.load(dq + 2).to(tl.float32),
                tl.load(dq + 3).to(tl.float32),
                tl.load(dv).to(tl.int32),
                tl.load(dv + 1).to(tl.int32),
                tl.load(dv + 2).to(tl.int32),
                tl.load(dv + 3).to(tl.int32),
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
                ps_ptr + row * 8 * S,
                S,
                ms,
                zs,
                HAS_MASK,
                BLOCK,
                CHUNK,
                True,
                SPLIT2,
                SP,
            )
    elif greedy:  # one pass: m = max(s) and its lowest argmax
        arange = tl.arange(0, BLOCK)
        m = float("-inf")
        tok = 0
        z = 0.0
        for start in range(0, V, BLOCK):
            s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
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
        ms, zs, cs = row_chunks(
            lrow,
            stride_lv,
            mrow_ptr,
            has_row_mask,
            V,
            inv_t,
            float("-inf"),
            float("inf"),
            HAS_MASK,
            CHUNK,
            SP,
        )
        m = tl.max(ms, 0)
        if RETURN_LOGPROBS:
            log_z = chunks_log_z(ms, zs)
        if m > float("-inf"):
            tok = sample_row(
                lrow,
                stride_lv,
                mrow_ptr,
                has_row_mask,
                V,
                inv_t,
                ms,
                zs,
                cs,
                m,
                top_k,
                top_p,
                min_p,
                k0,
                k1,
                HAS_MASK,
                BLOCK,
                CHUNK,
                SP,
            )
    empty = m == float("-inf")

    tok = tl.where(empty, -1, tok)
    tl.store(tokens_ptr + pid, tok.to(tl.int64))
    tl.store(empty_ptr + pid, empty)
    if RETURN_LOGPROBS:
        st = tl.load(lrow + tl.maximum(tok, 0).to(tl.int64) * stride_lv).to(tl.float32) * inv_t
        lp = tl.where(empty, float("-inf"), st - m - log_z)
        tl.store(logprobs_ptr + pid, lp)


def launch(rows: RowArgs, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, out: tuple, split_results: tuple,
           V: int, S: int, chunk: int, return_logprobs: bool, split: bool, split2: bool, pdl: bool,
           tuning: SampleTuning, topk: bool = False, kc: int | None = None) -> None:  # fmt: skip
    """``_sample_kernel`` over the B rows: ``out`` = (tokens, empty, logprobs) [B];
    ``split_results`` = (pm, pz, pi, dx, dq, dv, ps, gm, gid), what the split passes wrote
    (placeholders where they did not run; ``topk``: pass 1 stored the groups' maxima gm, and
    gid is the top-k rows' scratch); ``kc``: the groups a top-k row gathers (None: ``topk_max``)."""
    B = rows.logits[0].shape[0]
    warps = tuning.num_warps
    if topk:
        warps = tuning.topk_small_warps if B <= SMALL_ROWS else tuning.topk_warps
    _sample_kernel[(B,)](
        *rows.logits,
        *rows.mask,
        temperature,
        top_k, top_p, min_p,
        seed, step,
        *out,
        *split_results,
        V, S,
        RETURN_LOGPROBS=return_logprobs, BLOCK=block_size(V, tuning.block_max), CHUNK=chunk,
        SPLIT=split, SPLIT2=split2, SP=triton.next_power_of_2(S), PDL=pdl, TOPK=topk,
        KC=tuning.topk_max if kc is None else kc,
        **rows.flags,
        **launch_opts(warps), **dependent(pdl),
    )  # fmt: skip
