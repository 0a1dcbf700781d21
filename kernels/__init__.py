"""Device side of structured generation: bitmask apply, the fused sampling kernel, and DSpark
draft verification.

``backend="auto"`` runs the Triton kernel on CUDA tensors and the torch reference on CPU;
``"triton"`` forces Triton (on CPU only under ``TRITON_INTERPRET=1``); ``"torch"`` forces the
reference. Triton is imported only when a Triton backend is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import reference, reference_verify

__all__ = [
    "SampleOutput", "VerifyOutput", "apply_bitmask_", "reference", "reference_verify", "sample", "sample_kinds", "verify",
]

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


class VerifyOutput(NamedTuple):
    """What :func:`verify` returns.

    Attributes
    ----------
    accepted : torch.Tensor
        [B] int64, how many leading drafts of each row were accepted (0 .. num_drafts).
    bonus : torch.Tensor
        [B] int64, the target token after the accepted drafts (-1 where its mask is empty).
    tokens : torch.Tensor
        [B, K+1] int64, the target token at every draft position (-1 past num_drafts); a row
        emits ``tokens[b, :accepted[b] + 1]``.
    """

    accepted: torch.Tensor
    bonus: torch.Tensor
    tokens: torch.Tensor


def _backend(backend: str, device: torch.device, kind: str = "sample"):
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return reference if kind == "sample" else reference_verify
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before import, got device {device}"
        )
    try:
        if kind == "sample":
            from . import sample_triton as module
        else:
            from . import verify_triton as module
    except ImportError as e:  # pragma: no cover - triton is a dependency
        raise ImportError("backend='triton' needs the 'triton' package: pip install triton") from e
    return module


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


def _sampling_rows(B: int, dev: torch.device, validate: bool, temperature, top_k, top_p, min_p, seed, step):
    """The per-row sampling settings as [B] tensors on ``dev`` (values checked if ``validate``)."""
    rows = (
        _per_row("temperature", temperature, B, dev, torch.float32),
        _per_row("top_k", top_k, B, dev, torch.int64),
        _per_row("top_p", top_p, B, dev, torch.float32),
        _per_row("min_p", min_p, B, dev, torch.float32),
        _per_row("seed", seed, B, dev, torch.int64),
        _per_row("step", step, B, dev, torch.int64),
    )
    if validate:
        _check_values(*rows[:4])
    return rows


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
    kinds: str | None = None,
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
    kinds : {"greedy", "plain", "sample", "top_p", "filter"}, optional
        What the rows need, known on the host: every row greedy; some row samples but none
        with a filter (top-k, top-p or min-p); some row samples but none with top-k or top-p;
        some row samples with top-p but none with top-k; some row samples with top-k. The
        Triton path leaves out the launches (and the top-k counts) no row needs. None: worked
        out from the arguments when they are host values, else "filter" (always correct). A
        wrong value is not checked and gives wrong tokens.

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
    if kinds is None:
        kinds = sample_kinds(temperature, top_k, top_p, logits.shape[1], min_p)
    elif kinds not in reference.KINDS:
        raise ValueError(f"kinds must be one of {', '.join(map(repr, reference.KINDS))}, got {kinds!r}")
    temperature, top_k, top_p, min_p, seed, step = _sampling_rows(
        B, dev, validate, temperature, top_k, top_p, min_p, seed, step
    )
    impl = _backend(backend, dev)
    extra = {"kinds": kinds} if impl is not reference else {}
    tokens, empty, logprobs = impl.sample(
        logits, bitmask, idx, temperature, top_k, top_p, min_p, seed, step, return_logprobs, **extra
    )
    return SampleOutput(tokens, empty, logprobs)


def sample_kinds(temperature: PerRow, top_k: PerRow, top_p: PerRow, V: int, min_p: PerRow | None = None) -> str:
    """What the rows need (``sample(kinds=...)``: "greedy" / "plain" / "sample" / "top_p" /
    "filter"), from host values; "filter" if any is on a device (reading it would sync) or the
    lengths do not broadcast (``_sampling_rows`` says why). "plain" (no sampling row has a
    filter) needs min_p as well; without it, or with it on a device, "sample" stands for both.
    Lists of Python numbers (what an engine step has) are read as they are, without torch."""
    if min_p is None or (isinstance(min_p, torch.Tensor) and min_p.device.type != "cpu"):
        min_p = 1.0  # unknown: taken as on
    rows = []
    for x in (temperature, top_k, top_p, min_p):
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return "filter"
        rows.append(x if isinstance(x, (list, tuple)) else torch.as_tensor(x).reshape(-1).tolist())
    n = max(len(r) for r in rows)
    if any(len(r) not in (1, n) for r in rows):
        return "filter"
    t, k, p, mp = (r * n if len(r) == 1 else r for r in rows)
    sampling = [i for i in range(n) if t[i] != 0]
    if any(0 < k[i] < V for i in sampling):
        return "filter"
    if any(p[i] < 1 for i in sampling):
        return "top_p"
    if not sampling:
        return "greedy"
    return "sample" if any(mp[i] > 0 for i in sampling) else "plain"


def verify(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    *,
    num_drafts: PerRow | None = None,
    bitmask: torch.Tensor | None = None,
    temperature: PerRow,
    top_k: PerRow = 0,
    top_p: PerRow = 1.0,
    min_p: PerRow = 0.0,
    seed: PerRow,
    step: PerRow,
    indices: torch.Tensor | Sequence[int] | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> VerifyOutput:
    """Verify deterministic draft tokens against the target model's logits in one launch.

    Position k of row b holds the logits after the row's accepted tokens and its first k
    drafts. Each position's target token is what :func:`sample` would pick there (bitmask,
    temperature, filters, the random numbers of ``(seed, step + k)``); the drafts are accepted up to the
    first one that differs from its target token, and the target token there is the bonus.
    For drafts that are point masses this is speculative rejection sampling (accept d with
    probability p(d), else sample the residual p without d), so the emitted tokens are exactly
    those plain decoding would produce step by step (see ``kernels/reference_verify.py``).

    Parameters
    ----------
    logits : torch.Tensor
        [B, K+1, V] float32 / bfloat16 / float16, any strides; not modified.
    drafts : torch.Tensor
        [B, K] integer draft tokens; entries past a row's ``num_drafts`` are ignored.
    num_drafts : tensor [B] or scalar, optional
        Drafts to verify per row, 0..K (default K).
    bitmask : torch.Tensor, optional
        [B, K+1, ceil(V/32)] int32: the allowed tokens at each position (the constraint
        advanced along the drafts); bit ``i`` of word ``j`` allows token ``32*j + i``.
    temperature, top_k, top_p, min_p, seed, step : tensor [B] or scalar
        As in :func:`sample`; ``step`` is that of position 0 (position k uses ``step + k``).
    indices : sequence of int, optional
        Rows the bitmask applies to (others are unconstrained); all rows if None.
    backend : {"auto", "triton", "torch"}
    validate : bool
        Check argument values (a host sync on CUDA); shapes and dtypes are always checked.

    Returns
    -------
    VerifyOutput
        ``(accepted [B] int64, bonus [B] int64, tokens [B, K+1] int64)``.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 3-D tensor [batch, drafts + 1, vocab], got {shape}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    B, T, V = logits.shape
    dev = logits.device
    if T < 1:
        raise ValueError("logits must have at least one position (K + 1 >= 1)")
    drafts = torch.as_tensor(drafts, device=dev)
    if drafts.dim() != 2 or tuple(drafts.shape) != (B, T - 1) or drafts.dtype.is_floating_point:
        raise ValueError(f"drafts must be an integer tensor of shape [{B}, {T - 1}], got "
                         f"{drafts.dtype} {list(drafts.shape)}")
    drafts = drafts.to(torch.int64)
    if bitmask is not None:
        if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
            raise ValueError(f"bitmask must be an int32 tensor, got {getattr(bitmask, 'dtype', type(bitmask))}")
        want = (B, T, (V + 31) // 32)
        if tuple(bitmask.shape) != want:
            raise ValueError(f"bitmask must have shape [batch, drafts + 1, ceil(vocab/32)] = {list(want)}, "
                             f"got {list(bitmask.shape)}")
        if bitmask.device != dev:
            raise ValueError(f"bitmask must be on the logits' device {dev}, got {bitmask.device}")
        if bitmask.stride(2) != 1:
            raise ValueError("bitmask must be contiguous along its last dimension")
    elif indices is not None:
        raise ValueError("indices given without a bitmask")
    idx = _check_indices(indices, B, dev, validate)
    n = _per_row("num_drafts", T - 1 if num_drafts is None else num_drafts, B, dev, torch.int64)
    temperature, top_k, top_p, min_p, seed, step = _sampling_rows(
        B, dev, validate, temperature, top_k, top_p, min_p, seed, step
    )
    if validate:
        if bool((n < 0).any()) or bool((n > T - 1).any()):
            raise ValueError(f"num_drafts must be in [0, {T - 1}], got {n.tolist()}")
    impl = _backend(backend, dev, "verify")
    accepted, bonus, tokens = impl.verify(
        logits, drafts, n, bitmask, idx, temperature, top_k, top_p, min_p, seed, step
    )
    return VerifyOutput(accepted, bonus, tokens)
