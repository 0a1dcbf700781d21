"""A CPU decode step's SwiGLU, ``silu(gate) * up``, in one C call (``glu.c``, built into the library
of kernels/int4_gemv.py): torch's chunk, silu and mul cost ~9 µs a layer at SmolLM2's shapes,
mostly dispatch. The arithmetic is `fused.glu_reference`'s, rounding for rounding, with an exp
within 1 ulp of ``expf``: an output may differ from torch's by a bfloat16 step where a value lies
on a rounding boundary (1 of the 65,280 finite bfloat16 gates)."""

from __future__ import annotations

import torch

from .int4_gemv import STATE

ROWS = 4  # at most this many rows take the C call (a decode step's)


def usable(gu: torch.Tensor, act: str) -> bool:
    """Whether `glu_silu` takes ``gu`` [..., 2 I] with ``act``: the library loaded, SiLU, a few
    contiguous bfloat16 rows on the CPU."""
    return (
        STATE.glu is not None
        and act == "silu"
        and gu.dtype == torch.bfloat16
        and gu.device.type == "cpu"
        and gu.shape[-1] % 2 == 0
        and 0 < gu.numel() <= ROWS * gu.shape[-1]
        and gu.is_contiguous()
    )


def glu_silu(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of ``gu`` = gate | up [..., 2 I] -> [..., I] bfloat16 (`usable` must hold)."""
    width = gu.shape[-1] // 2
    out = torch.empty(*gu.shape[:-1], width, dtype=torch.bfloat16)
    STATE.glu(gu.data_ptr(), gu.numel() // (2 * width), width, out.data_ptr())
    return out
