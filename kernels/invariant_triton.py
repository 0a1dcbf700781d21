"""Triton kernels of invariant.py (see there for what they compute and why).

Imported only when a batch-invariant forward runs: importing triton is not free, and the default
paths never need it. Under TRITON_INTERPRET=1 (set before this import) they run on CPU tensors.

M (and the partials' stride M * N) is a plain runtime argument (``do_not_specialize``). The K
split is chosen from (N, K) alone, and a row's products are accumulated in the same k order by
the same instructions in every launch: each split in BLOCK_K steps of tensor-core dots, the
splits then added in split order. Rows never mix, so a row's bits cannot depend on the others.

The tiles and where the splits are added do change with M, for speed, not bits: decode-sized
products run 64-row tiles and add their splits through float32 partials (more programs for a
few rows); prompt-sized ones (`prompt_sized`) run PROMPT_TILES and add the splits inside each
program. A tile's shape changes how many elements an instruction computes, not how one element
is summed: tests/kernels/test_invariant.py checks the bits on the GPU, and
benchmarks/bench_invariant.py at a model's shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot of bfloat16 operands gives garbage under the interpreter (triton 3.9): under INTERPRET the
# operands go to float32 first, on the GPU they stay 16-bit (tensor cores). And under INTERPRET
# tl.dot is numpy's matmul, whose BLAS may round a row differently by its place in the block (seen
# on AMD EPYC: rows 6-11 of a 64-row block): there the products are summed in k order instead.
from .triton_common import INTERPRET

BLOCK_M = 64  # rows per program, fixed for every M (a row's instructions never change)
BLOCK_K = 64
NUM_WARPS = 4
TARGET_PROGRAMS = 66  # split K until one block of rows has ~half an H200's 132 SMs busy
MIN_K_PER_SPLIT = 8 * BLOCK_K
PROMPT_PROGRAMS = 264  # two programs an H200 SM without a K split: the partials cost more
# (block_m, block_n, warps, stages, group_m) of prompt-sized products: group_m row blocks a group
# of programs (_mm_tma_kernel), which keeps the rows' tiles in L2 while the group crosses the
# weights (H200, Llama-3-8B's projections at 32k rows: 1.09x cuBLAS's time, 1.16x in one group)
PROMPT_TILES = (128, 256, 8, 3, 8)


def config(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, splits, keys per split) of a [*, K] @ [K, N] product, from (N, K) alone: wide
    tiles for 8B-scale K, and K split (at least MIN_K_PER_SPLIT keys a split) when N is too
    narrow to fill the device. Tuned on an H200 against cuBLAS at M = 1..128 (README)."""
    block_n = 64 if k < 2048 else 128
    n_blocks = triton.cdiv(n, block_n)
    splits = max(1, min(k // MIN_K_PER_SPLIT, triton.cdiv(TARGET_PROGRAMS, n_blocks)))
    per = triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K
    return block_n, triton.cdiv(k, per), per


@triton.jit
def _dot_step(a_ptr, w_ptr, rm, rn, rk, acc, M, N, K, stride_am, stride_wk, IEEE: tl.constexpr,
              ROW_SUMS: tl.constexpr):  # fmt: skip
    # acc + a[rm, rk] @ w[rk, rn], the keys rk in order
    a = tl.load(
        a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :],
        mask=(rm[:, None] < M) & (rk[None, :] < K),
        other=0.0,
    )
    w = tl.load(
        w_ptr + rk[:, None].to(tl.int64) * stride_wk + rn[None, :],
        mask=(rk[:, None] < K) & (rn[None, :] < N),
        other=0.0,
    )
    if ROW_SUMS:  # the interpreter: each product summed in k order (a BLAS gemm may not)
        acc += tl.sum(a.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
    elif IEEE:
        acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, w, acc)
    return acc


@triton.jit(do_not_specialize=["M", "stride_cs"])
def _mm_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wk,
    stride_cs,
    stride_cm,
    K_PER_SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    ROW_SUMS: tl.constexpr = False,
    SPLITS_IN: tl.constexpr = 1,
):
    # axis 0: row blocks (fastest, so the programs sharing a weight tile run together).
    # SPLITS_IN == 1: program (m, n, s) sums split s (keys s * K_PER_SPLIT ...) in float32 and
    # stores it to partial s; _sum_splits_kernel adds the partials in split order.
    # SPLITS_IN > 1 (one program a tile): the program sums each split the same way and adds it
    # to its total at the split's end, in split order with the same float32 adds, so the bits
    # are the partials' without their trip through memory.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    if SPLITS_IN == 1:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for start in range(0, K_PER_SPLIT, BK):
            rk = pid_s * K_PER_SPLIT + start + kk
            acc = _dot_step(a_ptr, w_ptr, rm, rn, rk, acc, M, N, K, stride_am, stride_wk, IEEE, ROW_SUMS)
    else:
        acc = tl.full([BM, BN], -0.0, dtype=tl.float32)  # -0.0 + x is x, for every x
        part = tl.zeros([BM, BN], dtype=tl.float32)
        # one loop over all the keys (a loop of splits around a loop of keys runs at half speed)
        for start in range(0, SPLITS_IN * K_PER_SPLIT, BK):
            part = _dot_step(a_ptr, w_ptr, rm, rn, start + kk, part, M, N, K, stride_am, stride_wk, IEEE,
                             ROW_SUMS)  # fmt: skip
            if (start + BK) % K_PER_SPLIT == 0:
                acc += part
                part = tl.zeros([BM, BN], dtype=tl.float32)
    c = c_ptr + pid_s * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit(do_not_specialize=["M", "GROUP_M"])
def _mm_tma_kernel(
    a_desc,
    w_desc,
    c_ptr,
    M,
    N,
    stride_cm,
    GROUP_M,
    K_PER_SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLITS_IN: tl.constexpr,
):
    # _mm_kernel's SPLITS_IN way for 16-bit operands on the GPU, its tiles read by the tensor
    # memory accelerator (TMA): the same keys in the same order into the same dots (a block past
    # M or K reads zeros, as the masked loads), so the same bits, with loads the compiler
    # pipelines better. One axis of programs, in groups of GROUP_M row blocks: a group's
    # programs go down its row blocks, then across the column blocks, so the programs that run
    # together share their rows' and their weights' tiles in L2 (which tile a program computes
    # never changes an element's sum)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    per_group = GROUP_M * tl.cdiv(N, BN)
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    acc = tl.full([BM, BN], -0.0, dtype=tl.float32)  # -0.0 + x is x, for every x
    part = tl.zeros([BM, BN], dtype=tl.float32)
    for start in range(0, SPLITS_IN * K_PER_SPLIT, BK):
        a = a_desc.load([pid_m * BM, start])
        w = w_desc.load([start, pid_n * BN])
        part = tl.dot(a, w, part)
        if (start + BK) % K_PER_SPLIT == 0:
            acc += part
            part = tl.zeros([BM, BN], dtype=tl.float32)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit(do_not_specialize=["total"])
def _sum_splits_kernel(p_ptr, out_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    # out[i] = ((p[0, i] + p[1, i]) + p[2, i]) + ...: split order, whatever the row count
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < total
    acc = tl.load(p_ptr + i, mask=m, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(p_ptr + s * total + i, mask=m, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=m)


def prompt_sized(m: int, n: int, k: int) -> bool:
    """Whether a product has rows enough (prompt-sized M) that its row blocks alone give the
    device PROMPT_PROGRAMS programs: then the programs add their K splits themselves, with
    PROMPT_TILES. Either way gives the same bits."""
    block_n = config(n, k)[0]
    return triton.cdiv(m, BLOCK_M) * triton.cdiv(n, block_n) >= PROMPT_PROGRAMS


def tma_fits(a: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `_mm_tma_kernel` can run a [M, K] @ [K, N] product: 16-bit operands on a GPU with
    TMA (compute capability 9 or more), rows of 16-byte multiples, 16-byte aligned bases."""
    if INTERPRET or a.device.type != "cuda" or a.dtype not in (torch.bfloat16, torch.float16):
        return False
    if torch.cuda.get_device_capability(a.device)[0] < 9 or a.stride(1) != 1 or w.stride(1) != 1:
        return False
    return all(t.stride(0) * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, w))


def matmul(
    a: torch.Tensor,
    w: torch.Tensor,
    splits_in: bool | None = None,
    tiles: tuple[int, ...] | None = None,
    tma: bool | None = None,
) -> torch.Tensor:
    """a [M, K] @ w [K, N]. `splits_in` (default: `prompt_sized`) picks where the K splits are
    added; `tiles` (block_m, block_n, warps, stages[, group_m]; default: PROMPT_TILES for a
    prompt-sized product, else BLOCK_M, config's block_n, NUM_WARPS, 4) the programs' tiles and,
    by TMA, how many row blocks a group of programs takes (default: all of them); `tma` whether a
    splits-in product of 16-bit operands on a Hopper GPU reads its tiles by TMA
    (`_mm_tma_kernel`; default: prompt-sized products where `tma_fits`). None changes a row's
    bits (tests/kernels/test_invariant.py), only the speed."""
    M, K = a.shape
    N = w.shape[1]
    block_n, splits, per = config(N, K)
    out = torch.empty(M, N, dtype=a.dtype, device=a.device)
    if M == 0:
        return out
    prompt = prompt_sized(M, N, K)
    if splits_in is None:
        splits_in = prompt
    if tiles is None:
        # (the interpreter's k-order sums hold a [BM, BK, BN] tile: too big for PROMPT_TILES)
        tiles = PROMPT_TILES if prompt and not INTERPRET else (BLOCK_M, block_n, NUM_WARPS, 4)
    bm, bn, warps, stages = tiles[:4]
    group_m = tiles[4] if len(tiles) > 4 else triton.cdiv(M, bm)  # (one group: row blocks fastest)
    ieee = a.dtype == torch.float32 or INTERPRET  # float32 operands: exact products
    kw = dict(K_PER_SPLIT=per, IEEE=ieee, ROW_SUMS=INTERPRET, BM=bm, BN=bn, BK=BLOCK_K, num_warps=warps,
              num_stages=stages)  # fmt: skip
    if splits == 1 or splits_in:
        grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), 1)
        if tma is None:  # (prompt-sized products: decode's few rows keep the pointer loads)
            tma = prompt and tma_fits(a, w)
        if tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            a_desc = TensorDescriptor.from_tensor(a, [bm, BLOCK_K])
            w_desc = TensorDescriptor.from_tensor(w, [BLOCK_K, bn])
            _mm_tma_kernel[(grid[0] * grid[1],)](a_desc, w_desc, out, M, N, out.stride(0), group_m,
                                                 K_PER_SPLIT=per, BM=bm, BN=bn, BK=BLOCK_K,
                                                 SPLITS_IN=splits, num_warps=warps,
                                                 num_stages=stages)  # fmt: skip
            return out
        _mm_kernel[grid](
            a, w, out, M, N, K, a.stride(0), w.stride(0), 0, out.stride(0), SPLITS_IN=splits, **kw
        )
        return out
    part = torch.empty(splits, M, N, dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn), splits)
    _mm_kernel[grid](a, w, part, M, N, K, a.stride(0), w.stride(0), part.stride(0), part.stride(1), **kw)
    total = M * N
    block = 1024
    _sum_splits_kernel[(triton.cdiv(total, block),)](
        part, out, total, SPLITS=splits, BLOCK=block, num_warps=4
    )
    return out


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, H, eps, BLOCK: tl.constexpr):
    # one program a row; the whole row in one block, so its sum has one order
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    y = (x * r).to(out_ptr.dtype.element_ty)  # as torch: normalise in float32, cast, then weight
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    # the product of two 16-bit floats is exact in float32: one rounding, as a 16-bit multiply
    tl.store(out_ptr + row * stride_o + cols, (y.to(tl.float32) * w).to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    M, H = x.shape
    out = torch.empty_like(x)
    if M:
        _rms_norm_kernel[(M,)](
            x, weight, out, x.stride(0), out.stride(0), H, eps, BLOCK=triton.next_power_of_2(H), num_warps=4
        )
    return out
