"""Triton grouped matmul of `moe_experts_triton` (see moe_experts.py for what it computes).

The N * k (token, slot) pairs are grouped by expert on the device (a stable argsort and a
count by index_add: no host sync), and each expert's rows padded to whole tiles of BLOCK_M: the padded
tiles of expert e start at ``tile_start[e] = sum_{e' < e} ceil(count[e'] / BLOCK_M)``. The grid
covers the most tiles any routing can need, ``cdiv(N k + E (BLOCK_M - 1), BLOCK_M)``; a program
finds its expert by a search of the tile starts (torch.searchsorted, on the device) and exits when
past the last. Two launches:

1. gate_up: a [BLOCK_M, BLOCK_N] tile of gate and the matching one of up (columns j and I + j of
   the expert's [H, 2I] matrix), the pairs' token rows gathered from x; the GLU of the two
   stored at the pairs' rows of ``act`` [N k, I].
2. down: ``act`` rows @ the expert's [I, H], times the pair's router weight, stored at the pair's
   row of ``out_pairs`` [N k, H]; the k slots of a token are summed in torch (a fixed order: no
   atomics, the same bits run to run).

Imported only when that function is called. Under TRITON_INTERPRET=1 (set before this import) it
runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import INTERPRET


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), tanh(u) = 2 sigmoid(2u) - 1
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * u)


@triton.jit
def _tile_rows(
    tile_expert_ptr, tile_start_ptr, count_ptr, pair_start_ptr, order_ptr, t, E, BLOCK_M: tl.constexpr
):
    """(expert, rows' pair indices [BLOCK_M], valid [BLOCK_M]) of tile t (expert >= E: none)."""
    e = tl.load(tile_expert_ptr + t)
    e_safe = tl.minimum(e, E - 1)
    local = (t - tl.load(tile_start_ptr + e_safe)) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = local < tl.load(count_ptr + e_safe)
    pair = tl.load(order_ptr + tl.load(pair_start_ptr + e_safe) + local, mask=valid, other=0)
    return e_safe.to(tl.int64), pair.to(tl.int64), valid


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, act_ptr, tile_expert_ptr, tile_start_ptr, count_ptr, pair_start_ptr, order_ptr,
    E, H, I, stride_we, stride_wh,
    K: tl.constexpr, GELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    if tl.load(tile_expert_ptr + t) >= E:
        return
    e, pair, valid = _tile_rows(tile_expert_ptr, tile_start_ptr, count_ptr, pair_start_ptr, order_ptr, t, E,
                                BLOCK_M)  # fmt: skip
    token = pair // K
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < I
    kk = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + e * stride_we
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + kk
        k_ok = ks < H
        a = tl.load(x_ptr + token[:, None] * H + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w_off = ks[:, None] * stride_wh + cols[None, :]
        w_mask = k_ok[:, None] & col_ok[None, :]
        wg = tl.load(w_base + w_off, mask=w_mask, other=0.0)
        wu = tl.load(w_base + w_off + I, mask=w_mask, other=0.0)
        if IEEE:
            a32 = a.to(tl.float32)
            acc_g += tl.dot(a32, wg.to(tl.float32), input_precision="ieee")
            acc_u += tl.dot(a32, wu.to(tl.float32), input_precision="ieee")
        else:
            acc_g += tl.dot(a, wg)
            acc_u += tl.dot(a, wu)
    if GELU:
        h = _gelu_tanh(acc_g) * acc_u
    else:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(act_ptr + pair[:, None] * I + cols[None, :], h.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])  # fmt: skip


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, wt_ptr, out_ptr, tile_expert_ptr, tile_start_ptr, count_ptr, pair_start_ptr, order_ptr,
    E, H, I, stride_we, stride_wi,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    if tl.load(tile_expert_ptr + t) >= E:
        return
    e, pair, valid = _tile_rows(tile_expert_ptr, tile_start_ptr, count_ptr, pair_start_ptr, order_ptr, t, E,
                                BLOCK_M)  # fmt: skip
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w_base = w_ptr + e * stride_we
    for k0 in range(0, I, BLOCK_K):
        ks = k0 + kk
        k_ok = ks < I
        a = tl.load(act_ptr + pair[:, None] * I + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + ks[:, None] * stride_wi + cols[None, :], mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)  # fmt: skip
        if IEEE:
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w)
    acc = acc * tl.load(wt_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + pair[:, None] * H + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])  # fmt: skip


def grouped_experts(x, w_gate_up, w_down, topk_weights, topk_ids, act: str) -> torch.Tensor:
    N, H = x.shape
    E, _, I2 = w_gate_up.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    P = N * k
    if N == 0:
        return torch.empty_like(x)
    # decode (few pairs): the least rows a tl.dot takes and narrow column blocks, so that the
    # few experts' weights are spread over many programs; else 64-row tiles
    block_m, bn, bk, warps = (16, 32, 128, 4) if P <= 64 else (64, 128, 64, 8)
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True).to(torch.int32)  # pairs grouped by expert
    # (not torch.bincount: on CUDA it reads the largest id on the host)
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).index_add_(0, flat, torch.ones_like(flat))
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    tile_start = (tile_end - tiles).to(torch.int32)
    pair_start = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    # every tile holds a pair: at most P tiles, and at most one part-filled tile an expert
    n_tiles = min(P, triton.cdiv(P, block_m) + E)  # enough for any routing: no host sync
    tile_expert = torch.searchsorted(tile_end, torch.arange(n_tiles, device=x.device), right=True).to(
        torch.int32
    )
    counts = counts.to(torch.int32)
    act_buf = torch.empty(P, I, dtype=x.dtype, device=x.device)
    out_pairs = torch.empty(P, H, dtype=x.dtype, device=x.device)
    ieee = x.dtype == torch.float32 or INTERPRET
    _gate_up_kernel[(n_tiles, triton.cdiv(I, bn))](
        x, w_gate_up, act_buf, tile_expert, tile_start, counts, pair_start, order,
        E, H, I, w_gate_up.stride(0), w_gate_up.stride(1),
        K=k, GELU=act == "gelu_tanh", BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, IEEE=ieee, num_warps=warps,
    )  # fmt: skip
    _down_kernel[(n_tiles, triton.cdiv(H, bn))](
        act_buf, w_down, topk_weights.reshape(-1), out_pairs,
        tile_expert, tile_start, counts, pair_start, order,
        E, H, I, w_down.stride(0), w_down.stride(1),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, IEEE=ieee, num_warps=warps,
    )  # fmt: skip
    return out_pairs.view(N, k, H).sum(1)
