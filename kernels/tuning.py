"""Tuning of the Triton sampling path: which launches ``sample()`` makes and with how many warps.

A frozen :class:`SampleTuning` is passed explicitly (``sample(..., tuning=...)``,
``verify(..., tuning=...)``); :data:`DEFAULT_TUNING` is what the engine runs. Nothing here is
read from the environment: a benchmark or a test that wants another layout builds its own
``SampleTuning(split="never")`` and passes it.

Every field except ``chunk_max`` changes only the speed: the same tokens, bit for bit.
``chunk_max`` is part of what a seed samples (the chunks of the inverse-CDF draws): the torch
reference takes it too, so both backends still agree with each other under any value.
The timings quoted are on an H200.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .sample_reference import CHUNK_MAX

SPLIT_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class SampleTuning:
    """How the Triton backend of ``sample()`` / ``verify()`` launches its kernels.

    Attributes
    ----------
    split : {"auto", "always", "never"}
        Run the passes over (row, chunk) programs: "auto" when a row has more than one chunk
        (V > chunk size), "always", or "never" (one program per row streams the whole row).
    split2 : bool
        With the split, run the top-k / top-p test pass over (row, chunk) programs too; False:
        in the per-row kernel (one program streams the row: latency-bound).
    greedy1 : bool
        With the split, an all-greedy call without logprobs is one launch (the row's last chunk
        program decides); False: pass 1 then the per-row kernel.
    pdl : bool
        With the split on a GPU that has it (compute capability >= 9): each launch after pass 1
        starts while the one before ends (programmatic dependent launch) and waits for it only
        before reading its results.
    mask2d : bool
        The all-greedy kernel reads its tile as [CHUNK / 32, 32] (one bitmask word a row of the
        tile), else flat (bfloat16 logits: always 2-D, through the packed keys).
    block_max : int
        Tokens a step of the per-row kernel (and of the verify kernel): min(block_max, next
        power of 2 >= V).
    num_warps : int
        Warps of the per-row kernel and of the verify kernel.
    split_warps : int
        Warps of the split pass 1 (16 tokens a thread at chunk 4096).
    draw_warps : int
        Warps of the draws and of the no-filter end of a row: 4 against 8: top-p 56.1 -> 52.7 µs
        at fp32, B = 128, V = 128,256, and 23.5 -> 22.1 on the model's logits at B = 128 (11.5
        -> 11.8 at B = 1); their B * 4 programs then fit in one wave.
    greedy_warps : int
        Warps of the all-greedy kernel: a tile of CHUNK tokens of 4-byte logits, 2 * CHUNK of
        2-byte ones; B = 128, V = 128,256: bf16 13.0 µs (16.6 with CHUNK and 8 warps), fp32 21.2
        (22.4).
    greedy_tiles : int
        bfloat16 (packed keys): tiles of CHUNK an all-greedy program takes in turn (against one
        tile of 2 * CHUNK: B = 128, V = 128,256 12.16 -> 11.98 µs; V = 262,144 24.96 -> 24.27;
        B = 512, V = 49,152 19.68 -> 18.75; B = 128, V = 49,152 6.29 -> 6.05; 4 tiles: slower).
    pass2_warps : int
        Warps of the split test pass: 32 tokens a thread (1.3-1.8x faster than 8 at B >= 128).
    topk_max : int
        With the split, the most groups of 32 tokens a top-k row gathers, a power of 2: rows
        with top_k up to it find the k-th largest score and draw from the tokens of their
        largest groups (by pass 1's group maxima); larger top_k search the row itself
        (``sample_topk``).
    topk_small_max : int
        The groups gathered instead (a power of 2, at most ``topk_max``) by a call whose
        caller tells the largest top_k of its rows (``sample(top_k_bound=...)``, known on the
        host) and it is at most this: half the candidates a row reduces over for the common
        top_k of 20 to 64 (H100, top-k 50, B = 1: V = 49,152 14.0 -> 12.9 us, V = 128,256
        15.3 -> 14.8).
    topk_warps : int
        Warps of the per-row kernel after a split pass 1 that stored the group maxima (its
        searches reduce over the row's group maxima and [topk_max, 32] gathered tokens, its
        draws over [topk_max] candidates: chains of small reductions).
    topk_small_warps : int
        The same kernel's warps in a call of at most ``SMALL_ROWS`` rows, where one row's chain
        of reductions is the call's time (H200, top-k 50, V = 128,256, B = 1: 4 warps 15.2 µs,
        8 warps 17.1; B = 16: 20.4 and 19.3).
    chunk_max : int
        Tokens per chunk of the inverse-CDF draws, a power of 2: chunk = min(chunk_max, next
        power of 2 >= V), from V only, never B. Part of what a seed samples (see the module
        docstring); the split passes run cdiv(V, chunk) programs a row.
    """

    split: str = "auto"
    split2: bool = True
    greedy1: bool = True
    pdl: bool = True
    mask2d: bool = True
    block_max: int = 8192
    num_warps: int = 16
    split_warps: int = 8
    draw_warps: int = 4
    greedy_warps: int = 4
    greedy_tiles: int = 2
    pass2_warps: int = 4
    topk_max: int = 128
    topk_small_max: int = 64
    topk_warps: int = 8
    topk_small_warps: int = 4
    chunk_max: int = CHUNK_MAX

    def __post_init__(self) -> None:
        if self.split not in SPLIT_MODES:
            raise ValueError(f"SampleTuning.split must be one of {SPLIT_MODES}, got {self.split!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"SampleTuning.{f.name} must be a bool, got {value!r}")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"SampleTuning.{f.name} must be a positive int, got {value!r}")
        for name in ("block_max", "chunk_max", "topk_max", "topk_small_max"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"SampleTuning.{name} must be a power of 2, got {value}")


SMALL_ROWS = 8  # (SampleTuning.topk_small_warps)


def topk_groups(tuning: SampleTuning, top_k_bound: int | None) -> int:
    """The groups a top-k row gathers in a call (the kernels' ``KC``): ``topk_small_max``
    where the call's largest top_k is known to be at most that, else ``topk_max``. Rows over
    it search the row itself: any value gives the same tokens."""
    if top_k_bound is not None and 0 < top_k_bound <= tuning.topk_small_max < tuning.topk_max:
        return tuning.topk_small_max
    return tuning.topk_max


DEFAULT_TUNING = SampleTuning()

__all__ = ["DEFAULT_TUNING", "SPLIT_MODES", "SampleTuning", "topk_groups"]
