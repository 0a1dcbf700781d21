"""Triton kernel: DSpark verification of deterministic drafts (see ``verify_reference`` for the
definition and the derivation of the acceptance rule).

Grid (B, K+1): program (b, k) computes the target token of row b at draft position k exactly as
``sample_rows`` does for one row (bitmask, temperature, top-k / top-p / min-p, the draws with
the random numbers of (seed[b], step[b] + k)), stores it, and -- for a draft position whose target token
differs from the draft -- lowers the row's accepted length with an atomic min. The accepted
length starts at num_drafts[b] (every draft matched); the minimum over mismatching positions is
the first mismatch. One launch, no host sync, every position of every row in parallel:

    t = sample(logits[b, k] | mask[b, k], seed[b], step[b] + k)    # target token
    # q = point mass on the draft d: accept with prob. p(d) <=> t == d (one draw);
    # on rejection t ~ p(. | . != d) = the residual norm(max(0, p - q)) -- the bonus token
    if k < n and t != d[b, k]: accepted[b] = min(accepted[b], k)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_reference import chunk_size
from .sample_rows import sample_row
from .triton_common import block_size, helper, launch_opts, load_scores, row_chunks, row_keys, row_map
from .tuning import DEFAULT_TUNING, SampleTuning


@helper
def _target_token(
    lrow,
    stride_lv,
    mrow_ptr,
    has_row_mask,
    V,
    temp,
    top_k,
    top_p,
    min_p,
    seed,
    step,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
):
    # The token sample_rows._sample_kernel picks for one row (same chunks, same draws, same
    # integer sums: the same token whether sample() ran split or not).
    greedy = temp == 0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp)))
    k0, k1 = row_keys(seed, step)
    if greedy:
        arange = tl.arange(0, BLOCK)
        m = float("-inf")
        tok = 0
        for start in range(0, V, BLOCK):
            s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, start + arange, V, inv_t, HAS_MASK)
            bm, bi = tl.max(s, 0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.where(bm > m, start + bi, tok)
            m = tl.maximum(m, bm)
    else:  # pass 1 by chunks, the four draws, then the first kept one, as sample_rows._sample_kernel
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
    return tl.where(empty, -1, tok)


# strides that change with the step's width are not specialised on: one compile serves every
# width (a compile in the middle of a run would cost more than many steps)
@triton.jit(do_not_specialize=["stride_db", "stride_mb", "stride_tb"])
def _verify_kernel(
    logits_ptr,
    stride_lb,
    stride_lt,
    stride_lv,  # [B, K+1, V] fp32 | bf16 | fp16
    drafts_ptr,
    stride_db,
    stride_dk,  # [B, K] int64
    num_drafts_ptr,  # [B] int64, n_b <= K
    mask_ptr,
    stride_mb,
    stride_mt,
    mask_row_ptr,  # [B, K+1, W] int32; [B] int32 (HAS_ROW_MAP)
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,  # [B] float32, int64, float32, float32
    seed_ptr,
    step_ptr,  # [B] int64
    tokens_ptr,
    stride_tb,  # [B, K+1] int64 out: target token per position, -1 past n_b
    accepted_ptr,  # [B] int32 in/out: starts at n_b, atomic-min of mismatching positions
    V,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
):
    b = tl.program_id(0)
    k = tl.program_id(1)
    row = b.to(tl.int64)
    n = tl.load(num_drafts_ptr + b)
    if k <= n:  # positions past this row's drafts have nothing to verify (token -1)
        lrow = logits_ptr + row * stride_lb + k.to(tl.int64) * stride_lt
        mrow_ptr = mask_ptr + row * stride_mb + k.to(tl.int64) * stride_mt
        has_row_mask = True
        if HAS_ROW_MAP:
            has_row_mask = tl.load(mask_row_ptr + b) != 0
        tok = _target_token(
            lrow, stride_lv, mrow_ptr, has_row_mask, V,
            tl.load(temp_ptr + b), tl.load(top_k_ptr + b), tl.load(top_p_ptr + b), tl.load(min_p_ptr + b),
            tl.load(seed_ptr + b), tl.load(step_ptr + b) + k, HAS_MASK, BLOCK, CHUNK, SP,
        )  # fmt: skip
        tl.store(tokens_ptr + row * stride_tb + k, tok.to(tl.int64))
        if k < n:
            d = tl.load(drafts_ptr + row * stride_db + k * stride_dk)
            if tok != d:  # rejected: the accepted prefix ends before position k
                tl.atomic_min(accepted_ptr + b, k)
    else:
        tl.store(tokens_ptr + row * stride_tb + k, tl.full((), -1, tl.int64))


def verify(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    bitmask: torch.Tensor | None,
    indices: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    tuning: SampleTuning = DEFAULT_TUNING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of :func:`verify_reference.verify` (arguments already validated; of
    ``tuning``, the per-row kernel's block and warps and the chunk size)."""
    B, T, V = logits.shape
    dev = logits.device
    tokens = torch.empty((B, T), dtype=torch.int64, device=dev)
    accepted = num_drafts.to(torch.int32).clone()
    if B == 0:
        return accepted.to(torch.int64), tokens[:, 0], tokens
    rows = row_map(B, bitmask, indices, dev)
    d = drafts if drafts.shape[1] else tokens  # K = 0: never read
    chunk = chunk_size(V, tuning.chunk_max)
    _verify_kernel[(B, T)](
        logits, logits.stride(0), logits.stride(1), logits.stride(2),
        d, d.stride(0), d.stride(1),
        num_drafts,
        bitmask if bitmask is not None else tokens,
        bitmask.stride(0) if bitmask is not None else 0, bitmask.stride(1) if bitmask is not None else 0,
        rows if rows is not None else tokens,
        temperature, top_k, top_p, min_p,
        seed, step,
        tokens, tokens.stride(0),
        accepted,
        V,
        HAS_MASK=bitmask is not None, HAS_ROW_MAP=rows is not None, BLOCK=block_size(V, tuning.block_max),
        CHUNK=chunk, SP=triton.next_power_of_2(triton.cdiv(V, chunk)),
        **launch_opts(tuning.num_warps),
    )  # fmt: skip
    accepted = accepted.to(torch.int64)
    bonus = tokens.gather(1, accepted[:, None])[:, 0]
    return accepted, bonus, tokens


__all__ = ["verify"]
