"""Device side of structured generation: bitmask apply, the fused sampling kernel, DSpark draft
verification, and the batch-invariant model kernels (``invariant``, ``decode_attention``).

``backend="auto"`` runs the Triton kernel on CUDA tensors and the torch reference on CPU;
``"triton"`` forces Triton (on CPU only under ``TRITON_INTERPRET=1``); ``"torch"`` forces the
reference. Triton is imported only when a Triton backend is chosen. ``tuning``
(:class:`SampleTuning`) picks how the Triton sampling path launches its kernels.

Modules: ``sample_triton`` (the launches of ``sample``) over ``triton_common``,
``sample_filters``, ``sample_rows``, ``sample_split``, ``sample_greedy``, beside
``sample_reference``; ``verify_triton`` / ``verify_reference``; ``bitmask_triton`` /
``bitmask_reference``; ``validate`` (argument checks); ``tuning``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import bitmask_reference, sample_reference, verify_reference
from .tuning import DEFAULT_TUNING, SampleTuning
from .validate import (
    PerRow,
    check_bitmask,
    check_drafts,
    check_indices,
    check_kinds,
    check_logits,
    check_num_drafts,
    check_verify_bitmask,
    check_verify_logits,
    per_row,
    sampling_rows,
    use_triton,
)

__all__ = [
    "DEFAULT_TUNING",
    "SampleOutput",
    "SampleTuning",
    "VerifyOutput",
    "apply_bitmask_",
    "sample",
    "sample_kinds",
    "top_k_max",
    "verify",
]


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


def _backend(backend: str, device: torch.device, kind: str):
    """The module that runs ``kind`` ("sample", "verify" or "bitmask"): Triton's or the reference."""
    if not use_triton(backend, device):
        return {"sample": sample_reference, "verify": verify_reference, "bitmask": bitmask_reference}[kind]
    try:
        if kind == "sample":
            from . import sample_triton as module
        elif kind == "verify":
            from . import verify_triton as module
        else:
            from . import bitmask_triton as module
    except ImportError as e:  # pragma: no cover - triton is a dependency
        raise ImportError("backend='triton' needs the 'triton' package: pip install triton") from e
    return module


def _check_tuning(tuning: SampleTuning) -> None:
    if not isinstance(tuning, SampleTuning):
        raise ValueError(f"tuning must be a SampleTuning, got {type(tuning).__name__}")


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
    check_logits(logits)
    check_bitmask(bitmask, logits)
    idx = check_indices(indices, logits.shape[0], logits.device, validate=True)
    return _backend(backend, logits.device, "bitmask").apply_bitmask_(logits, bitmask, idx)


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
    tuning: SampleTuning = DEFAULT_TUNING,
    top_k_bound: int | None = None,
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
    kinds : {"greedy", "plain", "top_k", "sample", "top_p", "filter"}, optional
        What the rows need, known on the host: every row greedy; some row samples but none
        with a filter (top-k, top-p or min-p); every sampling row has top-k (0 < k < V; any
        may have top-p or min-p too); some row samples but none with top-k or top-p; some row
        samples with top-p but none with top-k; some row samples with top-k. The
        Triton path leaves out the launches (and the top-k counts) no row needs. None: worked
        out from the arguments when they are host values, else "filter" (always correct). A
        wrong value is not checked and gives wrong tokens.
    tuning : SampleTuning
        How the Triton path launches its kernels (``tuning.py``); the tokens are the same under
        any, except that ``chunk_max`` (the chunks of the draws) is part of what a seed samples
        (both backends take it).
    top_k_bound : int, optional
        The largest top_k of the rows, known on the host. None: read from ``top_k`` when it
        is a host value. With one of at most ``tuning.topk_small_max`` the Triton path's top-k
        rows gather fewer groups (faster); a row over it searches the row itself, so a wrong
        value costs time, not tokens.

    Returns
    -------
    SampleOutput
        ``(tokens [B] int64, empty [B] bool, logprobs [B] float32 | None)``; rows whose mask
        allows no token get ``tokens == -1`` and ``empty == True``.
    """
    check_logits(logits)
    _check_tuning(tuning)
    B, _ = logits.shape
    dev = logits.device
    if bitmask is not None:
        check_bitmask(bitmask, logits)
    elif indices is not None:
        raise ValueError("indices given without a bitmask")
    idx = check_indices(indices, B, dev, validate)
    if kinds is None:
        kinds = sample_kinds(temperature, top_k, top_p, logits.shape[1], min_p)
    else:
        check_kinds(kinds)
    if top_k_bound is None:
        top_k_bound = top_k_max(top_k)
    temperature, top_k, top_p, min_p, seed, step = sampling_rows(
        B, dev, validate, temperature, top_k, top_p, min_p, seed, step
    )
    impl = _backend(backend, dev, "sample")
    if impl is sample_reference:
        extra = {"chunk_max": tuning.chunk_max}
    else:
        extra = {"kinds": kinds, "tuning": tuning, "top_k_bound": top_k_bound}
    tokens, empty, logprobs = impl.sample(
        logits, bitmask, idx, temperature, top_k, top_p, min_p, seed, step, return_logprobs, **extra
    )
    return SampleOutput(tokens, empty, logprobs)


def top_k_max(top_k: PerRow) -> int | None:
    """The largest top_k of host values (a number, or a sequence, array or CPU tensor of
    them), for ``sample(top_k_bound=...)``; None where ``top_k`` is on a device (reading it
    would sync) or is not numbers."""
    if isinstance(top_k, torch.Tensor):
        if top_k.device.type != "cpu":
            return None
        top_k = top_k.reshape(-1).tolist()
    try:
        if isinstance(top_k, (int, float)) or getattr(top_k, "ndim", 1) == 0:
            return int(top_k)
        return max((int(k) for k in top_k), default=0)
    except (TypeError, ValueError):  # (not numbers: sampling_rows names what is wrong)
        return None


def sample_kinds(
    temperature: PerRow, top_k: PerRow, top_p: PerRow, V: int, min_p: PerRow | None = None
) -> str:
    """What the rows need (``sample(kinds=...)``: "greedy" / "plain" / "top_k" / "sample" /
    "top_p" / "filter"), from host values; "filter" if any is on a device (reading it would sync) or the
    lengths do not broadcast (``validate.sampling_rows`` says why). "plain" (no sampling row has a
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
    if sampling and all(0 < k[i] < V for i in sampling):
        return "top_k"
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
    tuning: SampleTuning = DEFAULT_TUNING,
) -> VerifyOutput:
    """Verify deterministic draft tokens against the target model's logits in one launch.

    Position k of row b holds the logits after the row's accepted tokens and its first k
    drafts. Each position's target token is what :func:`sample` would pick there (bitmask,
    temperature, filters, the random numbers of ``(seed, step + k)``); the drafts are accepted up to the
    first one that differs from its target token, and the target token there is the bonus.
    For drafts that are point masses this is speculative rejection sampling (accept d with
    probability p(d), else sample the residual p without d), so the emitted tokens are exactly
    those plain decoding would produce step by step (see ``kernels/verify_reference.py``).

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
    tuning : SampleTuning
        As in :func:`sample` (use the same one for the same tokens).

    Returns
    -------
    VerifyOutput
        ``(accepted [B] int64, bonus [B] int64, tokens [B, K+1] int64)``.
    """
    check_verify_logits(logits)
    _check_tuning(tuning)
    B, T, V = logits.shape
    dev = logits.device
    drafts = check_drafts(drafts, B, T, dev)
    if bitmask is not None:
        check_verify_bitmask(bitmask, logits)
    elif indices is not None:
        raise ValueError("indices given without a bitmask")
    idx = check_indices(indices, B, dev, validate)
    n = per_row("num_drafts", T - 1 if num_drafts is None else num_drafts, B, dev, torch.int64)
    temperature, top_k, top_p, min_p, seed, step = sampling_rows(
        B, dev, validate, temperature, top_k, top_p, min_p, seed, step
    )
    if validate:
        check_num_drafts(n, T - 1)
    impl = _backend(backend, dev, "verify")
    extra = {"chunk_max": tuning.chunk_max} if impl is verify_reference else {"tuning": tuning}
    accepted, bonus, tokens = impl.verify(
        logits, drafts, n, bitmask, idx, temperature, top_k, top_p, min_p, seed, step, **extra
    )
    return VerifyOutput(accepted, bonus, tokens)
