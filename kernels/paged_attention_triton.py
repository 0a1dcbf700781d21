"""Triton kernel of `paged_attention_triton` (see paged_attention.py for what it computes).

Imported only when that function is called: importing triton is not free, and the CPU path
never needs it. Under TRITON_INTERPRET=1 (set before this import) it runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot of bfloat16 operands gives garbage under the interpreter (triton 3.9): under INTERPRET the
# operands go to float32 first (exact products, float32 sums), on the GPU they stay 16-bit (tensor
# cores)
from .triton_common import INTERPRET


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    bt_ptr,
    seq_ptr,
    pos_ptr,
    W,
    scale,
    window,
    softcap,
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
    G_PAD: tl.constexpr,
    HD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    # one program: query row r, KV head h; its G query heads as a [G_PAD, HD_PAD] block (rows
    # past G are zeros: tl.dot needs 16), scores and values through tl.dot
    r = tl.program_id(0).to(tl.int64)  # (int64: q offsets of a long prefill pass 2**31)
    h = tl.program_id(1)
    n = tl.load(pos_ptr + r).to(tl.int32) + 1  # keys [0, n) of the row's sequence
    seq = tl.load(seq_ptr + r).to(tl.int64)
    table = bt_ptr + seq * stride_bs  # the sequence's block ids: [W]
    gi = tl.arange(0, G_PAD)
    d = tl.arange(0, HD_PAD)
    j = tl.arange(0, BLOCK_N)
    q_mask = (gi[:, None] < G) & (d[None, :] < HD)
    q_off = ((r * NKV + h) * G + gi[:, None]) * HD + d[None, :]  # q, o: contiguous [N, NKV, G, HD]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HD_PAD], tl.float32)
    # fixed blocks from key 0 (with a sliding window: from the block of the window's first key
    # lo) up to the row's own length: nothing else sets the reduction order
    lo = tl.maximum(n - window, 0) if window > 0 else 0
    for start in range((lo // BLOCK_N) * BLOCK_N, n, BLOCK_N):
        cols = start + j  # [BLOCK_N] key positions
        slot = cols // BLOCK_SIZE  # the column's entry of the table (a shift: BLOCK_SIZE is 2**k)
        live = (cols < n) & (cols >= lo) & (slot < W)  # (slot < W: never read past the table row)
        blk = tl.load(table + slot * stride_bw, mask=live, other=0).to(tl.int64)
        within = (cols % BLOCK_SIZE).to(tl.int64)
        kv_mask = live[:, None] & (d[None, :] < HD)
        k_rows = blk * stride_kb + within * stride_kt + h * stride_kh  # [BLOCK_N]
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if SOFTCAP:  # softcap * tanh(s / softcap), tanh(u) = 2 sigmoid(2u) - 1
            s = (2.0 * tl.sigmoid(s * (2.0 * scale / softcap)) - 1.0) * softcap
        else:
            s = s * scale
        s = tl.where(live[None, :], s, float("-inf"))  # [G_PAD, BLOCK_N]
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: the first block holds key lo
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v_rows = blk * stride_vb + within * stride_vt + h * stride_vh
        v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    out = acc / denom[:, None]
    tl.store(o_ptr + q_off, out.to(o_ptr.dtype.element_ty), mask=q_mask)


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    seq_ids: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    block_n: int,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """q, out: contiguous [N, nkv, g, hd]; k_cache, v_cache: [num_blocks, block_size, nkv, hd]
    (last dim contiguous, block_size a power of two); block_tables: [S, W]; seq_ids, positions:
    contiguous [N]; window: a row's last keys it sees (0: all)."""
    N, nkv, g, hd = q.shape
    _paged_attention_kernel[(N, nkv)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_ids,
        positions,
        block_tables.shape[1],
        scale,
        window,
        softcap if softcap else 1.0,
        block_tables.stride(0),
        block_tables.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NKV=nkv,
        G=g,
        HD=hd,
        G_PAD=max(16, triton.next_power_of_2(g)),
        HD_PAD=max(16, triton.next_power_of_2(hd)),
        BLOCK_N=block_n,
        BLOCK_SIZE=k_cache.shape[1],
        IEEE=q.dtype == torch.float32 or INTERPRET,
        SOFTCAP=bool(softcap),
        num_warps=4,
    )
