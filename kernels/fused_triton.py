"""Triton kernels of fused.py (see there for what they compute and how they round).

Imported only when a fused op runs: importing triton is not free, and the CPU path never needs
it. Under TRITON_INTERPRET=1 (set before this import) they run on CPU tensors. Launch shapes
depend on the problem's widths alone, never on the number of rows. With ``pdl`` a kernel is a
programmatic dependent launch: it starts while the kernel before it ends, and waits for it
before reading anything; it lets the kernel after it start early in turn.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import dependent, gdc_launch_dependents, gdc_wait

GLU_BLOCK = 1024  # elements of a glu program
ROPE_ELEMS = 2048  # about this many elements (heads x head_dim) a rope_store program


def _norm_warps(block: int) -> int:
    return 4 if block <= 1024 else 8


@triton.jit
def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, s_ptr, y_ptr, stride_x, stride_d, stride_s, stride_y, H, eps,
                         HAS_D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # one program a row; the whole row in one block, so its sum has one order
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_D:
        d = tl.load(d_ptr + row * stride_d + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(s_ptr.dtype.element_ty)  # the residual, rounded
        tl.store(s_ptr + row * stride_s + cols, x, mask=m)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    y = (xf * r).to(y_ptr.dtype.element_ty)  # as torch: normalise in float32, round, then weight
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (y.to(tl.float32) * w).to(y_ptr.dtype.element_ty), mask=m)


def add_rms_norm(x: torch.Tensor, d: torch.Tensor | None, weight: torch.Tensor, eps: float, pdl: bool):
    M, H = x.shape
    y = torch.empty_like(x)
    s = x if d is None else torch.empty_like(x)
    if M:
        block = triton.next_power_of_2(H)
        _add_rms_norm_kernel[(M,)](
            x, x if d is None else d, weight, s, y, x.stride(0), 0 if d is None else d.stride(0), s.stride(0),
            y.stride(0), H, eps, HAS_D=d is not None, BLOCK=block, PDL=pdl, num_warps=_norm_warps(block),
            **dependent(pdl),
        )  # fmt: skip
    return s, y


@triton.jit
def _rope_store_kernel(qk_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr,
                       stride_qk, stride_v, stride_cos, stride_q, stride_c, NH, NKV,
                       HD: tl.constexpr, HB: tl.constexpr, HALF_PAD: tl.constexpr,
                       HD_PAD: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # program (token n, block of HB heads of the nh q, nkv k and nkv v heads, in that order). Each
    # head is read and written as its two halves, at offsets linear in the lane (masks, not
    # clamped offsets), so the loads and stores are whole vectors.
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    half: tl.constexpr = HD // 2
    j = tl.arange(0, HALF_PAD)
    jm = j < half
    pos = tl.load(pos_ptr + n).to(tl.int64)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    is_q = h < NH
    is_k = (h >= NH) & (h < NH + NKV)
    rot = (h < NH + NKV)[:, None] & jm[None, :]
    at = h[:, None] * HD + j[None, :]
    x1 = tl.load(qk_ptr + n * stride_qk + at, mask=rot, other=0.0).to(tl.float32)
    x2 = tl.load(qk_ptr + n * stride_qk + at + half, mask=rot, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + pos * stride_cos + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + pos * stride_cos + half + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + pos * stride_cos + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + pos * stride_cos + half + j, mask=jm, other=0.0).to(tl.float32)[None, :]
    dt = q_ptr.dtype.element_ty
    # rotate_half(x) = (-x2, x1); each product rounded, then the sum: torch's bits
    o1 = ((x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)).to(dt)
    qm = is_q[:, None] & jm[None, :]
    tl.store(q_ptr + n * stride_q + at, o1, mask=qm)
    tl.store(q_ptr + n * stride_q + at + half, o2, mask=qm)
    km = is_k[:, None] & jm[None, :]
    k_at = kc_ptr + slot * stride_c + at - NH * HD
    tl.store(k_at, o1, mask=km)
    tl.store(k_at + half, o2, mask=km)
    d = tl.arange(0, HD_PAD)
    vm = ((h >= NH + NKV) & (h < NH + 2 * NKV))[:, None] & (d < HD)[None, :]
    v_at = (h[:, None] - NH - NKV) * HD + d[None, :]
    vv = tl.load(v_ptr + n * stride_v + v_at, mask=vm, other=0.0)
    tl.store(vc_ptr + slot * stride_c + v_at, vv, mask=vm)


def rope_store(qk, v, cos, sin, positions, k_flat, v_flat, slots, q, nh: int, pdl: bool) -> None:
    N, nqk, hd = qk.shape
    nkv = nqk - nh
    hd_pad = triton.next_power_of_2(hd)
    hb = min(triton.next_power_of_2(nh + 2 * nkv), max(1, ROPE_ELEMS // hd_pad))
    grid = (N, triton.cdiv(nh + 2 * nkv, hb))
    _rope_store_kernel[grid](
        qk, v, cos, sin, positions, slots, q, k_flat, v_flat, qk.stride(0), v.stride(0), cos.stride(0),
        q.stride(0), k_flat.stride(0), nh, nkv, HD=hd, HB=hb, HALF_PAD=triton.next_power_of_2(hd // 2),
        HD_PAD=hd_pad, PDL=pdl, num_warps=4, **dependent(pdl),
    )  # fmt: skip


@triton.jit
def _glu_kernel(
    gu_ptr, out_ptr, stride_gu, stride_o, I, GELU: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + I + cols, mask=m, other=0.0)
    dt = out_ptr.dtype.element_ty
    if GELU:  # 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanh(t) = 2 sigmoid(2t) - 1
        t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = (0.5 * g * (2.0 * tl.sigmoid(2.0 * t))).to(dt)
    else:
        a = (g * tl.sigmoid(g)).to(dt)
    tl.store(out_ptr + row * stride_o + cols, (a.to(tl.float32) * u.to(tl.float32)).to(dt), mask=m)


def glu(gu: torch.Tensor, gelu: bool, pdl: bool) -> torch.Tensor:
    M, two_i = gu.shape
    i = two_i // 2
    out = torch.empty(M, i, dtype=gu.dtype, device=gu.device)
    if M and i:
        block = min(GLU_BLOCK, triton.next_power_of_2(i))
        grid = (M, triton.cdiv(i, block))
        _glu_kernel[grid](gu, out, gu.stride(0), out.stride(0), i, GELU=gelu, BLOCK=block, PDL=pdl,
                          num_warps=4, **dependent(pdl))  # fmt: skip
    return out
