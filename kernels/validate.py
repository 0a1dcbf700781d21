"""Argument checks of the public functions: a ValueError that names the argument.

Shapes and dtypes are always checked; value checks (``validate=True``) read the tensors, a host
sync on CUDA, so the hot path passes ``validate=False`` with values checked upstream.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from .sample_reference import KINDS

BACKENDS = ("auto", "triton", "torch")
LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Scalar = int | float
PerRow = torch.Tensor | Sequence[Scalar] | Scalar


def use_triton(backend: str, device: torch.device) -> bool:
    """Whether ``backend`` on ``device`` runs the Triton kernels (else the torch reference):
    "torch", or "auto" off CUDA, is the reference; "triton" off CUDA needs the interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return False
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before import, "
            f"got device {device}"
        )
    return True


def check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 2-D tensor [batch, vocab], got {shape}")
    if logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")


def check_bitmask(bitmask: torch.Tensor, logits: torch.Tensor) -> None:
    B, V = logits.shape
    if not isinstance(bitmask, torch.Tensor):
        raise ValueError(f"bitmask must be an int32 tensor, got {type(bitmask).__name__}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must have dtype torch.int32, got {bitmask.dtype}")
    want = (B, (V + 31) // 32)
    if tuple(bitmask.shape) != want:
        raise ValueError(
            f"bitmask must have shape [batch, ceil(vocab/32)] = {list(want)}, got {list(bitmask.shape)}"
        )
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask must be on the logits' device {logits.device}, got {bitmask.device}")
    if bitmask.stride(1) != 1:
        raise ValueError("bitmask must be contiguous along its last dimension")


def check_indices(indices, B: int, device: torch.device, validate: bool) -> torch.Tensor | None:
    """The row ids as an int64 tensor on ``device`` (None: every row)."""
    if indices is None:
        return None
    t = torch.as_tensor(indices, device=device)
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"indices must be a 1-D integer sequence of row ids, got {t.dtype} {list(t.shape)}")
    t = t.to(torch.int64)
    if validate and t.numel() and (bool((t < 0).any()) or bool((t >= B).any())):
        raise ValueError(f"indices must be row ids in [0, {B}), got {t.tolist()}")
    return t


def check_kinds(kinds: str) -> None:
    if kinds not in KINDS:
        raise ValueError(f"kinds must be one of {', '.join(map(repr, KINDS))}, got {kinds!r}")


def per_row(name: str, value: PerRow, B: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``value`` (a scalar or B values) as a contiguous [B] tensor of ``dtype`` on ``device``."""
    t = torch.as_tensor(value, device=device)
    if t.dtype == torch.bool or (dtype.is_floating_point is False and t.dtype.is_floating_point):
        raise ValueError(
            f"{name} must be {'integers' if not dtype.is_floating_point else 'numbers'}, got {t.dtype}"
        )
    if t.dim() == 0:
        t = t.expand(B)
    if t.shape != (B,):
        raise ValueError(f"{name} must be a scalar or have shape [{B}], got {list(t.shape)}")
    return t.to(dtype).contiguous()


def _check_values(temperature, top_k, top_p, min_p) -> None:
    # a host sync on CUDA: pass validate=False on the hot path (values checked upstream)
    if not bool(torch.isfinite(temperature).all()) or bool((temperature < 0).any()):
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature.tolist()}")
    if bool((top_k < 0).any()):
        raise ValueError(f"top_k must be >= 0 (0 = no top-k), got {top_k.tolist()}")
    if not bool(((top_p > 0) & (top_p <= 1)).all()):
        raise ValueError(f"top_p must be in (0, 1], got {top_p.tolist()}")
    if not bool(((min_p >= 0) & (min_p <= 1)).all()):
        raise ValueError(f"min_p must be in [0, 1], got {min_p.tolist()}")


def sampling_rows(B: int, dev: torch.device, validate: bool, temperature, top_k, top_p, min_p, seed, step):
    """The per-row sampling settings as [B] tensors on ``dev`` (values checked if ``validate``):
    temperature, top_p, min_p float32; top_k, seed, step int64."""
    rows = (
        per_row("temperature", temperature, B, dev, torch.float32),
        per_row("top_k", top_k, B, dev, torch.int64),
        per_row("top_p", top_p, B, dev, torch.float32),
        per_row("min_p", min_p, B, dev, torch.float32),
        per_row("seed", seed, B, dev, torch.int64),
        per_row("step", step, B, dev, torch.int64),
    )
    if validate:
        _check_values(*rows[:4])
    return rows


def check_verify_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 3-D tensor [batch, drafts + 1, vocab], got {shape}")
    if logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.shape[1] < 1:
        raise ValueError("logits must have at least one position (K + 1 >= 1)")


def check_drafts(drafts, B: int, T: int, device: torch.device) -> torch.Tensor:
    """The drafts as an int64 [B, T - 1] tensor on ``device``."""
    drafts = torch.as_tensor(drafts, device=device)
    if drafts.dim() != 2 or tuple(drafts.shape) != (B, T - 1) or drafts.dtype.is_floating_point:
        raise ValueError(f"drafts must be an integer tensor of shape [{B}, {T - 1}], got "
                         f"{drafts.dtype} {list(drafts.shape)}")  # fmt: skip
    return drafts.to(torch.int64)


def check_verify_bitmask(bitmask: torch.Tensor, logits: torch.Tensor) -> None:
    B, T, V = logits.shape
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be an int32 tensor, got {getattr(bitmask, 'dtype', type(bitmask))}")
    want = (B, T, (V + 31) // 32)
    if tuple(bitmask.shape) != want:
        raise ValueError(f"bitmask must have shape [batch, drafts + 1, ceil(vocab/32)] = {list(want)}, "
                         f"got {list(bitmask.shape)}")  # fmt: skip
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask must be on the logits' device {logits.device}, got {bitmask.device}")
    if bitmask.stride(2) != 1:
        raise ValueError("bitmask must be contiguous along its last dimension")


def check_num_drafts(n: torch.Tensor, K: int) -> None:
    # a host sync on CUDA (validate=True only)
    if bool((n < 0).any()) or bool((n > K).any()):
        raise ValueError(f"num_drafts must be in [0, {K}], got {n.tolist()}")
