"""Triton kernel of `paged_attention_triton` (see paged_attention.py for what it computes).

Imported only when that function is called: importing triton is not free, and the CPU path
never needs it. Under TRITON_INTERPRET=1 (set before this import) it runs on CPU tensors.

Split over the keys (``splits`` > 1, "flash-decoding"): a row's keys, from the block of its first
visible key to its length, are cut into at most ``splits`` runs of whole BLOCK_N-key blocks, as
even as whole blocks allow: ``per = cdiv(blocks, splits)`` blocks a run, ``cdiv(blocks, per)``
runs. The cut depends on the row's own length (and window) alone, never on the batch or on the
table's width. Program (row, KV head, s) reduces run s as the unsplit program reduces all of
them; a row of one run writes its output at once (the unsplit program's arithmetic), else each
run writes its partial (running max, sum of exponentials, unnormalised output) and takes a
ticket from the (row, KV head)'s counter; the program that takes the last ticket merges the
partials in run order (so whichever program finishes last, the sum is the same) and sets the
counter back to 0 for the next launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_common import cache_strides, shape_constants
from .triton_common import dependent, gdc_launch_dependents, gdc_wait

# stages of the key loop's software pipeline: a K and a V tile of BLOCK_N keys loaded one step
# ahead. Triton's default of 3 holds twice the tiles in shared memory, so fewer programs fit on
# a multiprocessor: 1.15-1.25x slower where the grid has several programs a multiprocessor
# (Llama-3-8B's heads at 64 rows, SmolLM2's at 256; benchmarks/RESULTS.md), alike elsewhere.
LOOP_STAGES = 2


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    bt_ptr,
    seq_ptr,
    pos_ptr,
    part_o_ptr,
    part_ml_ptr,
    count_ptr,
    W,
    CAP,
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
    SPLIT: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    RUNS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    # one program: query row r, KV head h (with SPLIT, run s of the row's keys); its G query heads
    # as a [G_PAD, HD_PAD] block (rows past G are zeros: tl.dot needs 16), scores and values
    # through tl.dot
    if PDL:  # launched early (programmatic dependent launch): wait for the kernel before
        gdc_wait()
        gdc_launch_dependents()
    # the grid's first axis is (row, KV head), heads fastest: a row's heads, which read the
    # same cache blocks, run side by side
    pid = tl.program_id(0)
    r = (pid // NKV).to(tl.int64)  # (int64: q offsets of a long prefill pass 2**31)
    h = pid % NKV
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
    first = (lo // BLOCK_N) * BLOCK_N
    stop = n
    s = 0
    runs = 1
    if SPLIT:  # run s of the row's blocks (the table's keys only: runs <= CAP, the grid's)
        s = tl.program_id(1)
        blocks = tl.maximum(tl.cdiv(tl.minimum(n, W * BLOCK_SIZE) - first, BLOCK_N), 1)
        per = tl.cdiv(blocks, MAX_SPLITS)
        runs = tl.cdiv(blocks, per)
        first += s * per * BLOCK_N
        stop = tl.minimum(n, first + per * BLOCK_N)  # (s >= runs: nothing visible, nothing written)
    for start in range(first, stop, BLOCK_N):
        cols = start + j  # [BLOCK_N] key positions
        slot = cols // BLOCK_SIZE  # the column's entry of the table (a shift: BLOCK_SIZE is 2**k)
        live = (cols < n) & (cols >= lo) & (slot < W)  # (slot < W: never read past the table row)
        blk = tl.load(table + slot * stride_bw, mask=live, other=0).to(tl.int64)
        within = (cols % BLOCK_SIZE).to(tl.int64)
        kv_mask = live[:, None] & (d[None, :] < HD)
        k_rows = blk * stride_kb + within * stride_kt + h * stride_kh  # [BLOCK_N]
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            sc = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(k))
        if SOFTCAP:  # softcap * tanh(s / softcap), tanh(u) = 2 sigmoid(2u) - 1
            sc = (2.0 * tl.sigmoid(sc * (2.0 * scale / softcap)) - 1.0) * softcap
        else:
            sc = sc * scale
        sc = tl.where(live[None, :], sc, float("-inf"))  # [G_PAD, BLOCK_N]
        m_new = tl.maximum(m, tl.max(sc, axis=1))  # finite: a run's first block holds a visible key
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        v_rows = blk * stride_vb + within * stride_vt + h * stride_vh
        v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    if runs == 1:
        if s == 0:
            out = acc / denom[:, None]
            tl.store(o_ptr + q_off, out.to(o_ptr.dtype.element_ty), mask=q_mask)
    elif s < runs:
        # the partial of run s: [G, HD] unnormalised output, then [2, G] max and sum
        rh = r * NKV + h
        g_mask = gi < G
        part = (rh * CAP + s) * G
        tl.store(part_o_ptr + (part + gi[:, None]) * HD + d[None, :], acc, mask=q_mask)
        tl.store(part_ml_ptr + 2 * part + gi, m, mask=g_mask)
        tl.store(part_ml_ptr + 2 * part + G + gi, denom, mask=g_mask)
        tl.debug_barrier()  # every thread's stores before the ticket (released with it)
        ticket = tl.atomic_add(count_ptr + rh, 1, sem="acq_rel")
        if ticket == runs - 1:  # the last run done: merge the row's runs in order
            tl.store(count_ptr + rh, 0)
            # (.cg: the partials from L2, where the other programs' stores are, never from L1)
            ts = tl.arange(0, RUNS_PAD)
            maxes = tl.load(part_ml_ptr + 2 * (rh * CAP + ts[:, None]) * G + gi[None, :],
                            mask=(ts[:, None] < runs) & g_mask[None, :], other=float("-inf"),
                            cache_modifier=".cg")  # fmt: skip
            big = tl.where(g_mask, tl.max(maxes, axis=0), 0.0)  # [G_PAD]: the row's max per head
            total = tl.zeros([G_PAD], tl.float32)
            merged = tl.zeros([G_PAD, HD_PAD], tl.float32)
            for t in range(0, runs):
                pt = (rh * CAP + t) * G
                m_t = tl.load(part_ml_ptr + 2 * pt + gi, mask=g_mask, other=0.0, cache_modifier=".cg")
                l_t = tl.load(part_ml_ptr + 2 * pt + G + gi, mask=g_mask, other=1.0, cache_modifier=".cg")
                o_t = tl.load(part_o_ptr + (pt + gi[:, None]) * HD + d[None, :], mask=q_mask, other=0.0,
                              cache_modifier=".cg")  # fmt: skip
                w = tl.exp(m_t - big)  # 1 for the runs that hold the row's max
                total += l_t * w
                merged += o_t * w[:, None]
            out = merged / total[:, None]
            tl.store(o_ptr + q_off, out.to(o_ptr.dtype.element_ty), mask=q_mask)


_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}  # device -> its counter buffers, newest last


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """n int32 zeros of the split kernel's per-(row, KV head) counters on ``device``: one buffer a
    device, shared by every launch there (launches on one device run in turn, and each leaves its
    counters at 0). A larger one is made when needed; the old ones are kept, as captured CUDA
    graphs hold their addresses."""
    bufs = _COUNTERS.setdefault(device, [])
    if not bufs or bufs[-1].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"paged_attention_triton(splits > 1) needs {n} counters on {device} during a CUDA graph "
                f"capture but has {bufs[-1].numel() if bufs else 0}: run the same call once before capturing"
            )
        bufs.append(torch.zeros(max(n, 1 << 12, 2 * bufs[-1].numel() if bufs else 0), dtype=torch.int32,
                                device=device))  # fmt: skip
    return bufs[-1]


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
    splits: int = 1,
    pdl: bool = False,
) -> None:
    """q, out: contiguous [N, nkv, g, hd]; k_cache, v_cache: [num_blocks, block_size, nkv, hd]
    (last dim contiguous, block_size a power of two); block_tables: [S, W]; seq_ids, positions:
    contiguous [N]; window: a row's last keys it sees (0: all). splits > 1: cut each row's keys
    into at most that many runs (module docstring); the grid then has a program per run the
    table's width allows. pdl: launched as a programmatic dependent launch."""
    N, nkv, g, hd = q.shape
    W = block_tables.shape[1]
    cap = min(splits, triton.cdiv(W * k_cache.shape[1], block_n))
    part_o = part_ml = counters = out  # (never read without a split)
    if splits > 1:
        part = N * nkv * cap * g if cap > 1 else 0
        work = torch.empty(max(part * (hd + 2), 1), dtype=torch.float32, device=q.device)
        part_o, part_ml = work[: part * hd], work[part * hd :]  # [N, nkv, cap, g, hd] and [N, nkv, cap, 2, g]
        counters = _counters(q.device, N * nkv)
    _paged_attention_kernel[(N * nkv, cap)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_ids,
        positions,
        part_o,
        part_ml,
        counters,
        W,
        cap,
        scale,
        window,
        softcap if softcap else 1.0,
        *cache_strides(block_tables, k_cache, v_cache),
        **shape_constants(q, k_cache),
        G_PAD=max(16, triton.next_power_of_2(g)),
        BLOCK_N=block_n,
        SOFTCAP=bool(softcap),
        SPLIT=splits > 1,
        MAX_SPLITS=splits,
        RUNS_PAD=triton.next_power_of_2(splits),
        PDL=pdl,
        num_warps=4,
        num_stages=LOOP_STAGES,
        **dependent(pdl),
    )
