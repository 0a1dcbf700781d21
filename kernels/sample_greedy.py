"""The all-greedy kernel: one launch for a split call whose rows are all greedy, without logprobs.

Program (row, c) takes the max of tile c and its lowest index; the row's last program to finish
(an atomic count) takes the chunks' results in chunk order and writes the token. bfloat16
logits go through packed keys (value and index in one int32: one integer max).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import RowArgs, argmax2d, chunk_row, helper, launch_opts, load_scores, tile2d
from .tuning import SampleTuning


@helper
def _chunk_program(logits_ptr, stride_lb, stride_lv, mask_ptr, stride_mb, mask_row_ptr, V, S,
                   HAS_MASK: tl.constexpr, HAS_ROW_MAP: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # program (row, c) of a split pass -> (row index, c, row as int64, the row's logits pointer,
    # x = tile c of its masked logits); the tile is loaded first, before anything about the row
    # is known (no load waits on another)
    r, c, row, lrow, mrow_ptr, has_row_mask = chunk_row(
        logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP
    )
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, 1.0, HAS_MASK)
    return r, c, row, lrow, x


@triton.jit
def _split_greedy_kernel(
    logits_ptr,
    stride_lb,
    stride_lv,  # [B, V]
    mask_ptr,
    stride_mb,
    mask_row_ptr,  # as sample_rows._sample_kernel
    pm_ptr,
    pi_ptr,  # scratch [B, S]: each chunk's max and its lowest argmax
    count_ptr,  # [>= B] int32: chunks of the row finished; zero on entry, reset to zero on exit
    tokens_ptr,
    empty_ptr,  # out: [B] int64 (-1: nothing allowed), bool
    V,
    S,
    HAS_MASK: tl.constexpr,
    HAS_ROW_MAP: tl.constexpr,
    CHUNK: tl.constexpr,
    SP: tl.constexpr,
    PACKED: tl.constexpr,  # bfloat16 logits: value and index in one int32 key (CHUNK <= 65536)
    MASK2D: tl.constexpr,  # the tile as [CHUNK / 32, 32]: one bitmask word per 32 tokens
    TILES: tl.constexpr,  # (PACKED) program c takes tiles c * TILES .. (c + 1) * TILES - 1 in turn
):
    # program (row, c) of an all-greedy batch: the max of tile c and its lowest index; the row's
    # last program to finish (an atomic count) takes the S chunks' results in chunk order and
    # writes the token -- one launch, where the other kinds end in sample_rows._sample_kernel. The argmax
    # is exact, whichever program finishes last.
    if PACKED or MASK2D:
        # [CHUNK / 32, 32] (tile2d): each word of the bitmask is loaded once and tested against
        # the column's bit (no per-token gather of its word)
        r, c, row, lrow, mrow_ptr, has_row_mask = chunk_row(
            logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP
        )
        if not PACKED:  # (the packed keys read their TILES tiles below)
            x, local = tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK, CHUNK)
    else:
        r, c, row, lrow, x = _chunk_program(
            logits_ptr,
            stride_lb,
            stride_lv,
            mask_ptr,
            stride_mb,
            mask_row_ptr,
            V,
            S,
            HAS_MASK,
            HAS_ROW_MAP,
            CHUNK,
        )
        local = tl.arange(0, CHUNK)
    if PACKED:
        # x holds bfloat16 values (low 16 bits zero): the float's bits made monotone as an int32
        # in the high half (b >= 0: b; a negative float of magnitude bits M: -M, so -0.0 and +0.0
        # are both 0; (b ^ (sg & 0x7FFFFFFF)) - sg with sg = b >> 31, three integer operations),
        # 65535 - index in the low half, so one integer max gives the max and, among equal
        # values, the lowest index (a plain max instead of a max carrying an index)
        # TILES tiles in turn (tile2d): a later one wins only with a larger value
        best = tl.full((), -2147483648, tl.int32)
        bt = 0
        for t in tl.static_range(TILES):
            x, local = tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c * TILES + t, V, HAS_MASK, CHUNK)
            b = x.to(tl.int32, bitcast=True)
            sg = b >> 31
            tb = tl.max((b ^ (sg & 0x7FFFFFFF)) - sg + (65535 - local))
            win = (tb & -65536) > (best & -65536)
            best = tl.where(win, tb, best)
            bt = tl.where(win, t, bt)
        bi = bt * CHUNK + 65535 - (best & 65535)
        kh = best & -65536
        m = tl.where(kh < 0, (-kh) | -2147483648, kh).to(tl.float32, bitcast=True)
    elif MASK2D:
        m, bi = argmax2d(x, local, CHUNK)
    else:
        m, bi = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(pm_ptr + row * S + c, m)
    tl.store(pi_ptr + row * S + c, c * (CHUNK * TILES) + bi)
    tl.debug_barrier()  # this program's stores before its count (released by the atomic)
    done = tl.atomic_add(count_ptr + r, 1, sem="acq_rel")
    if done == S - 1:
        cs = tl.arange(0, SP)
        ms = tl.load(pm_ptr + row * S + cs, mask=cs < S, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(pi_ptr + row * S + cs, mask=cs < S, other=0, cache_modifier=".cg")
        mx, bc = tl.max(ms, 0, return_indices=True, return_indices_tie_break_left=True)
        empty = mx == float("-inf")
        tok = tl.where(empty, -1, tl.sum(tl.where(cs == bc, idxs, 0), 0))
        tl.store(tokens_ptr + r, tok.to(tl.int64))
        tl.store(empty_ptr + r, empty)
        tl.store(count_ptr + r, 0)


_counts: dict[torch.device, torch.Tensor] = {}


def row_counts(dev: torch.device, B: int) -> torch.Tensor:
    """[>= B] int32 zeros for _split_greedy_kernel, kept per device: every call leaves them at
    zero, so no launch clears them. (One stream at a time: two concurrent calls would share
    them.) Inside a CUDA-graph capture a missing buffer is made for that graph alone."""
    buf = _counts.get(dev)
    if buf is not None and buf.numel() >= B:
        return buf
    buf = torch.zeros(max(B, 1024), dtype=torch.int32, device=dev)
    if not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _counts[dev] = buf
    return buf


def launch(
    rows: RowArgs, tokens: torch.Tensor, empty: torch.Tensor, V: int, chunk: int, tuning: SampleTuning
) -> None:
    """The all-greedy launch: ``tokens`` [B] int64 (-1: nothing allowed) and ``empty`` [B] bool."""
    logits = rows.logits[0]
    B = logits.shape[0]
    dev = logits.device
    packed = logits.dtype == torch.bfloat16 and chunk <= 65536
    # a program takes CHUNK tokens of 4-byte logits, 2 * CHUNK of 2-byte ones (two tiles in
    # turn when packed); any tiling gives the same argmax
    tiles = tuning.greedy_tiles if packed else 1
    gchunk = min(chunk * (1 if packed else max(1, 4 // logits.element_size())), triton.next_power_of_2(V))
    gS = triton.cdiv(V, gchunk * tiles)
    pm = torch.empty(B, gS, dtype=torch.float32, device=dev)
    pi = torch.empty(B, gS, dtype=torch.int32, device=dev)
    _split_greedy_kernel[(B * gS,)](
        *rows.logits, *rows.mask, pm, pi, row_counts(dev, B),
        tokens, empty, V, gS, CHUNK=gchunk, SP=triton.next_power_of_2(gS),
        PACKED=packed, MASK2D=tuning.mask2d and gchunk >= 32, TILES=tiles,
        **rows.flags, **launch_opts(tuning.greedy_warps),
    )  # fmt: skip
