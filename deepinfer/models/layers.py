"""The parts of a decoder layer: its weights (`Layer`), RoPE tables, norms, activations, soft-caps.

What a family changes is data on the layer (a q/k norm, the sandwich norms, its sliding window
and RoPE table, a mixture of experts instead of the dense MLP); the generic decoder in llama.py
runs every family through the same loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from .moe import MoE


@dataclass
class Layer:
    """Matrices are stored transposed, [in, out], for `x @ w`: on CPU that ran 1.4x faster than
    F.linear's [out, in] at batch 1 (float32, 1 thread, weights beyond the caches). Norm weights
    are the scale applied (Gemma's (1 + w) folded in at load)."""

    ln1: torch.Tensor  # [H]
    wqkv: torch.Tensor  # [H, (nh + 2 nkv) hd]
    bqkv: torch.Tensor | None
    wo: torch.Tensor  # [nh hd, H]
    ln2: torch.Tensor  # [H]
    wgu: torch.Tensor | None  # [H, 2 I] (None: a mixture-of-experts layer)
    wd: torch.Tensor | None  # [I, H]
    q_norm: torch.Tensor | None = None  # [hd] (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    post_attn: torch.Tensor | None = None  # [H] norm of the attention output (Gemma)
    post_mlp: torch.Tensor | None = None  # [H] norm of the MLP output (Gemma)
    moe: MoE | None = None
    window: int = 0  # sliding window (0: global)
    softcap: float = 0.0  # attention scores soft-capped at this (0: not; Gemma 2)
    local: bool = False  # RoPE from the local table (Gemma 3's sliding-window layers)


def rope_inv_freq(
    config: ModelConfig, freq_factors: torch.Tensor | None = None, *, local: bool = False
) -> torch.Tensor:
    """inv_freq [head_dim / 2] float32, with linear or llama3 scaling as transformers computes it.
    local: the sliding-window layers' table (base rope_local_theta, unscaled: Gemma 3)."""
    dim = config.head_dim
    theta = config.rope_local_theta if local else config.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = None if local else config.rope_scaling
    kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
    if kind == "linear":
        inv = inv / float(s["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
        inv = torch.where(medium, smoothed, scaled)
    if freq_factors is not None:  # GGUF's rope_freqs.weight (llama3 scaling baked as divisors)
        inv = inv / freq_factors.float()
    return inv


def rope_tables(inv: torch.Tensor, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [length, head_dim] of the rotate-half layout."""
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


class Ops(NamedTuple):
    """The ops of one forward: matmul, rms_norm(x, w), add_norm(x, d, w) -> (x + d, norm(x + d, w))
    (d None: x itself), rope_store(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh) -> q
    (RoPE on q|k, k and v written at the slots), glu(gate|up, act) (deepinfer.kernels.fused) and
    norm_mm(x, d, w, m, act=None) -> (x + d, norm(x + d, w) @ m), with glu(..., act) after the
    matmul when act is given, and norm_qkv_rope(x, d, w, m, cos, sin, positions, k_flat, v_flat,
    slots, nh) -> (x + d, q): norm_mm's q|k|v, then rope_store (deepinfer.kernels.norm_matmul:
    one launch each where it serves)."""

    mm: Callable
    norm: Callable
    add_norm: Callable
    rope_store: Callable
    glu: Callable
    norm_mm: Callable
    norm_qkv_rope: Callable


def ops(
    invariant: bool, eps: float, fused: bool = False, quantized: bool = False, fused_matmul: bool = False
) -> Ops:
    """The ops of a forward: torch's, or the batch-invariant Triton matmul and RMSNorm of
    deepinfer.kernels.invariant (a row's bits do not depend on the other rows); with ``fused``
    (CUDA) the Triton kernels of deepinfer.kernels.fused for the add + norms, RoPE + cache store
    and GLU, else their torch references (RoPE: `rope_store_torch`, the reference's bits with a
    signed sin table; each kernel works on one row: invariant too). With
    ``quantized`` the matmul also takes the int8 and int4 matrices of deepinfer.kernels.quantized.
    With ``fused`` and ``fused_matmul`` (and not ``invariant``: its matmul is the batch-invariant one)
    ``mm`` and ``norm_mm`` run deepinfer.kernels.norm_matmul's kernel where `use_fused` says it
    serves (a few rows, small matrices; one row's plain product also a wide one), else the ops
    above (norm_mm: the add + norm, the matmul and the GLU)."""
    from ..kernels import fused as fk
    from ..kernels import norm_matmul as nmk

    if invariant:
        from ..kernels import invariant as bi

        mm, norm = bi.matmul, lambda x, w: bi.rms_norm(x, w, eps)
    else:
        mm, norm = torch.matmul, lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps)
    if quantized:  # batch-invariant: torch's kernels only (the C kernel serves a few rows)
        from ..kernels import quantized as q

        mm = q.matmul_torch if invariant else q.matmul
    if fused:
        add_norm, rope_store, glu = lambda x, d, w: fk.add_rms_norm(x, d, w, eps), fk.rope_store, fk.glu
    else:
        from ..kernels import glu_c as cg
        from ..kernels import rope_store_c as cr

        def glu(gu, act):
            if not invariant and cg.usable(gu, act):  # a decode step's SwiGLU: one C call (its exp
                return cg.glu_silu(gu)  # is not torch's: a row's bits would depend on its batch)
            return fk.glu_reference(gu, act)

        def rope_store(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh):
            if cr.usable(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh):  # a decode step: one C call
                return cr.rope_store(qk, v, cos, sin, k_flat, v_flat, slots, nh)  # (rope_store_torch's bits)
            return fk.rope_store_torch(qk, v, cos, sin, positions, k_flat, v_flat, slots, nh)

        if invariant:
            add_norm = lambda x, d, w: fk.add_rms_norm_reference(x, d, w, eps, norm)  # noqa: E731
        else:  # add_rms_norm_reference's ops, called straight (61 times a decode step on the CPU)
            rms = torch.rms_norm  # (what F.rms_norm calls)
            from ..kernels import add_rms_norm as cn

            def add_norm(x, d, w):
                if cn.usable(x, d, w):  # a decode step's few rows: one C call (kernels/add_rms_norm.c)
                    return cn.add_rms_norm(x, d, w, eps)
                s = x if d is None else x + d
                return s, rms(s, (s.shape[-1],), w, eps)

    def norm_mm(x, d, w, m, act=None):
        s, h = add_norm(x, d, w)
        y = mm(h, m)
        return s, (y if act is None else glu(y, act))

    def norm_qkv_rope(x, d, w, m, cos, sin, positions, k_flat, v_flat, slots, nh):
        s, qkv = norm_mm(x, d, w, m)
        nkv, hd = k_flat.shape[1:]
        qkv = qkv.view(s.shape[0], nh + 2 * nkv, hd)
        return s, rope_store(
            qkv[:, : nh + nkv], qkv[:, nh + nkv :], cos, sin, positions, k_flat, v_flat, slots, nh
        )

    if not (fused and fused_matmul and not invariant):
        return Ops(mm, norm, add_norm, rope_store, glu, norm_mm, norm_qkv_rope)

    # one row's small matmuls: one kernel each
    def mm_one_row(x, m):
        return nmk.norm_matmul(x, None, None, m, eps)[1] if nmk.use_fused(x, m, plain=True) else mm(x, m)

    def norm_mm_one_row(x, d, w, m, act=None):
        return nmk.norm_matmul(x, d, w, m, eps, act) if nmk.use_fused(x, m) else norm_mm(x, d, w, m, act)

    def norm_qkv_rope_one_row(x, d, w, m, cos, sin, positions, *rest):
        if nmk.use_fused(x, m) and positions is not None:
            return nmk.norm_qkv_rope(x, d, w, m, eps, cos, sin, positions, *rest)
        return norm_qkv_rope(x, d, w, m, cos, sin, positions, *rest)

    return Ops(mm_one_row, norm, add_norm, rope_store, glu, norm_mm_one_row, norm_qkv_rope_one_row)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma's logit soft-capping); x itself when cap is None."""
    return x if cap is None else torch.tanh(x / cap) * cap
