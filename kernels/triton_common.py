"""Triton helpers shared by the sampling and verify kernels, and the host side of their launches.

- platform: the interpreter switch (device helpers are plain functions under
  ``TRITON_INTERPRET=1``), programmatic dependent launch where the GPU and Triton have it, the
  launch options, ``fast_exp``;
- hashing and draws: the counter-based uniforms (``mix32``, ``row_keys``, ``draw_t``; the same
  bits as ``sample_reference.draw_bits``) and the exact integer scaling of the inverse CDF;
- chunk helpers: a row's scores, the quanta (integer weights) of a chunk, pass 1 of a row by
  chunks, an inverse-CDF draw (the chunk, then the token in it), the chunks' masses and the
  logprob's normaliser;
- row pointers and tiles: a program's row (or (row, chunk)) and its logits and bitmask
  pointers, a chunk's tile as [CHUNK / 32, 32] and its argmax.

Sampling is by inverse CDF over integer weights (``sample_reference.chunk_weights`` /
``inverse_cdf``): draw j walks the running sums to a chunk (hash id 2j), then to a token in it
(id 2j + 1); the sums are exact, so every path picks the same token.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

try:  # grid dependency control (Hopper and later): a dependent launch starts while the previous ends
    from triton.backends.nvidia.compiler import CUDAOptions as _CUDAOptions
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = "launch_pdl" in _CUDAOptions.__dataclass_fields__
except Exception:  # noqa: BLE001 - an older Triton: every launch waits for the one before
    HAS_PDL = False
    gdc_launch_dependents = gdc_wait = None  # (never reached: PDL launches need HAS_PDL)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Device helpers are inlined by the compiler; under the interpreter each @triton.jit call
# re-patches triton.language (~0.4 ms), so there they are plain functions (same code).
helper = (lambda fn: fn) if INTERPRET else triton.jit
N_DRAWS = 4  # inverse-CDF draws per row before the rounds
NDRAW = tl.constexpr(N_DRAWS)


if INTERPRET:

    def fast_exp(x):
        return tl.exp(x)

else:

    @triton.jit
    def fast_exp(x):
        # exp(x) per token as 2 ** (x * log2 e) by libdevice's exp2, which Triton builds flushing
        # denormals: one ex2.approx.ftz (tl.exp adds a rescale around results below 2**-126,
        # four instructions a token; those flush to 0 here: weights under 2**-126 of the max)
        return libdevice.exp2(x * 1.4426950408889634)


@helper
def mix32(x):
    # lowbias32 on uint32 (same bits as sample_reference.mix32)
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    x = x ^ (x >> 15)
    return x


@helper
def row_keys(seed, step):
    # seed, step: int64 scalars -> two uint32 keys (sample_reference.row_keys)
    k = mix32((step >> 32).to(tl.uint32) ^ 0x9E3779B9)
    k = mix32(step.to(tl.uint32) ^ k)
    k = mix32((seed >> 32).to(tl.uint32) ^ k)
    k0 = mix32(seed.to(tl.uint32) ^ k)
    k1 = mix32(k0 ^ 0x85EBCA6B)
    return k0, k1


@helper
def draw_t(j, k0, k1):
    # hash id j (uint32) -> t = 2 * (r >> 9) + 1 (int64, odd, < 2**24): the uniform t / 2**24
    # (sample_reference.draw_bits)
    r = mix32(mix32(j + k0) ^ k1)
    return (r >> 9).to(tl.int64) * 2 + 1


@helper
def scale(total, t):
    # floor(total * t / 2**24), exactly, for int64 total < 2**50 and t < 2**24
    return (total >> 24) * t + (((total & 0xFFFFFF) * t) >> 24)


@helper
def load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK: tl.constexpr):
    # s [BLOCK] float32 = logits * inv_t, -inf outside the vocabulary or where the bitmask forbids
    inb = offs < V
    x = tl.load(lrow + offs.to(tl.int64) * stride_lv, mask=inb, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        words = tl.load(mrow_ptr + offs // 32, mask=inb, other=-1)
        words = tl.where(has_row_mask, words, -1)
        x = tl.where(((words >> (offs % 32)) & 1) != 0, x, float("-inf"))
    return x * inv_t


@helper
def quanta(s, mc, low):
    # q = floor(exp(s - mc) * 2**32) (int64) on {s > low}, 0 elsewhere; mc = the chunk's max
    e = fast_exp(s - tl.where(mc == float("-inf"), 0.0, mc)) * 4294967296.0
    return tl.where(s > low, e.to(tl.int64), 0)


@helper
def pick_chunk(ms, zs, cs, t):
    # the chunks' max and quanta sums -> the chunk c with cum_{c-1} <= g < cum_c over the chunk
    # weights W_c = int64(float(Z_c) * exp(m_c - m)), g = floor(sum(W) * t / 2**24)
    m = tl.max(ms, 0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    w = chunk_mass(ms, zs, safe_m).to(tl.int64)
    cum = tl.cumsum(w, 0)
    g = scale(tl.max(cum, 0), t)
    return tl.sum((cum <= g).to(tl.int32), 0)


@helper
def _pick_in_tile(s, mc, low, zc, offs, t):
    # the token i of the chunk tile with cum_{i-1} <= h < cum_i over its quanta, h = floor(zc * t / 2**24)
    cum = tl.cumsum(quanta(s, mc, low), 0)
    return tl.min(offs, 0) + tl.sum((cum <= scale(zc, t)).to(tl.int32), 0)


@helper
def row_chunks(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, low, prev,
               HAS_MASK: tl.constexpr, CHUNK: tl.constexpr, SP: tl.constexpr):  # fmt: skip
    # one pass over the row by chunks -> each chunk's max and quanta sum over {s > low}, as
    # [SP] vectors (what _split_pass1_kernel stores per chunk). prev: the chunks' maxima from
    # an earlier pass (+inf: none); a chunk whose max is at or below low is not read (its
    # weight is 0 either way; its max is left at -inf)
    cs = tl.arange(0, SP)
    ms = tl.full([SP], float("-inf"), tl.float32)
    zs = tl.zeros([SP], tl.int64)
    for start in range(0, V, CHUNK):
        c = start // CHUNK
        if tl.max(tl.where(cs == c, prev, float("-inf")), 0) > low:
            s = load_scores(
                lrow, stride_lv, mrow_ptr, has_row_mask, start + tl.arange(0, CHUNK), V, inv_t, HAS_MASK
            )
            mc = tl.max(s, 0)
            zc = tl.sum(quanta(s, mc, low), 0)
            ms = tl.where(cs == c, mc, ms)
            zs = tl.where(cs == c, zc, zs)
    return ms, zs, cs


@helper
def row_draw(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1,
             HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # inverse-CDF draw j over {s > low}: the chunk (hash id 2j), then the token in it (id 2j + 1)
    # -> (token, its score). The score is loaded again: taken from the tile, it would keep the
    # tile alive through the running sum (the draw kernel: 96 -> 168 registers)
    c = pick_chunk(ms, zs, cs, draw_t(2 * j, k0, k1))
    offs = c * CHUNK + tl.arange(0, CHUNK)
    s = load_scores(lrow, stride_lv, mrow_ptr, has_row_mask, offs, V, inv_t, HAS_MASK)
    mc = tl.sum(tl.where(cs == c, ms, 0.0), 0)
    zc = tl.sum(tl.where(cs == c, zs, 0), 0)
    x = _pick_in_tile(s, mc, low, zc, offs, draw_t(2 * j + 1, k0, k1))
    return x, tl.load(lrow + x.to(tl.int64) * stride_lv).to(tl.float32) * inv_t


@helper
def row_draws(lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1,
              HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # draws j .. j + 3 over {s > low} (row_draw) -> their tokens, then their scores
    x0, q0 = row_draw(
        lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j, k0, k1, HAS_MASK, CHUNK
    )
    x1, q1 = row_draw(
        lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 1, k0, k1, HAS_MASK, CHUNK
    )
    x2, q2 = row_draw(
        lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 2, k0, k1, HAS_MASK, CHUNK
    )
    x3, q3 = row_draw(
        lrow, stride_lv, mrow_ptr, has_row_mask, V, inv_t, ms, zs, cs, low, j + 3, k0, k1, HAS_MASK, CHUNK
    )
    return x0, x1, x2, x3, q0, q1, q2, q3


@helper
def chunk_mass(ms, zs, m):
    # the chunks' masses sum exp(s - m) over each chunk, in quanta (2**32 = exp(0)), from their
    # maxima ms and quanta sums zs; m > -inf
    return tl.where(ms == float("-inf"), 0.0, zs.to(tl.float32) * tl.exp(ms - m))


@helper
def chunks_log_z(ms, zs):
    # log sum exp(s - m) from the chunks' quanta sums (the logprob's normaliser), m = max(ms)
    m = tl.max(ms, 0)
    z = tl.sum(chunk_mass(ms, zs, tl.where(m == float("-inf"), 0.0, m)), 0) * (1.0 / 4294967296.0)
    return tl.log(tl.where(z > 0.0, z, 1.0))  # 0 only on an empty row (logprob -inf anyway)


@helper
def chunk_row(logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, S, HAS_ROW_MAP: tl.constexpr,
              LAST_FIRST: tl.constexpr = False):  # fmt: skip
    # program (row, c) of a split pass -> (row index, c, row as int64, the row's logits and
    # bitmask pointers, whether the row is masked). LAST_FIRST: the programs take the (row, c)
    # in reverse order, so a pass after pass 1 starts on the tiles pass 1 read last (still in L2)
    pid = tl.program_id(0)
    if LAST_FIRST:
        pid = tl.num_programs(0) - 1 - pid
    r = pid // S
    c = pid - r * S
    row, lrow, mrow_ptr, has_row_mask = row_ptrs(
        r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP
    )
    return r, c, row, lrow, mrow_ptr, has_row_mask


@helper
def row_ptrs(r, logits_ptr, stride_lb, mask_ptr, stride_mb, mask_row_ptr, HAS_ROW_MAP: tl.constexpr):
    # row r -> (row as int64, its logits and bitmask pointers, whether the row is masked)
    row = r.to(tl.int64)
    has_row_mask = True
    if HAS_ROW_MAP:
        has_row_mask = tl.load(mask_row_ptr + r) != 0
    return row, logits_ptr + row * stride_lb, mask_ptr + row * stride_mb, has_row_mask


@helper
def tile2d(lrow, stride_lv, mrow_ptr, has_row_mask, c, V, HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):
    # tile c of a row's masked logits as [CHUNK / G, G], G = min(32, CHUNK): token
    # c * CHUNK + G * i + j at [i, j] (-inf outside V or where the bitmask forbids), and the
    # tokens' indices in the tile. A row of the tile lies in one bitmask word, so each word is
    # loaded once and tested against the column's bit (no per-token gather of its word)
    G: tl.constexpr = 32 if CHUNK >= 32 else CHUNK
    start = c * CHUNK + G * tl.arange(0, CHUNK // G)  # each row's first token
    col = tl.arange(0, G)
    offs = start[:, None] + col[None, :]
    x = tl.load(lrow + offs.to(tl.int64) * stride_lv, mask=offs < V, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        words = tl.load(mrow_ptr + start // 32, mask=start < V, other=-1)
        words = tl.where(has_row_mask, words, -1)
        if G == 32:  # one AND a token against the column's bit
            ok = (words[:, None] & (1 << col)[None, :]) != 0
        else:
            ok = ((words[:, None] >> ((start % 32)[:, None] + col[None, :])) & 1) != 0
        x = tl.where(ok, x, float("-inf"))
    return x, offs - c * CHUNK


@helper
def argmax2d(x, local, CHUNK: tl.constexpr):
    # the max of a 2-D tile and its lowest index (NaN max: index 0)
    m = tl.max(x)
    bi = tl.min(tl.where(x == m, local, CHUNK))
    return m, tl.where(bi == CHUNK, 0, bi)


# ---------------------------------------------------------------- host side of the launches

_pdl_ok: dict[torch.device, bool] = {}


def pdl_device(dev: torch.device) -> bool:
    """Whether launches on ``dev`` can use programmatic dependent launch (a CUDA device of compute
    capability 9 or later, a Triton that has it, not the interpreter); kept per device."""
    ok = _pdl_ok.get(dev)
    if ok is None:
        ok = (
            HAS_PDL and not INTERPRET and dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        )
        _pdl_ok[dev] = ok
    return ok


def dependent(pdl: bool) -> dict:
    """The launch option of a launch after pass 1 that starts early (pass 1 waits for everything
    before it)."""
    return {"launch_pdl": True} if pdl else {}


def launch_opts(warps: int) -> dict:
    # no FMA contraction: s = x * inv_t rounds as in torch
    return {} if INTERPRET else {"num_warps": warps, "enable_fp_fusion": False}


def block_size(V: int, block_max: int) -> int:
    """Tokens a step of a per-row loop: depends on V only."""
    return min(block_max, triton.next_power_of_2(V))


class RowArgs(NamedTuple):
    """The rows of a sampling call as every launch takes them: ``logits`` (the logits and their
    two strides), then ``mask`` (the bitmask, its row stride and the [B] int32 row map: 1 = row
    masked; placeholders where absent) and the constexpr ``flags`` HAS_MASK, HAS_ROW_MAP."""

    logits: tuple
    mask: tuple
    flags: dict


def row_map(B: int, bitmask: torch.Tensor | None, indices: torch.Tensor | None, dev) -> torch.Tensor | None:
    """1 for each of ``B`` rows that ``indices`` names as masked, else 0 (int32 on ``dev``);
    None without a bitmask or indices (then every row of the bitmask is a row's own)."""
    if bitmask is None or indices is None:
        return None
    out = torch.zeros(B, dtype=torch.int32, device=dev)
    # (not out[i] = 1: on CUDA that copies the 1 from the host and waits for the device)
    return out.index_fill_(0, indices.to(device=dev, dtype=torch.int64), 1)


def row_args(logits: torch.Tensor, bitmask: torch.Tensor | None, indices: torch.Tensor | None,
             placeholder: torch.Tensor) -> RowArgs:  # fmt: skip
    """:class:`RowArgs` of a [B, V] call (the row map only when ``indices`` names the masked rows;
    ``placeholder`` stands for what is absent, never read)."""
    rows = row_map(logits.shape[0], bitmask, indices, logits.device)
    mask = (
        bitmask if bitmask is not None else placeholder, bitmask.stride(0) if bitmask is not None else 0,
        rows if rows is not None else placeholder,
    )  # fmt: skip
    flags = dict(HAS_MASK=bitmask is not None, HAS_ROW_MAP=rows is not None)
    return RowArgs((logits, logits.stride(0), logits.stride(1)), mask, flags)
