"""The decoder layer's small ops, fused: one launch each where the plain torch path runs several.

A decode step at batch 1 reads every weight once, so its matmuls run near the memory floor and
the rest of a layer is launch latency: with CUDA graphs each kernel still costs a few
microseconds. These three functions cut a layer's kernels between its matmuls to one each:

    add_rms_norm(x, d, w, eps) -> (s, y):   s = x + d  (the residual stream; d None: s = x)
                                            y = rms_norm(s) * w      (torch's F.rms_norm)
    rope_store(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh) -> q:
        q|k heads of each token rotated by its position's RoPE (rotate-half layout), the q heads
        returned [N, nh, hd] contiguous, the k heads and v written at the token's cache slot
    glu(gu, act) -> silu(gate) * up  or  gelu_tanh(gate) * up, gate|up the halves of gu's last dim

Each has a torch reference (``*_reference``), the CPU path and the tests' oracle, computing
with the ops of the unfused layer: one rounding to the dtype after each elementwise op. The
Triton kernels (fused_triton.py; CUDA, CPU under TRITON_INTERPRET=1) are written with the same
roundings, and differ from the references within an ulp:

- `add_rms_norm`: the sum is rounded to x's dtype (torch's bits), then normalised in float32 over
  the whole row in one block (one program a row), the normalised row rounded, then times the
  weight and rounded again. The row's sum of squares is added in another order than torch's.
- `rope_store`: q*cos and rotate_half(q)*sin each rounded, then their sum. On the GPU the
  compiler may narrow a product to 16 bits and contract it with the sum into one fused
  multiply-add, so a value may be an ulp off torch's.
- `glu`: the activation in float32 rounded, then the product rounded. Triton's exp is not
  libm's, so the activation may differ from torch's in the last bit.

Every kernel works on each token (row) alone, so a row's result is the same whatever else is in
the batch: deterministic mode runs them too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu_tanh")
# Calls of at most this many rows (a decode step's at batch 1 or 2) launch as programmatic
# dependent launches where the device has them: these kernels, and the paged decode attention
# (paged_attention.py). 0: none. (At 16 and 64 rows they measured no faster, and SmolLM2's
# steps 2-3% slower: benchmarks/RESULTS.md, "Decode on the H100".)
PDL_ROWS = 2


def dependent_launch(t: torch.Tensor, rows: int) -> bool:
    """Whether a layer kernel of ``rows`` rows on t's device is a programmatic dependent launch."""
    from .triton_common import pdl_device

    return rows <= PDL_ROWS and pdl_device(t.device)


def add_rms_norm_reference(
    x: torch.Tensor, d: torch.Tensor | None, weight: torch.Tensor, eps: float, norm=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + d, norm(x + d, weight)); ``norm`` defaults to F.rms_norm over the last dimension."""
    s = x if d is None else x + d
    if norm is None:
        return s, F.rms_norm(s, (s.shape[-1],), weight, eps)
    return s, norm(s, weight)


def rope_store_reference(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots: torch.Tensor,
    nh: int,
) -> torch.Tensor:
    """qk: [N, nh + nkv, hd] (q heads then k heads); v: [N, nkv, hd]; cos, sin: [L, hd] tables;
    positions, slots: [N] int64; k_flat, v_flat: [slots, nkv, hd] (`KVCache.flat`). Writes each
    token's rotated k and its v at its slot; returns the rotated q [N, nh, hd]. ``positions``
    None: cos and sin are already the tokens' rows [N, hd] (gathered once for every layer)."""
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = qk.chunk(2, dim=-1)
    out = qk * c + torch.cat((-x2, x1), dim=-1) * s
    k_flat.index_copy_(0, slots, out[:, nh:])
    v_flat.index_copy_(0, slots, v)
    return out[:, :nh]


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin rows [..., hd] with their first half negated: what `rope_store_torch` takes."""
    h = sin.shape[-1] // 2
    return torch.cat((-sin[..., :h], sin[..., h:]), dim=-1)


def rope_store_torch(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    positions: torch.Tensor | None,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots: torch.Tensor,
    nh: int,
) -> torch.Tensor:
    """`rope_store_reference`'s bits in fewer ops (the CPU path): with ``sin_signed`` =
    `signed_sin` of the sin rows, ``rotate_half(x) * sin`` is ``roll(x, hd / 2) * sin_signed``
    (the same products: -x2 * s and x2 * -s round alike), so no halves are negated and joined in
    every layer. cos, sin_signed: the tokens' rows [N, hd] or [N, 1, hd] (``positions`` None) or
    tables."""
    if positions is not None:
        cos, sin_signed = cos[positions], sin_signed[positions]
    if cos.dim() == 2:
        cos, sin_signed = cos.unsqueeze(1), sin_signed.unsqueeze(1)
    out = qk * cos + qk.roll(qk.shape[-1] // 2, -1) * sin_signed
    k_flat.index_copy_(0, slots, out[:, nh:])
    v_flat.index_copy_(0, slots, v)
    return out[:, :nh]


def glu_reference(gu: torch.Tensor, act: str) -> torch.Tensor:
    gate, up = gu.chunk(2, dim=-1)
    if act == "silu":
        return F.silu(gate) * up
    if act == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"glu: act must be one of {ACTIVATIONS}, got {act!r}")


def add_rms_norm(
    x: torch.Tensor, d: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel of `add_rms_norm_reference` (x, d: [..., H], weight [H])."""
    from . import fused_triton as kt

    H = x.shape[-1]
    if weight.shape != (H,):
        raise ValueError(f"add_rms_norm: weight of shape {tuple(weight.shape)}, expected [{H}]")
    if d is not None and d.shape != x.shape:
        raise ValueError(f"add_rms_norm: d of shape {tuple(d.shape)}, expected x's {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, H)
    d2 = None if d is None else d.reshape(-1, H)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    d2 = d2 if d2 is None or d2.stride(-1) == 1 else d2.contiguous()
    s, y = kt.add_rms_norm(x2, d2, weight.contiguous(), eps, dependent_launch(x2, x2.shape[0]))
    return (x if d is None else s.view(*lead, H)), y.view(*lead, H)


def check_rope_rows(op: str, N: int, hd: int, cos, sin, positions, slots) -> None:
    """The checks of the tables and rows a RoPE + cache store kernel takes: cos and sin [L, hd],
    positions and slots [N] (ValueError naming ``op``)."""
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != hd:
        raise ValueError(f"{op}: cos {tuple(cos.shape)}, sin {tuple(sin.shape)}: expected [L, {hd}]")
    if positions.shape != (N,) or slots.shape != (N,):
        raise ValueError(f"{op}: positions {tuple(positions.shape)} and slots {tuple(slots.shape)}: "
                         f"expected [{N}]")  # fmt: skip


def rope_store(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    slots: torch.Tensor,
    nh: int,
) -> torch.Tensor:
    """The Triton kernel of `rope_store_reference` (its arguments; heads contiguous in qk and v).
    Positions must lie in the tables and slots in the cache (not checked: no host sync)."""
    from . import fused_triton as kt

    N, nqk, hd = qk.shape
    nkv = nqk - nh
    if hd % 2 or nkv < 1:
        raise ValueError(f"rope_store: qk of shape {tuple(qk.shape)} with nh={nh}: expected nh + nkv "
                         f"heads (nkv >= 1) of an even head_dim")  # fmt: skip
    if v.shape != (N, nkv, hd) or k_flat.shape[1:] != (nkv, hd) or v_flat.shape != k_flat.shape:
        raise ValueError(f"rope_store: v {tuple(v.shape)}, k_flat {tuple(k_flat.shape)}, v_flat "
                         f"{tuple(v_flat.shape)}: expected [{N}, {nkv}, {hd}] and "
                         f"[slots, {nkv}, {hd}]")  # fmt: skip
    for name, t in (("qk", qk), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != hd:
            raise ValueError(f"rope_store: expected {name}'s heads contiguous, got strides {t.stride()}")
    check_rope_rows("rope_store", N, hd, cos, sin, positions, slots)
    q = torch.empty(N, nh, hd, dtype=qk.dtype, device=qk.device)
    if N:
        kt.rope_store(qk, v, cos.contiguous(), sin.contiguous(), positions.contiguous(), k_flat, v_flat,
                      slots.contiguous(), q, nh, dependent_launch(q, N))  # fmt: skip
    return q


def glu(gu: torch.Tensor, act: str) -> torch.Tensor:
    """The Triton kernel of `glu_reference` (gu: [..., 2 I])."""
    from . import fused_triton as kt

    if act not in ACTIVATIONS:
        raise ValueError(f"glu: act must be one of {ACTIVATIONS}, got {act!r}")
    if gu.shape[-1] % 2:
        raise ValueError(f"glu: gate|up of odd width {gu.shape[-1]}")
    lead, two_i = gu.shape[:-1], gu.shape[-1]
    g2 = gu.reshape(-1, two_i)
    if g2.stride(-1) != 1:
        g2 = g2.contiguous()
    return kt.glu(g2, act == "gelu_tanh", dependent_launch(g2, g2.shape[0])).view(*lead, two_i // 2)
