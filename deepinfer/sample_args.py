"""A sampler call's per-row arguments in one host buffer, copied to the device in one go.

An engine step hands the fused sampler (``kernels.sample``) three int64 rows (``top_k``,
``seed``, ``step``), three float32 rows (``temperature``, ``top_p``, ``min_p``) and, where rows
are constrained, their bitmask and the indices of those rows. Each host-to-device copy costs
the host a few microseconds, and at small shapes the host bounds a decode step
(docs/async-scheduling.md). So they travel together: one int32 buffer holds a header (the
int64 rows, the constrained rows' indices as a fourth int64 row, then the float32 rows) and
after it, 128-byte aligned, the bitmask's rows. ``SampleArgs`` is that buffer's views for a
batch of ``B`` rows; ``MaskFiller`` (structured.py) keeps one per batch size over its pinned
buffer, whose rows it fills, and a step without constrained rows takes a new header-only one.
"""

from __future__ import annotations

import numpy as np
import torch

INTS = 4  # int64 rows: top_k, seed, step, the constrained rows' indices
FLOATS = 3  # float32 rows: temperature, top_p, min_p


def header_words(B: int) -> int:
    """int32 words before the bitmask's rows: the int64 and float32 rows of ``B`` rows,
    rounded up to 32 words (the rows start 128-byte aligned)."""
    return -(-(2 * INTS + FLOATS) * B // 32) * 32


def buffer_words(B: int, width: int) -> int:
    """int32 words of a buffer for ``B`` rows of bitmasks ``width`` words wide."""
    return header_words(B) + B * width


class SampleArgs:
    """Views of ``buf`` (1-D int32 on the host) for ``B`` rows: ``rows`` the bitmask [B,
    width] (torch, and ``rows_np`` numpy; None where ``width`` is 0), ``ints`` [INTS, B] int64
    and ``floats`` [FLOATS, B] float32 (numpy), ``packed`` the words one call copies."""

    def __init__(self, buf: torch.Tensor, B: int, width: int) -> None:
        self.B, self.width = B, width
        h = self.header = header_words(B)
        self.packed = buf[: h + B * width]
        words = self.packed.numpy()
        self.ints = words[: 2 * INTS * B].view(np.int64).reshape(INTS, B)
        self.floats = words[2 * INTS * B : (2 * INTS + FLOATS) * B].view(np.float32).reshape(FLOATS, B)
        self.rows = self.packed[h:].view(B, width) if width else None
        self.rows_np = words[h:].reshape(B, width) if width else None

    @classmethod
    def new(cls, B: int) -> SampleArgs:
        """A header-only buffer (no bitmask) for one call, in pageable memory: a copy from
        pageable memory is staged before it returns, so no copy reads a later call's values."""
        return cls(torch.empty(header_words(B), dtype=torch.int32), B, 0)

    def write(self, seqs, ahead: int, constrained: list[int]) -> tuple[list, list, list, list]:
        """Write the rows of ``seqs`` (their params; step = tokens so far + ``ahead``) and the
        constrained rows' indices. Returns temperature, top_k, top_p and min_p as lists (what
        the host reads to choose the kernels)."""
        p = [s.params for s in seqs]
        temperature, top_k, top_p = [x.temperature for x in p], [x.top_k for x in p], [x.top_p for x in p]
        min_p = [x.min_p for x in p]
        ints, floats = self.ints, self.floats
        ints[0] = top_k
        ints[1] = [s.seed for s in seqs]
        ints[2] = [len(s.output_token_ids) + ahead for s in seqs]
        if constrained:
            ints[3, : len(constrained)] = constrained
        floats[0] = temperature
        floats[1] = top_p
        floats[2] = min_p
        return temperature, top_k, top_p, min_p

    def to(self, device: torch.device, constrained: bool) -> tuple[torch.Tensor, ...]:
        """One copy of the packed words to ``device`` (not synced). Returns the device's
        ``ints`` [INTS, B], ``floats`` [FLOATS, B] and bitmask [B, width] (None where no row is
        ``constrained``)."""
        B, h = self.B, self.header
        dev = self.packed.to(device, non_blocking=True)
        ints = dev[: 2 * INTS * B].view(torch.int64).view(INTS, B)
        floats = dev[2 * INTS * B : (2 * INTS + FLOATS) * B].view(torch.float32).view(FLOATS, B)
        bitmask = dev[h:].view(B, self.width) if constrained else None
        return ints, floats, bitmask
