"""Triton kernel of `paged_invariant_triton` (see paged_attention.py for what it computes).

A query-tiled paged attention whose every row computes the same bits whatever tile it sits in:
deterministic mode runs it for prefill chunks, decode steps and DSpark's verify forward alike, so
a token's attention output is the same whether it was computed in a prompt chunk of any size, in
a decode step, in a verify forward, alone or beside any other request.

A program takes BLOCK_M consecutive query rows of one sequence and their G query heads of one KV
head as one [ROWS, HD_PAD] tile (row i * G + j: row i, head j; the rows past BLOCK_M * G and past
the sequence's rows are padding). It walks the sequence's keys in absolute BLOCK_N-key blocks
(block c holds keys [c * BLOCK_N, (c + 1) * BLOCK_N)), from the block of the tile's first key to
the block of its last row's position, each key's block id read from the table, so a key block is
loaded once for the whole tile. One update for every block (online softmax, float32):

    s     = where(row sees key, q k * scale, -inf)        # a row's own causal / window mask
    m'    = max(m, max_j s)
    alpha = exp2(m - m') if m' > m else 1                 # exactly 1 when the block adds nothing
    p     = exp2(s - m')                                  # (m' = -inf, no key seen yet: s - 0)
    l'    = l * alpha + sum_j p
    acc'  = acc * alpha + p @ v

With 16-bit inputs the blocks every row of the tile sees whole (below its smallest position,
without a window) run without the mask: for such a row m' is finite, so alpha and p are the
same as masked.
A block in which a row sees no key (past its position, or before its window) leaves that row's
m, l and acc exactly as they were: s = -inf everywhere, so alpha = 1 and p = 0. The blocks a row
does see are the same absolute blocks, in the same order, in any tile; its scores, row max, row
sum and the row of each tl.dot depend on its own query and the block's keys only (BLOCK_N is
fixed; the tile's rows depend on (g, head_dim, dtype) and on whether the call holds long
sequences, whose taller tile (`config`) computes each row as the short one does: never on the
number of rows, their positions or the batch). Keys of the block that the row does not see add
products p = 0 (exact zeros). A zero result keeps no sign (+ 0.0 at the end).

Why one kernel for decode too: another kernel (another tile shape, another tl.dot instruction)
may round a row differently, so deterministic decode runs this one with a single row in the tile.

Imported only when that function is called: importing triton is not free, and the CPU path never
needs it. Under TRITON_INTERPRET=1 (set before this import) it runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_common import cache_strides, score_scalars, shape_constants
from .paged_common import scaled as _scaled

# numpy's matmul behind the interpreter's tl.dot may round a row differently by its place in the
# tile (invariant_triton.py): under INTERPRET each product is summed in order instead (ROW_SUMS)
from .triton_common import INTERPRET

BLOCK_N = 64  # keys a step in every call: where a row's online softmax steps
LONG_ROWS = 64  # query rows of a sequence from which a call takes the tall tile (`config`)


def config(g: int, hd: int, fp32: bool, long: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M query rows a program, ROWS of its tile, num_warps, num_stages) for g query heads
    a KV head of head_dim hd. 16-bit inputs: a tile of 64 rows (one warpgroup's
    tensor-core tile on Hopper; a decode row fills g of them), 4 warps (8 for head_dim 256); a
    call with ``long`` sequences (LONG_ROWS query rows or more) takes a tile of 256 rows and 8
    warps, the fastest at long prompts of the tilings tried on an H200 (446 TFLOP/s at 32k tokens
    at Llama-3-8B's shape, against 369 for 64 rows). A row sits in one warp either way, summed by
    the same instructions in the same order: the GPU tests check its bits across the two.
    float32 inputs (IEEE dots on CUDA cores): 16 rows."""
    hd_pad = max(16, triton.next_power_of_2(hd))
    target = 16 if fp32 else 64
    rows = target if g <= target else triton.next_power_of_2(g)
    if long and not fp32 and not INTERPRET and hd_pad <= 128 and rows == 64:
        return 256 // g, 256, 8, 3
    return rows // g, rows, 8 if hd_pad >= 256 else 4, 3


@triton.jit
def _block(
    acc,
    m,
    denom,
    q,
    cols,
    d,
    table,
    stride_bw,
    W,
    lo,
    hi,
    n_r,
    lo_r,
    k_base,
    v_base,
    stride_kb,
    stride_kt,
    stride_vb,
    stride_vt,
    qk_scale,
    cap_in,
    cap_out,
    HD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IEEE: tl.constexpr,
    ROW_SUMS: tl.constexpr,
    MASKED: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One key block (key positions ``cols``) into a tile's (acc, m, denom); ``k_base``,
    ``v_base``: the caches at the tile's KV head. MASKED=False: a block every row of the tile
    sees whole, read and scored without masks (for such a row the masked step's arithmetic
    exactly: its m_new is finite, so its alpha and p are the same). Not for float32 inputs: their
    IEEE dots, compiled in two loops, need not round alike."""
    slot = cols // BLOCK_SIZE  # the column's entry of the table (a shift: BLOCK_SIZE is 2**k)
    within = (cols % BLOCK_SIZE).to(tl.int64)
    if MASKED:
        live = (cols < hi) & (cols >= lo) & (slot < W)  # (slot < W: never read past the table row)
    else:
        live = cols >= 0
    blk = tl.load(table + slot * stride_bw, mask=live, other=0).to(tl.int64)
    kv_mask = live[:, None] & (d[None, :] < HD)
    k = tl.load(
        k_base + (blk * stride_kb + within * stride_kt)[:, None] + d[None, :], mask=kv_mask, other=0.0
    )
    if ROW_SUMS:  # the interpreter: each product summed in order (a BLAS gemm may not)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    elif IEEE:
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = _scaled(s, qk_scale, cap_in, cap_out, SOFTCAP)
    if MASKED:
        seen = live[None, :] & (cols[None, :] < n_r[:, None])  # [ROWS, BLOCK_N]: the row's own keys
        if WINDOWED:
            seen = seen & (cols[None, :] >= lo_r[:, None])
        s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    if MASKED:
        # a row that sees no key of this block: m_new = m, so alpha = 1 and p = 0 (an exact no-op);
        # one that has seen none yet: m_new = -inf, any finite reference gives p = 0
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new  # (finite: every row sees keys here; a padding row's scores are 0)
    alpha = tl.where(m_new > m, tl.exp2(m - m_ref), 1.0)
    p = tl.exp2(s - m_ref[:, None])
    denom = denom * alpha + tl.sum(p, axis=1)
    v = tl.load(
        v_base + (blk * stride_vb + within * stride_vt)[:, None] + d[None, :], mask=kv_mask, other=0.0
    )
    if ROW_SUMS:
        pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    elif IEEE:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return acc * alpha[:, None] + pv, m_new, denom


@triton.jit
def _paged_invariant_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    bt_ptr,
    qs_ptr,
    pos_ptr,
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
    ROW_SUMS: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    # axis 0: the query tiles of one (KV head, sequence), the longest (last) first, so that the
    # programs reading the same keys run together and the costliest ones start first
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the tile's first row in its sequence
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_begin = tl.load(qs_ptr + b).to(tl.int64)
    T = (tl.load(qs_ptr + b + 1).to(tl.int64) - q_begin).to(tl.int32)  # the sequence's query rows
    if m0 >= T:  # past the sequence's rows (T = 0: a sequence without rows)
        return
    table = bt_ptr + b.to(tl.int64) * stride_bs  # the sequence's block ids: [W]

    r = tl.arange(0, ROWS)
    tok = m0 + r // G  # the row's index in the sequence's rows, and its head
    gi = r % G
    row_ok = (r < BLOCK_M * G) & (tok < T)
    q_row = q_begin + tok  # (int64: offsets of a long prefill pass 2**31)
    pos = tl.load(pos_ptr + q_row, mask=row_ok, other=-1).to(tl.int32)
    n_r = pos + 1  # the row sees keys [lo_r, n_r); a padding row none
    lo_r = tl.zeros([ROWS], tl.int32)
    if WINDOWED:
        lo_r = tl.maximum(n_r - window, 0)
    hi = tl.max(n_r, axis=0)  # the tile's keys: [lo, hi)
    lo = tl.min(tl.where(row_ok, lo_r, hi), axis=0)

    d = tl.arange(0, HD_PAD)
    j = tl.arange(0, BLOCK_N)
    q_mask = row_ok[:, None] & (d[None, :] < HD)
    q_off = q_row[:, None] * stride_qn + h * stride_qh + gi[:, None] * stride_qg + d[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    if IEEE:
        q = q.to(tl.float32)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    denom = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HD_PAD], tl.float32)

    k_base = k_ptr + h * stride_kh  # (the caches at this KV head)
    v_base = v_ptr + h * stride_vh
    if WINDOWED or IEEE:  # the rows' windows start apart; float32: every block masked
        for start in range((lo // BLOCK_N) * BLOCK_N, hi, BLOCK_N):
            acc, m, denom = _block(acc, m, denom, q, start + j, d, table, stride_bw, W, lo, hi, n_r, lo_r,
                                   k_base, v_base, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                   cap_in, cap_out, HD, BLOCK_SIZE, IEEE, ROW_SUMS, True, WINDOWED,
                                   SOFTCAP)  # fmt: skip
    else:
        # the blocks every row of the tile sees whole (keys [0, full)) take no mask: the same
        # scores, maxima and sums as masked (padding rows' results are never stored), then the
        # blocks up to the rows' own positions, masked
        full = (tl.min(tl.where(row_ok, n_r, hi), axis=0) // BLOCK_N) * BLOCK_N
        for start in range(0, full, BLOCK_N):
            acc, m, denom = _block(acc, m, denom, q, start + j, d, table, stride_bw, W, lo, hi, n_r, lo_r,
                                   k_base, v_base, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                   cap_in, cap_out, HD, BLOCK_SIZE, IEEE, ROW_SUMS, False, False,
                                   SOFTCAP)  # fmt: skip
        for start in range(full, hi, BLOCK_N):
            acc, m, denom = _block(acc, m, denom, q, start + j, d, table, stride_bw, W, lo, hi, n_r, lo_r,
                                   k_base, v_base, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                   cap_in, cap_out, HD, BLOCK_SIZE, IEEE, ROW_SUMS, True, False,
                                   SOFTCAP)  # fmt: skip

    denom = tl.where(denom == 0.0, 1.0, denom)  # (padding rows saw no key; they are not stored)
    out = acc / denom[:, None] + 0.0  # + 0.0: a zero result is +0 in every tile
    o_off = ((q_row[:, None] * NKV + h) * G + gi[:, None]) * HD + d[None, :]  # o: contiguous
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=q_mask)


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    positions: torch.Tensor,
    max_query_len: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """q: [N, nkv, g, hd] (last dim contiguous); out: contiguous [N, nkv, g, hd]; k_cache,
    v_cache: [num_blocks, block_size, nkv, hd] (last dim contiguous, block_size a power of two);
    block_tables: [B', W] (B' >= B); query_start: contiguous [B + 1]; positions: contiguous [N]."""
    N, nkv, g, hd = q.shape
    B = query_start.shape[0] - 1
    block_m, rows, warps, stages = config(g, hd, q.dtype == torch.float32, max_query_len >= LONG_ROWS)
    grid = (triton.cdiv(max_query_len, block_m), nkv, B)
    _paged_invariant_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        query_start,
        positions,
        block_tables.shape[1],
        *score_scalars(scale, window, softcap),
        *q.stride()[:3],
        *cache_strides(block_tables, k_cache, v_cache),
        **shape_constants(q, k_cache),
        BLOCK_M=block_m,
        ROWS=rows,
        BLOCK_N=BLOCK_N,
        ROW_SUMS=INTERPRET,
        WINDOWED=window > 0,
        SOFTCAP=bool(softcap),
        num_warps=warps,
        num_stages=stages,
    )
