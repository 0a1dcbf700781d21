"""Batch-invariant matmul and RMSNorm: a row's result depends on that row's inputs alone, not on
how many rows are computed with it or where it sits.

Deterministic decode on CUDA runs `LlamaModel.decode_static` with these (and the Triton decode
attention), so a request's logits are the same bits in a batch of 1 and in any batch bucket of
the CUDA graphs, with no fixed tile of rows to compute. cuBLAS promises no such thing: it picks
its kernel (and K split) by the problem's M, so a row's rounding changes with the batch.

What they compute, as loops (float32 accumulation, one rounding to the output dtype):

    matmul(a [M, K], w [K, N]):   out[m, n] = sum_k a[m, k] * w[k, n]
        in fixed order: splits of K chosen from (N, K) alone, each summed in BLOCK_K steps by
        the same tensor-core instructions, the splits then added in split order
    rms_norm(x [M, H], weight [H], eps):
        out[m] = (x[m] / sqrt(mean(x[m]^2) + eps)).to(x.dtype) * weight      (torch's F.rms_norm)

Both are Triton kernels (invariant_triton.py; CUDA, CPU under TRITON_INTERPRET=1), imported only
when called; `matmul_reference` and `rms_norm_reference` are the plain torch versions the tests
compare them against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def matmul(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a [..., K] @ w [K, N] -> [..., N] in a's dtype; w contiguous in N."""
    from . import invariant_triton as kt

    if a.shape[-1] != w.shape[0]:
        raise ValueError(f"matmul of [..., {a.shape[-1]}] by [{w.shape[0]}, {w.shape[1]}]")
    if w.stride(1) != 1:
        raise ValueError("matmul needs w contiguous in its last dimension")
    lead = a.shape[:-1]
    out = kt.matmul(a.reshape(-1, a.shape[-1]).contiguous(), w)
    return out.view(*lead, w.shape[1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm over the last dimension, one program a row."""
    from . import invariant_triton as kt

    lead = x.shape[:-1]
    return kt.rms_norm(x.reshape(-1, x.shape[-1]).contiguous(), weight, eps).view(*lead, x.shape[-1])


def matmul_reference(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (a.float() @ w.float()).to(a.dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
