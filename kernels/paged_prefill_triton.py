"""Triton kernel of `paged_prefill_triton` (see paged_attention.py for what it computes).

Flash-attention style over the paged cache: a program takes BLOCK_M consecutive query tokens of
one sequence and the G query heads they have for one KV head, as one [ROWS, HD_PAD] tile (row
i * G + j: token i, head j; ROWS = BLOCK_M * G rounded up to a power of two >= 16, the extra rows
zeros). It walks the sequence's keys in BLOCK_N blocks, each key's block id read from the table,
so every key block is loaded once for the whole tile; online softmax in float32. Two loops: the
keys every row of the tile sees (before its first query position, no causal mask), then the
blocks up to its last query position, masked per (query position, key position).

Imported only when that function is called: importing triton is not free, and the CPU path
never needs it. Under TRITON_INTERPRET=1 (set before this import) it runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_common import cache_strides, score_scalars, shape_constants
from .paged_common import scaled as _scaled

BLOCK_N = 64  # keys a step


def config(g: int, hd: int, fp32: bool) -> tuple[int, int, int]:
    """(BLOCK_M query tokens a program, ROWS of its tile, num_warps) for g query heads a KV head of
    head_dim hd. 16-bit inputs: BLOCK_M * g about 128 rows for head_dim <= 64, 64 above, so that
    the float32 [ROWS, HD] accumulator and [ROWS, BLOCK_N] scores stay in registers; float32
    inputs (IEEE dots on CUDA cores): about 16 rows. 8 warps for a tile of 128 rows or head_dim
    256, else 4. (Compiled for sm_90 without spills for bf16 head_dim 64-256 and float32 head_dim
    64-128; not timed.)"""
    hd_pad = max(16, triton.next_power_of_2(hd))
    target = 16 if fp32 else 128 if hd_pad <= 64 else 64
    block_m = max(1, target // g)
    rows = max(16, triton.next_power_of_2(block_m * g))
    return block_m, rows, 8 if rows >= 128 or hd_pad >= 256 else 4


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    bt_ptr,
    qs_ptr,
    len_ptr,
    W,
    qk_scale,
    window,
    cap_in,
    cap_out,
    stride_qn,
    stride_qh,
    stride_qg,
    stride_bs,
    stride_bw,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    NKV: tl.constexpr,
    G: tl.constexpr,
    HD: tl.constexpr,
    HD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M  # the tile's first token, counted from the chunk's first
    q_begin = tl.load(qs_ptr + b).to(tl.int64)
    T = (tl.load(qs_ptr + b + 1).to(tl.int64) - q_begin).to(tl.int32)  # the sequence's query rows
    if m0 >= T:  # past the sequence's chunk (T = 0: a sequence without rows)
        return
    n = tl.load(len_ptr + b).to(tl.int32)  # keys [0, n); the chunk is positions n - T .. n - 1
    first = n - T + m0  # the tile's first query position: every row sees keys [0, first]
    hi = tl.minimum(first + BLOCK_M, n)  # keys [0, hi): up to the tile's last query position
    table = bt_ptr + b.to(tl.int64) * stride_bs  # the sequence's block ids: [W]

    r = tl.arange(0, ROWS)
    tok = m0 + r // G  # the row's token (from the chunk's first) and head
    gi = r % G
    row_ok = (r < BLOCK_M * G) & (tok < T)
    qpos = n - T + tok  # the row's query position
    d = tl.arange(0, HD_PAD)
    j = tl.arange(0, BLOCK_N)
    q_mask = row_ok[:, None] & (d[None, :] < HD)
    q_row = (q_begin + tok).to(tl.int64)
    q_off = q_row[:, None] * stride_qn + h * stride_qh + gi[:, None] * stride_qg + d[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    if IEEE:
        q = q.to(tl.float32)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    denom = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HD_PAD], tl.float32)

    # keys every row sees: whole blocks before the tile's first query position (no causal mask;
    # none with a sliding window: the second loop then starts at the window of the first query)
    lo = ((first + 1) // BLOCK_N) * BLOCK_N
    unmasked_end = lo
    if WINDOWED:
        lo = (tl.maximum(first + 1 - window, 0) // BLOCK_N) * BLOCK_N
        unmasked_end = 0
    for start in range(0, unmasked_end, BLOCK_N):
        cols = start + j
        slot = cols // BLOCK_SIZE
        live = slot < W  # (never read past the table row)
        blk = tl.load(table + slot * stride_bw, mask=live, other=0).to(tl.int64)
        within = (cols % BLOCK_SIZE).to(tl.int64)
        kv_mask = live[:, None] & (d[None, :] < HD)
        k = tl.load(k_ptr + (blk * stride_kb + within * stride_kt + h * stride_kh)[:, None] + d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        if IEEE:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(
            live[None, :], _scaled(s, qk_scale, cap_in, cap_out, SOFTCAP), float("-inf")
        )  # [ROWS, BLOCK_N]
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + (blk * stride_vb + within * stride_vt + h * stride_vh)[:, None] + d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new

    # the blocks up to the tile's last query position: key c is seen by rows at positions >= c.
    # Every row sees key lo <= first, so its max is finite after the first of these blocks
    for start in range(lo, hi, BLOCK_N):
        cols = start + j
        slot = cols // BLOCK_SIZE
        live = (cols < hi) & (slot < W)
        if WINDOWED:  # keys before the first row's window: not read (they may be garbage)
            live = live & (cols > first - window)
        blk = tl.load(table + slot * stride_bw, mask=live, other=0).to(tl.int64)
        within = (cols % BLOCK_SIZE).to(tl.int64)
        kv_mask = live[:, None] & (d[None, :] < HD)
        k = tl.load(k_ptr + (blk * stride_kb + within * stride_kt + h * stride_kh)[:, None] + d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        if IEEE:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        seen = live[None, :] & (cols[None, :] <= qpos[:, None])
        if WINDOWED:  # a row may see none of a block before its window: keep its max -inf, its sums 0
            seen = seen & (cols[None, :] > qpos[:, None] - window)
        s = tl.where(seen, _scaled(s, qk_scale, cap_in, cap_out, SOFTCAP), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_ref = m_new
        if WINDOWED:  # (-inf - -inf would be NaN)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + (blk * stride_vb + within * stride_vt + h * stride_vh)[:, None] + d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new

    if WINDOWED:  # (padding rows past the chunk may see no key: not stored, kept finite)
        denom = tl.where(denom == 0.0, 1.0, denom)
    out = acc / denom[:, None]
    o_off = ((q_row[:, None] * NKV + h) * G + gi[:, None]) * HD + d[None, :]  # o: contiguous
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=q_mask)


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    tuning: tuple[int, int, int, int] | None = None,
) -> None:
    """q: [N, nkv, g, hd] (last dim contiguous); out: contiguous [N, nkv, g, hd]; k_cache,
    v_cache: [num_blocks, block_size, nkv, hd] (last dim contiguous, block_size a power of two);
    block_tables: [B', W] (B' >= B); query_start: contiguous [B + 1]; seq_lens: contiguous [B].
    tuning: (tile rows, BLOCK_N, num_warps, num_stages) in place of ``config``'s (for
    benchmarks/bench_attention.py --prefill; None: ``config``, BLOCK_N and Triton's stages)."""
    N, nkv, g, hd = q.shape
    B = seq_lens.shape[0]
    block_m, rows, warps = config(g, hd, q.dtype == torch.float32)
    block_n, opts = BLOCK_N, {}
    if tuning is not None:
        rows, block_n, warps, opts["num_stages"] = tuning
        block_m = max(1, rows // g)
        rows = max(16, triton.next_power_of_2(block_m * g))
    grid = (B, nkv, triton.cdiv(max_query_len, block_m))
    _paged_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        query_start,
        seq_lens,
        block_tables.shape[1],
        *score_scalars(scale, window, softcap),
        *q.stride()[:3],
        *cache_strides(block_tables, k_cache, v_cache),
        **shape_constants(q, k_cache),
        BLOCK_M=block_m,
        ROWS=rows,
        BLOCK_N=block_n,
        WINDOWED=window > 0,
        SOFTCAP=bool(softcap),
        num_warps=warps,
        **opts,
    )
