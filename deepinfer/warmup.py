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

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from . import kernels
from .cuda_graphs import Tile, batch_buckets, kv_bucket, t_bucket
from .model_runner import ModelRunner

log = logging.getLogger(__name__)


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


def sampling_calls(vocab_size: int, device: torch.device) -> list[Callable[[], object]]:
    """One call of the fused sampler in each kind x mask variant it compiles (float32 logits,
    as the forward returns them); each call builds its own inputs, so calls may run at once."""
    B, W = 2, (vocab_size + 31) // 32

    def call(kind: str, t: float, k: int, p: float, mp: float, bound: int | None, masked: str):
        logits = torch.zeros(B, vocab_size, device=device)
        ints = torch.zeros(B, dtype=torch.int64, device=device)
        mask = torch.full((B, W), -1, dtype=torch.int32, device=device) if masked != "none" else None
        some = torch.zeros(1, dtype=torch.int64, device=device) if masked == "some" else None
        return kernels.sample(logits, bitmask=mask, indices=some, temperature=t, top_k=k, top_p=p,
                              min_p=mp, seed=ints, step=ints, validate=False, kinds=kind,
                              top_k_bound=bound)  # fmt: skip

    calls = []
    for kind, (t, k, p, mp) in SAMPLE_KINDS.items():
        # top-k rows gather topk_small_max groups where the rows' largest top_k is that or less,
        # else topk_max: both variants
        for bound in (k, 1 << 30) if k else (None,):
            for masked in ("none", "all", "some"):
                calls.append(functools.partial(call, kind, t, k, p, mp, bound, masked))
    return calls


def verify_calls(vocab_size: int, device: torch.device) -> list[Callable[[], object]]:
    """One call of the verify kernel in each of its compiled variants."""
    B, T, W = 2, 2, (vocab_size + 31) // 32

    def call(masked: str):
        logits = torch.zeros(B, T, vocab_size, device=device)
        ints = torch.zeros(B, dtype=torch.int64, device=device)
        mask = torch.full((B, T, W), -1, dtype=torch.int32, device=device) if masked != "none" else None
        some = torch.zeros(1, dtype=torch.int64, device=device) if masked == "some" else None
        drafts = torch.zeros(B, T - 1, dtype=torch.int64, device=device)
        return kernels.verify(logits, drafts, bitmask=mask, indices=some, num_drafts=ints + 1,
                              temperature=torch.ones(B, device=device), top_k=ints,
                              top_p=torch.ones(B, device=device), min_p=torch.zeros(B, device=device),
                              seed=ints, step=ints, validate=False)  # fmt: skip

    return [functools.partial(call, masked) for masked in ("none", "all", "some")]


def compile_workers() -> int:
    """Threads that compile kernel variants at once: one a CPU core this process may use, at
    most 32 (Triton's LLVM and ptxas stages run without the GIL, so the compiles overlap)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(32, cores))


def run_calls(calls: list[Callable[[], object]], device: torch.device, workers: int | None = None) -> None:
    """Run ``calls`` (each compiles what it launches on first use) on ``workers`` threads
    (default :func:`compile_workers`), then wait for the device. Where a call fails on a
    thread, every call runs again one after another, and an error then is raised. Kernels
    already compiled (in this process, or in Triton's cache on disk) cost a launch. Off CUDA
    the calls run one after another: nothing is compiled there (interpreted Triton, or
    torch)."""
    workers = compile_workers() if workers is None else workers
    if workers <= 1 or len(calls) <= 1 or device.type != "cuda":
        for c in calls:
            c()
    else:

        def run(c):
            with torch.cuda.device(device):
                return c()

        with torch.cuda.device(device):
            _bind_kernels()
        try:
            with ThreadPoolExecutor(min(workers, len(calls)), thread_name_prefix="deepinfer-compile") as pool:
                for f in [pool.submit(run, c) for c in calls]:
                    f.result()
        except Exception as e:  # noqa: BLE001 - the calls again, one after another, raise what is real
            log.warning("compiling %d kernel variants on %d threads failed (%s: %s); compiling them one "
                        "after another", len(calls), workers, type(e).__name__, e)  # fmt: skip
            for c in calls:
                c()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bind_kernels() -> None:
    """Make every loaded Triton kernel's caches for the current device before threads launch
    them. Triton makes them on a kernel's first launch on a device (a ``defaultdict``
    entry); two threads launching it first at once would each make their own, and the one
    dropped takes the variants compiled into it with it (the next launch of those would look
    them up again, mid-run)."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    package = kernels.__name__
    for sub in ("sample_triton", "verify_triton"):  # (imported on first use otherwise)
        importlib.import_module(f"{package}.{sub}")
    index = driver.active.get_current_device()
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(package + "."):
            for value in list(vars(module).values()):
                if isinstance(value, JITFunction) and hasattr(value, "device_caches"):
                    value.device_caches[index]  # noqa: B018 - made now, on this thread
