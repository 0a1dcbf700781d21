"""Triton kernels of norm_matmul.py (see there for what they compute and how they round).

Imported only when a fused op runs. Under TRITON_INTERPRET=1 (set before this import) they run
on CPU tensors. A program computes one row's block of columns, so a row's result does not
depend on the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import dependent, gdc_launch_dependents, gdc_wait, helper


@helper
def _row_dots(x_ptr, d_ptr, ln_ptr, w_ptr, s_ptr, row, H, stride_x, stride_d, stride_s, stride_w, eps,
              c1, c2, cm, store_s, HAS_D: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr,
              BK: tl.constexpr):  # fmt: skip
    # one row's h @ w[:, c1] (and h @ w[:, c2] with TWO), h = norm(x + d) (NORM; else x + d), in
    # float32, not rounded; s = x + d stored where store_s. One pass over K: (s * ln) @ w and the
    # row's sum of squares of s together, the sums scaled by the row's 1 / rms at the end. The
    # products are summed elementwise in [BK, columns] float32 tiles, reduced over K once at the end
    dt = s_ptr.dtype.element_ty
    ks0 = tl.arange(0, BK)
    acc = tl.zeros([BK, c1.shape[0]], tl.float32)
    acc2 = tl.zeros([BK, c1.shape[0]], tl.float32)
    sq = tl.zeros([BK], tl.float32)
    for k0 in range(0, H, BK):
        ks = k0 + ks0
        km = ks < H
        wk = w_ptr + ks.to(tl.int64)[:, None] * stride_w
        wm = km[:, None] & cm[None, :]
        w1 = tl.load(wk + c1[None, :], mask=wm, other=0.0)
        if TWO:
            w2 = tl.load(wk + c2[None, :], mask=wm, other=0.0)
        xv = tl.load(x_ptr + row * stride_x + ks, mask=km, other=0.0)
        if HAS_D:
            dv = tl.load(d_ptr + row * stride_d + ks, mask=km, other=0.0)
            xv = (xv.to(tl.float32) + dv.to(tl.float32)).to(dt)  # the residual, rounded
            if store_s:
                tl.store(s_ptr + row * stride_s + ks, xv, mask=km)
        xf = xv.to(tl.float32)
        if NORM:
            sq += xf * xf
            g = tl.load(ln_ptr + ks, mask=km, other=0.0).to(tl.float32)
            xf = (xf * g).to(dt).to(tl.float32)
        a = xf[:, None]
        acc += a * w1.to(tl.float32)
        if TWO:
            acc2 += a * w2.to(tl.float32)
    y1 = tl.sum(acc, 0)
    y2 = tl.sum(acc2, 0)
    if NORM:
        r = 1.0 / tl.sqrt(tl.sum(sq, 0) / H + eps)
        y1 = y1 * r
        y2 = y2 * r
    return y1, y2


@helper
def _rounded(a, b, dt):
    # a + b with a and b rounded to dt first, then the sum (torch's bits of a product and a sum)
    return (a.to(dt).to(tl.float32) + b.to(dt).to(tl.float32)).to(dt)


@triton.jit
def _norm_matmul_kernel(x_ptr, d_ptr, ln_ptr, w_ptr, s_ptr, out_ptr, H, N, stride_x, stride_d, stride_s,
                        stride_w, stride_o, eps, HAS_D: tl.constexpr, NORM: tl.constexpr,
                        GLU: tl.constexpr, GELU: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        PDL: tl.constexpr):  # fmt: skip
    # program (column block n, row m): out[m, n cols] of norm(x + d) @ w (NORM; else (x + d) @ w),
    # or with GLU act(h @ w[:, cols]) * (h @ w[:, N + cols]); the programs of column block 0 store
    # s = x + d
    if PDL:  # launched early (programmatic dependent launch): wait for the kernel before
        gdc_wait()
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    dt = out_ptr.dtype.element_ty
    ns = pid_n * BN + tl.arange(0, BN)
    nm = ns < N
    y, u = _row_dots(x_ptr, d_ptr, ln_ptr, w_ptr, s_ptr, row, H, stride_x, stride_d, stride_s, stride_w,
                     eps, ns, N + ns, nm, pid_n == 0, HAS_D, NORM, GLU, BK)  # fmt: skip
    y = y.to(dt)  # the matmul's output, rounded as the unfused one's
    if GLU:
        gf = y.to(tl.float32)
        if GELU:  # as fused_triton's glu
            t = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
            act = (0.5 * gf * (2.0 * tl.sigmoid(2.0 * t))).to(dt)
        else:
            act = (gf * tl.sigmoid(gf)).to(dt)
        y = (act.to(tl.float32) * u.to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + row * stride_o + ns, y, mask=nm)


@triton.jit
def _norm_qkv_rope_kernel(x_ptr, d_ptr, ln_ptr, w_ptr, s_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr,
                          pos_ptr, slot_ptr, H, NH, NKV, stride_x, stride_d, stride_s, stride_w, stride_q,
                          stride_c, stride_cos, eps, HAS_D: tl.constexpr, HD: tl.constexpr,
                          BP: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # program (block of BP rotation pairs of one head, row m): the q|k|v projection of norm(x + d)
    # at the pairs' columns (d, d + HD / 2), RoPE at the row's position on a q or k head (as
    # fused_triton's rope_store rounds it), then stored: q heads to q [M, NH, HD], k and v heads
    # at the row's cache slot
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    dt = q_ptr.dtype.element_ty
    half: tl.constexpr = HD // 2
    head = pid * BP // half  # (BP divides HD / 2: a program's pairs lie in one head)
    j = (pid * BP) % half + tl.arange(0, BP)  # the pairs' first columns in the head
    lo = head * HD + j
    y1, y2 = _row_dots(x_ptr, d_ptr, ln_ptr, w_ptr, s_ptr, row, H, stride_x, stride_d, stride_s, stride_w,
                       eps, lo, lo + half, j < half, pid == 0, HAS_D, True, True, BK)  # fmt: skip
    x1 = y1.to(dt).to(tl.float32)  # the projection's outputs, rounded
    x2 = y2.to(dt).to(tl.float32)
    if head < NH + NKV:  # q or k: rotate_half, each product rounded, then the sum
        off = tl.load(pos_ptr + row).to(tl.int64) * stride_cos + j  # the position's row of the tables
        c1 = tl.load(cos_ptr + off).to(tl.float32)
        c2 = tl.load(cos_ptr + off + half).to(tl.float32)
        s1 = tl.load(sin_ptr + off).to(tl.float32)
        s2 = tl.load(sin_ptr + off + half).to(tl.float32)
        o1 = _rounded(x1 * c1, -x2 * s1, dt)
        o2 = _rounded(x2 * c2, x1 * s2, dt)
    else:
        o1 = x1.to(dt)
        o2 = x2.to(dt)
    if head < NH:
        out = q_ptr + row * stride_q + head * HD + j
    else:
        slot = tl.load(slot_ptr + row).to(tl.int64)
        if head < NH + NKV:
            out = kc_ptr + slot * stride_c + (head - NH) * HD + j
        else:
            out = vc_ptr + slot * stride_c + (head - NH - NKV) * HD + j
    tl.store(out, o1)
    tl.store(out + half, o2)


def norm_matmul(x, d, ln, w, eps: float, glu: str | None, tiles: tuple[int, int, int, int], pdl: bool):
    """(s, out): x, d [M, H] (d None: s is x), ln [H] (None: no norm), w [H, N or 2 N] with unit
    column stride. tiles: (BN, BK, warps, stages); pdl: launched as a programmatic dependent
    launch."""
    M, H = x.shape
    n = w.shape[1] // 2 if glu else w.shape[1]
    out = torch.empty(M, n, dtype=x.dtype, device=x.device)
    s = x if d is None else torch.empty_like(x)
    bn, bk, warps, stages = tiles
    if M and n:
        _norm_matmul_kernel[(triton.cdiv(n, bn), M)](
            x, x if d is None else d, x if ln is None else ln, w, s, out, H, n, x.stride(0),
            0 if d is None else d.stride(0), s.stride(0), w.stride(0), out.stride(0), eps,
            HAS_D=d is not None, NORM=ln is not None, GLU=glu is not None, GELU=glu == "gelu_tanh", BN=bn,
            BK=bk, PDL=pdl, num_warps=warps, num_stages=stages, **dependent(pdl),
        )  # fmt: skip
    return s, out


def norm_qkv_rope(x, d, ln, w, eps: float, cos, sin, positions, k_flat, v_flat, slots, nh: int, hd: int,
                  tiles: tuple[int, int, int, int], pdl: bool):  # fmt: skip
    """(s, q [M, nh, hd]): x, d [M, H], ln [H], w [H, (nh + 2 nkv) hd] with unit column stride;
    cos, sin [L, hd] (one stride); positions, slots [M]; k_flat, v_flat [slots, nkv, hd] with unit
    strides within a slot. tiles: (2 BP, BK, warps, stages)."""
    M, H = x.shape
    nkv = (w.shape[1] // hd - nh) // 2
    q = torch.empty(M, nh, hd, dtype=x.dtype, device=x.device)
    s = x if d is None else torch.empty_like(x)
    bn, bk, warps, stages = tiles
    bp = min(bn // 2, (hd // 2) & -(hd // 2))  # a power of 2 that divides hd / 2
    if M:
        _norm_qkv_rope_kernel[((nh + 2 * nkv) * hd // 2 // bp, M)](
            x, x if d is None else d, ln, w, s, q, k_flat, v_flat, cos, sin, positions, slots, H, nh, nkv,
            x.stride(0), 0 if d is None else d.stride(0), s.stride(0), w.stride(0), q.stride(0),
            k_flat.stride(0), cos.stride(0), eps, HAS_D=d is not None, HD=hd, BP=bp, BK=bk, PDL=pdl,
            num_warps=warps, num_stages=stages, **dependent(pdl),
        )  # fmt: skip
    return s, q
