"""Triton kernels: bitmask apply, and the fused mask + temperature + top-k/top-p/min-p + sampling.

One launch, grid (B, S): program (b, c) reads chunk c (``CHUNK`` tokens) of row b once and
writes its partial result (max score, best key and its token); the last of the row's S
programs to finish (an atomic counter) combines the S partials in chunk order and, for rows
with an active filter, runs the filter rounds over the row. Tiles depend on V only and the
combine order is fixed, so a row's result depends only on that row (batch invariance).

Sampling is the Gumbel-max trick with counter-based noise (``reference.uniform_noise``, the
same 32-bit integer hash in both backends): token = argmax over the kept set of ``s_i + g_i``.
The kept set is ``{i : s_i >= tau}`` for an unknown threshold tau (top-k, top-p and min-p
are all thresholds on the score s), found without sorting by testing candidates at a few
pivots per pass (a multi-pivot form of FlashInfer's dual-pivot rejection sampling)::

    pass 0: m = max(s), c = argmax_i (s_i + g_i)                 # the sample if nothing is cut
    round:  pivots q_0 = s_c < q_1 < ... < q_{P-1} in [s_c, high)  # high: a score known kept
            one pass: count and mass above each q_j, and argmax of s+g above each q_j
            no q_j cut   -> token = c         # c is kept, hence the argmax over the kept set
            q_J highest cut -> c = argmax above q_J, high = q_{J+1}

Every candidate is the Gumbel argmax of an upper set that contains the kept set, so the first
one that is kept is the argmax over the kept set: the same token as the reference. The
candidate's score rises strictly each round and [s_c, high) shrinks P-fold, so rounds are few.
No host synchronisation, no sort, one launch (plus a zeroed counter).
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


@_helper
def _propose(
    lrow, stride_lv, mrow_ptr, has_row_mask, lo, hi, V, inv_t, k0, k1, low,
    HAS_MASK: tl.constexpr, WITH_Z: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # tokens [lo, hi) -> (argmax of s + g over {s > low}, that max, max(s), sum(exp(s - max s)) if WITH_Z)
    arange = tl.arange(0, BLOCK)
    m = float("-inf")
    best_key = float("-inf")
    tok = 0
    z = 0.0
    for start in range(lo, hi, BLOCK):
        offs = start + arange
        s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
        bm = tl.max(s, 0)
        s_up = tl.where(s > low, s, float("-inf"))
        # max over u of -ln2 * log2(-log2(u)) is 16.3 (u = 1 - 2**-24): a block whose best score
        # plus 17 cannot beat the best key so far needs no noise (rounding is monotone)
        if tl.max(s_up, 0) + 17.0 > best_key:
            key = s_up + _gumbel(offs, k0, k1)
            bk, bi = tl.max(key, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.where(bk > best_key, start + bi, tok)
            best_key = tl.maximum(best_key, bk)
        if WITH_Z:
            new_m = tl.maximum(m, bm)
            safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
            z = z * tl.exp(m - safe_m) + tl.sum(tl.exp(s - safe_m), 0)
        m = tl.maximum(m, bm)
    return tok, best_key, m, z


# fmt: off
@triton.jit
def _sample_kernel(
    logits_ptr, stride_lb, stride_lv,  # [B, V] fp32 | bf16 | fp16
    mask_ptr, stride_mb, mask_row_ptr,  # [B, W] int32; [B] int32 (HAS_ROW_MAP): 1 = row is masked
    temp_ptr,  # [B] float32
    top_k_ptr, top_p_ptr, min_p_ptr,  # [B] int64, float32, float32
    seed_ptr, step_ptr,  # [B] int64
    tokens_ptr, empty_ptr, logprobs_ptr,  # [B] int64, bool, float32
    part_key_ptr, part_idx_ptr, part_m_ptr, part_z_ptr,  # [B, S] per-chunk results
    count_ptr,  # [B] int32 zeros: chunks of the row done
    V, S,  # vocabulary size, chunks per row
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    CHUNK: tl.constexpr,  # tokens per program in pass 0
    BLOCK: tl.constexpr,  # tokens per step in pass 0
    RBLOCK: tl.constexpr,  # tokens per step in the filter rounds
    NPIV: tl.constexpr,  # pivots tested per round
    SP: tl.constexpr,  # next power of 2 >= S
):
    # fmt: on
    # grid (B, S): program (b, c) runs pass 0 on chunk c of row b; the last of the row's S
    # programs to finish combines the chunks and runs the filter rounds for the row.
    pid = tl.program_id(0)
    chunk = tl.program_id(1)
    row = pid.to(tl.int64)
    lrow = logits_ptr + row * stride_lb
    mrow_ptr = mask_ptr + row * stride_mb
    has_row_mask = True
    if HAS_ROW_MAP:
        has_row_mask = tl.load(mask_row_ptr + pid) != 0
    temp = tl.load(temp_ptr + pid)
    greedy = temp == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp)))  # IEEE, as torch
    k0, k1 = _row_keys(tl.load(seed_ptr + pid), tl.load(step_ptr + pid))
    arange = tl.arange(0, BLOCK)
    cstart = chunk * CHUNK

    # pass 0 on this chunk: m = max(s); key = max(s) (greedy) or max(s + g) (sampling), its index
    if greedy:
        m = float("-inf")
        tok = 0
        z = 0.0
        for start in range(cstart, cstart + CHUNK, BLOCK):
            s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            bm, bi = tl.max(s, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.where(bm > m, start + bi, tok)
            if RETURN_LOGPROBS:
                new_m = tl.maximum(m, bm)
                safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
                z = z * tl.exp(m - safe_m) + tl.sum(tl.exp(s - safe_m), 0)
            m = tl.maximum(m, bm)
        key = m
    else:
        tok, key, m, z = _propose(
            lrow, stride_lv, mrow_ptr, has_row_mask, cstart, cstart + CHUNK, V, inv_t, k0, k1,
            float("-inf"), HAS_MASK, RETURN_LOGPROBS, BLOCK,
        )  # fmt: skip
    part = row * S + chunk
    tl.store(part_key_ptr + part, key)
    tl.store(part_idx_ptr + part, tok)
    tl.store(part_m_ptr + part, m)
    if RETURN_LOGPROBS:
        tl.store(part_z_ptr + part, z)
    tl.debug_barrier()
    done = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel")  # releases the stores above
    if done == S - 1:
        # combine the chunks in chunk order (deterministic; lowest id on ties)
        c = tl.arange(0, SP)
        cmask = c < S
        pbase = row * S
        keys = tl.load(part_key_ptr + pbase + c, mask=cmask, other=float("-inf"), volatile=True)
        idxs = tl.load(part_idx_ptr + pbase + c, mask=cmask, other=0, volatile=True)
        ms = tl.load(part_m_ptr + pbase + c, mask=cmask, other=float("-inf"), volatile=True)
        _bk, bc = tl.max(keys, 0, return_indices=True, return_indices_tie_break_left=True)
        tok = tl.sum(tl.where(c == bc, idxs, 0), 0)
        m = tl.max(ms, 0)
        empty = m == float("-inf")
        z = 0.0
        if RETURN_LOGPROBS:
            zs = tl.load(part_z_ptr + pbase + c, mask=cmask, other=0.0, volatile=True)
            safe_m = tl.where(empty, 0.0, m)
            z = tl.sum(tl.where(ms == float("-inf"), 0.0, zs * tl.exp(ms - safe_m)), 0)

        # filter rounds: test the candidate against top-k / top-p / min-p at NPIV pivots in
        # [s_c, high); the same pass proposes the next candidate above each pivot
        top_k = tl.load(top_k_ptr + pid)
        top_p = tl.load(top_p_ptr + pid)
        min_p = tl.load(min_p_ptr + pid)
        kmax = tl.where(top_k > 0, top_k, 2147483647)
        p_cut = tl.where(top_p < 1.0, top_p, float("inf"))  # top_p == 1 cuts nothing (zz >= 1)
        active = ((top_k > 0) & (top_k < V)) | (top_p < 1.0) | (min_p > 0.0)
        searching = active & (greedy == 0) & (empty == 0)
        high = m  # a score known to be kept
        j = tl.arange(0, NPIV)
        rarange = tl.arange(0, RBLOCK)
        while searching:
            sc = tl.load(lrow + tok.to(tl.int64) * stride_lv).to(tl.float32) * inv_t
            piv = sc + (high - sc) * (j.to(tl.float32) * (1.0 / NPIV))  # [NPIV], piv[0] = s_c
            zz = 0.0
            cnt = tl.zeros([NPIV], dtype=tl.int32)
            mass = tl.zeros([NPIV], dtype=tl.float32)
            bkey = tl.full([NPIV], float("-inf"), dtype=tl.float32)
            bidx = tl.zeros([NPIV], dtype=tl.int32)
            for start in range(0, V, RBLOCK):
                offs = start + rarange
                s = _load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
                e = tl.exp(s - m)
                above = s[:, None] > piv[None, :]  # [RBLOCK, NPIV]
                zz += tl.sum(e, 0)
                cnt += tl.sum(above.to(tl.int32), 0)
                mass += tl.sum(tl.where(above, e[:, None], 0.0), 0)
                bm = tl.max(s, 0)
                if tl.max(((bm > piv) & (bm + 17.0 > bkey)).to(tl.int32), 0) != 0:
                    rkey = tl.where(above, (s + _gumbel(offs, k0, k1))[:, None], float("-inf"))
                    rk, ri = tl.max(rkey, 0, return_indices=True, return_indices_tie_break_left=True)
                    bidx = tl.where(rk > bkey, start + ri, bidx)
                    bkey = tl.maximum(bkey, rk)
            # cut: a token scoring exactly piv would be filtered out (piv < threshold); monotone in j
            cut = (cnt >= kmax) | (mass >= p_cut * zz) | (tl.exp(piv - m) < min_p)
            ncut = tl.sum(cut.to(tl.int32), 0)
            # ncut == 0: the candidate is kept, hence the argmax over the kept set
            tok = tl.where(ncut > 0, tl.sum(tl.where(j == ncut - 1, bidx, 0), 0), tok)
            high = tl.where(ncut < NPIV, tl.sum(tl.where(j == ncut, piv, 0.0), 0), high)
            searching = ncut > 0

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


# tuning knobs (benchmarks/bench_sampling.py --sweep sets them); all depend on V only
CHUNK_MAX = 16384  # tokens per program in pass 0
BLOCK_MAX = 4096  # tokens per step in pass 0
RBLOCK_MAX = 2048  # tokens per step in the filter rounds
NPIV = 4  # pivots per filter round
NUM_WARPS = 8


def _tiles(V: int) -> tuple[int, int, int]:
    chunk = min(CHUNK_MAX, triton.next_power_of_2(V))
    return chunk, min(BLOCK_MAX, chunk), min(RBLOCK_MAX, triton.next_power_of_2(V))


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
    top_k / seed / step int64 (``deepinfer.kernels.sample`` prepares them); one launch, plus
    one small scatter when ``indices`` is given.
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
    chunk, block, rblock = _tiles(V)
    S = triton.cdiv(V, chunk)
    part_key = torch.empty(B, S, dtype=torch.float32, device=dev)
    part_idx = torch.empty(B, S, dtype=torch.int32, device=dev)
    part_m = torch.empty(B, S, dtype=torch.float32, device=dev)
    part_z = torch.empty(B, S, dtype=torch.float32, device=dev) if return_logprobs else part_m
    count = torch.zeros(B, dtype=torch.int32, device=dev)
    _sample_kernel[(B, S)](
        logits, logits.stride(0), logits.stride(1),
        bitmask if bitmask is not None else tokens, bitmask.stride(0) if bitmask is not None else 0,
        row_map if row_map is not None else tokens,
        temperature,
        top_k, top_p, min_p,
        seed, step,
        tokens, empty, logprobs,
        part_key, part_idx, part_m, part_z,
        count,
        V, S,
        HAS_MASK=bitmask is not None, HAS_ROW_MAP=row_map is not None, RETURN_LOGPROBS=return_logprobs,
        CHUNK=chunk, BLOCK=block, RBLOCK=rblock, NPIV=NPIV, SP=triton.next_power_of_2(S),
        **_launch_opts(),
    )  # fmt: skip
    return tokens, empty, (logprobs if return_logprobs else None)


__all__ = ["apply_bitmask_", "sample", "reference"]
