"""The matmul of a model whose matrices may be kept quantized: ``x @ w`` for a dense tensor, an
`Int8Weight` (kernels/int8_weights.py) or an `Int4Weight` (kernels/int4_weights.py).

An int4 matrix times up to `GEMV_ROWS` activation rows (a decode step) goes through the C
kernel of kernels/int4_gemv.py where its build is loaded (int8 activations, as llama.cpp);
more rows (prefill), or no build, through torch's int4 kernel. `matmul_torch` never takes the
C kernel: a row's bits then do not depend on how many rows share the call (batch-invariant
mode).

Where torch's int4 kernel cannot read the planes (`int4_weights.torch_layout_problem`: torch's
AVX2 or plain build), every row takes the C kernel, in both: its rows' bits do not depend on
the batch either. The model's quantization is resolved so that the build is then loaded."""

from __future__ import annotations

import torch

from . import int4_gemv
from .int4_weights import Int4Weight, check_activations, int4_matmul, torch_layout_problem
from .int8_weights import Int8Weight, int8_matmul

_GEMV = int4_gemv.STATE
GEMV_ROWS = 4  # at most this many rows take the C kernel (measured: bench_cpu, kernels/int4_gemv.py)


def torch_reads_planes() -> bool:
    """Whether torch's int4 kernel reads the planes here (else every row takes the C kernel)."""
    return torch_layout_problem() is None


def _c_only(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Every row through the C kernel (torch's int4 kernel reads another layout here)."""
    if _GEMV.fn is None:
        raise RuntimeError(f"the int4 planes need the C kernel here ({int4_gemv.STATE.why}): "
                           f"{torch_layout_problem()}")  # fmt: skip
    check_activations(x, w)
    return int4_gemv.int4_gemv(x.contiguous(), w)


def matmul(x: torch.Tensor, w) -> torch.Tensor:
    t = type(w)
    if t is Int4Weight:
        if (
            _GEMV.fn is not None
            and x.dtype == torch.bfloat16
            and x.numel() <= GEMV_ROWS * w.k
            and x.shape[-1] == w.k
            and x.is_contiguous()
        ):
            return int4_gemv.int4_gemv(x, w)
        if not torch_reads_planes():
            return _c_only(x, w)
        return int4_matmul(x, w)
    if t is Int8Weight:
        return int8_matmul(x, w)
    return torch.matmul(x, w)


def matmul_torch(x: torch.Tensor, w) -> torch.Tensor:
    """`matmul` without the C kernel: torch's kernels only (but where torch's int4 kernel cannot
    read the planes: the C kernel for every row)."""
    t = type(w)
    if t is Int4Weight:
        return int4_matmul(x, w) if torch_reads_planes() else _c_only(x, w)
    if t is Int8Weight:
        return int8_matmul(x, w)
    return torch.matmul(x, w)
