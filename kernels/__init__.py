"""Device side of structured generation: bitmask apply and the fused sampling kernel.

``backend="auto"`` runs the Triton kernel on CUDA tensors and the torch reference on CPU;
``"triton"`` forces Triton (on CPU only under ``TRITON_INTERPRET=1``); ``"torch"`` forces the
reference. Triton is imported only when a Triton backend is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import reference

__all__ = ["SampleOutput", "apply_bitmask_", "sample", "reference"]

_BACKENDS = ("auto", "triton", "torch")
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Scalar = int | float
PerRow = torch.Tensor | Sequence[Scalar] | Scalar


class SampleOutput(NamedTuple):
    """What :func:`sample` returns.

    Attributes
    ----------
    tokens : torch.Tensor
        [B] int64, the chosen token of each row; -1 where the row has no allowed token.
    empty : torch.Tensor
        [B] bool, True where the bitmask (and -inf logits) left no token to choose.
    logprobs : torch.Tensor or None
        [B] float32 log-probability of the token under the masked, tempered distribution
        (before top-k / top-p / min-p; temperature 1 for greedy rows); -inf on empty rows.
        None unless ``return_logprobs=True``.
    """

    tokens: torch.Tensor
    empty: torch.Tensor
    logprobs: torch.Tensor | None


def _backend(backend: str, device: torch.device):
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return reference
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before import, got device {device}"
        )
    try:
        from . import sample_triton
    except ImportError as e:  # pragma: no cover - triton is a dependency
        raise ImportError("backend='triton' needs the 'triton' package: pip install triton") from e
    return sample_triton


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 2-D tensor [batch, vocab], got {shape}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")


def _check_bitmask(bitmask: torch.Tensor, logits: torch.Tensor) -> None:
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


def _check_indices(indices, B: int, device: torch.device, validate: bool) -> torch.Tensor | None:
    if indices is None:
        return None
    t = torch.as_tensor(indices, device=device)
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"indices must be a 1-D integer sequence of row ids, got {t.dtype} {list(t.shape)}")
    t = t.to(torch.int64)
    if validate and t.numel() and (bool((t < 0).any()) or bool((t >= B).any())):
        raise ValueError(f"indices must be row ids in [0, {B}), got {t.tolist()}")
    return t


def _per_row(name: str, value: PerRow, B: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
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


def apply_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | Sequence[int] | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Set the logits the bitmask forbids to -inf, in place.

    Parameters
    ----------
    logits : torch.Tensor
        [B, V] float32 / bfloat16 / float16, any strides.
    bitmask : torch.Tensor
        [B, ceil(V/32)] int32; bit ``i`` of word ``j`` allows token ``32*j + i``.
    indices : sequence of int, optional
        Rows to mask (same row of logits and bitmask); all rows if None.
    backend : {"auto", "triton", "torch"}

    Returns
    -------
    torch.Tensor
        ``logits``.
    """
    _check_logits(logits)
    _check_bitmask(bitmask, logits)
    idx = _check_indices(indices, logits.shape[0], logits.device, validate=True)
    return _backend(backend, logits.device).apply_bitmask_(logits, bitmask, idx)


def sample(
    logits: torch.Tensor,
    *,
    bitmask: torch.Tensor | None = None,
    temperature: PerRow,
    top_k: PerRow = 0,
    top_p: PerRow = 1.0,
    min_p: PerRow = 0.0,
    seed: PerRow,
    step: PerRow,
    indices: torch.Tensor | Sequence[int] | None = None,
    backend: str = "auto",
    return_logprobs: bool = False,
    validate: bool = True,
) -> SampleOutput:
    """Mask, temper, filter and sample one token per row in one launch.

    Parameters
    ----------
    logits : torch.Tensor
        [B, V] float32 / bfloat16 / float16, any strides; not modified.
    bitmask : torch.Tensor, optional
        [B, ceil(V/32)] int32; bit ``i`` of word ``j`` allows token ``32*j + i``.
    temperature, top_k, top_p, min_p : tensor [B] or scalar
        ``temperature == 0`` is greedy (argmax, lowest id on ties). ``top_k == 0``,
        ``top_p == 1`` and ``min_p == 0`` disable their filter. The filters are applied
        jointly to softmax(masked logits / temperature); ties at a threshold are kept.
    seed, step : int64 tensor [B] or scalar
        The random numbers of a row are a pure function of (seed, step, token id), so a
        row's token does not depend on the batch around it.
    indices : sequence of int, optional
        Rows the bitmask applies to (others are unconstrained); all rows if None.
    backend : {"auto", "triton", "torch"}
    return_logprobs : bool
        Also return the chosen tokens' log-probabilities.
    validate : bool
        Check argument values (a host sync on CUDA); shapes and dtypes are always checked.

    Returns
    -------
    SampleOutput
        ``(tokens [B] int64, empty [B] bool, logprobs [B] float32 | None)``; rows whose mask
        allows no token get ``tokens == -1`` and ``empty == True``.
    """
    _check_logits(logits)
    B, _ = logits.shape
    dev = logits.device
    if bitmask is not None:
        _check_bitmask(bitmask, logits)
    elif indices is not None:
        raise ValueError("indices given without a bitmask")
    idx = _check_indices(indices, B, dev, validate)
    temperature = _per_row("temperature", temperature, B, dev, torch.float32)
    top_k = _per_row("top_k", top_k, B, dev, torch.int64)
    top_p = _per_row("top_p", top_p, B, dev, torch.float32)
    min_p = _per_row("min_p", min_p, B, dev, torch.float32)
    seed = _per_row("seed", seed, B, dev, torch.int64)
    step = _per_row("step", step, B, dev, torch.int64)
    if validate:
        _check_values(temperature, top_k, top_p, min_p)
    impl = _backend(backend, dev)
    tokens, empty, logprobs = impl.sample(
        logits, bitmask, idx, temperature, top_k, top_p, min_p, seed, step, return_logprobs
    )
    return SampleOutput(tokens, empty, logprobs)
