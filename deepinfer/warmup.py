"""Warm-up before the first step (CUDA): everything a step could otherwise do for the first time
in the middle of a run, done at ``LLM`` construction instead.

- capture every decode and verify CUDA graph (``ModelRunner.capture_graphs``);
- compile the verify kernel's variants (no mask, every row masked, some rows masked);
- compile the sampler's variants: each kind of row set (``kernels.sample_kinds``) with no mask,
  every row masked and some rows masked (a server meets them as requests come and go: the
  last constrained request alone in the batch is a variant of its own);
- time each step shape's forward on the device (``StepGraphs.time``): DSpark's cost model starts
  from these (``CostModel.seed``), so it never runs a step only to learn what a shape costs.

A capture or a compile takes 0.1-1 s, tens of decode steps: met mid-run, it decides a
benchmark's result and the policy's measurements alike.
"""

from __future__ import annotations

import torch

from . import kernels
from .cuda_graphs import Tile, batch_buckets, kv_bucket, t_bucket
from .model_runner import ModelRunner


def verify_widths(max_drafts: int) -> tuple[int, ...]:
    """The verify graphs' widths for at most ``max_drafts`` drafts a row."""
    return tuple(sorted({t_bucket(T) for T in range(2, max_drafts + 2)}))


def time_steps(
    runner: ModelRunner, widths: tuple[int, ...], reps: int = 3, *, kv: int | None = None, buckets=None
) -> dict[tuple, float]:
    """{(path, rows, positions): device seconds} of the decode graph (at ``kv`` keys, by default
    the smallest key bucket: a decode step's time is its weights') and of each verify width, per
    batch bucket (``buckets``, by default every one a verify step may use); with ``widths``
    and by default, also the decode graphs past the largest batch (mixed steps' and ragged
    verify steps': ``ModelRunner.buckets``)."""
    out: dict[tuple[str, int, int], float] = {}
    if not runner.cuda_graphs or runner.tile:
        return out
    kv = kv or kv_bucket(1, runner.model.max_len)
    for rows in buckets or batch_buckets(runner.max_rows):
        out[("decode", rows, 1)] = runner.graphs.time(Tile(rows, kv), reps)
        for T in widths:
            out[("verify", rows, T)] = runner.graphs.time(Tile(rows, runner.verify_kv or kv, T), reps)
    if widths and buckets is None:
        for rows in runner.buckets():
            if rows > runner.max_rows:
                out[("decode", rows, 1)] = runner.graphs.time(Tile(rows, kv), reps)
    return out


SAMPLE_KINDS = {  # kind -> (temperature, top_k, top_p, min_p) of a row that needs it
    "greedy": (0.0, 0, 1.0, 0.0),
    "plain": (1.0, 0, 1.0, 0.0),
    "sample": (1.0, 0, 1.0, 0.1),
    "top_p": (1.0, 0, 0.9, 0.0),
    "top_k": (1.0, 5, 1.0, 0.0),
    "filter": (1.0, 5, 0.9, 0.1),
}


def compile_sampling(vocab_size: int, device: torch.device) -> None:
    """Run the fused sampler once in each kind x mask variant it compiles (float32 logits, as
    the forward returns them)."""
    B, W = 2, (vocab_size + 31) // 32
    logits = torch.zeros(B, vocab_size, device=device)
    mask = torch.full((B, W), -1, dtype=torch.int32, device=device)
    ints = torch.zeros(B, dtype=torch.int64, device=device)
    some = torch.zeros(1, dtype=torch.int64, device=device)
    for kind, (t, k, p, mp) in SAMPLE_KINDS.items():
        # top-k rows gather topk_small_max groups where the rows' largest top_k is that or less,
        # else topk_max: both variants
        for bound in (k, 1 << 30) if k else (None,):
            for bitmask, indices in ((None, None), (mask, None), (mask, some)):
                kernels.sample(logits, bitmask=bitmask, indices=indices, temperature=t, top_k=k, top_p=p,
                               min_p=mp, seed=ints, step=ints, validate=False, kinds=kind,
                               top_k_bound=bound)  # fmt: skip


def compile_verify(vocab_size: int, device: torch.device) -> None:
    """Run the verify kernel once in each of its compiled variants."""
    B, T, W = 2, 2, (vocab_size + 31) // 32
    logits = torch.zeros(B, T, vocab_size, device=device)
    ints = torch.zeros(B, dtype=torch.int64, device=device)
    mask = torch.full((B, T, W), -1, dtype=torch.int32, device=device)
    args = dict(num_drafts=ints + 1, temperature=torch.ones(B, device=device), top_k=ints,
                top_p=torch.ones(B, device=device), min_p=torch.zeros(B, device=device), seed=ints, step=ints,
                validate=False)  # fmt: skip
    drafts = torch.zeros(B, T - 1, dtype=torch.int64, device=device)
    some = torch.zeros(1, dtype=torch.int64, device=device)
    for bitmask, indices in ((None, None), (mask, None), (mask, some)):
        kernels.verify(logits, drafts, bitmask=bitmask, indices=indices, **args)
