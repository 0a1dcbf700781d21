"""Triton kernel of `decode_attention_triton` (see decode_attention.py for what it computes).

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
def _decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    slots_ptr,
    slot_start,
    scale,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    NKV: tl.constexpr,
    G: tl.constexpr,
    HD: tl.constexpr,
    G_PAD: tl.constexpr,
    HD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    ROW_SLOTS: tl.constexpr,
):
    # one program: batch row b, KV head h; its G query heads as a [G_PAD, HD_PAD] block (rows
    # past G are zeros: tl.dot needs 16), scores and values through tl.dot
    b = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(pos_ptr + b).to(tl.int32) + 1  # keys [0, n) of this row's slot
    gi = tl.arange(0, G_PAD)
    d = tl.arange(0, HD_PAD)
    j = tl.arange(0, BLOCK_N)
    q_mask = (gi[:, None] < G) & (d[None, :] < HD)
    q_off = ((b * NKV + h) * G + gi[:, None]) * HD + d[None, :]  # q, o: contiguous [B, NKV, G, HD]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
    if ROW_SLOTS:  # each row names its slot (prefill: a row per token)
        slot = tl.load(slots_ptr + b).to(tl.int64)
    else:
        slot = (slot_start + b).to(tl.int64)
    k_base = k_ptr + slot * stride_ks + h * stride_kh
    v_base = v_ptr + slot * stride_vs + h * stride_vh
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HD_PAD], tl.float32)
    # fixed blocks from key 0 up to the row's own length: nothing else sets the reduction order
    for start in range(0, n, BLOCK_N):
        cols = start + j
        kv_mask = (cols[:, None] < n) & (d[None, :] < HD)
        k = tl.load(k_base + cols[:, None] * stride_kl + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where((cols < n)[None, :], s * scale, float("-inf"))  # [G_PAD, BLOCK_N]
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: block 0 holds key 0
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vl + d[None, :], mask=kv_mask, other=0.0)
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
    positions: torch.Tensor,
    slot_start: int,
    scale: float,
    block_n: int,
    slots: torch.Tensor | None = None,
) -> None:
    B, nkv, g, hd = q.shape
    _decode_attention_kernel[(B, nkv)](
        q,
        k_cache,
        v_cache,
        out,
        positions,
        positions if slots is None else slots,
        slot_start,
        scale,
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
        IEEE=q.dtype == torch.float32 or INTERPRET,
        ROW_SLOTS=slots is not None,
        num_warps=4,
    )
