"""The host side of one DSpark step: per-position bitmasks and the verify kernel's inputs (the
multi-position forward itself is ``ModelRunner.verify``).

Row b of a step with T positions feeds ``[last token, d_1, ..., d_n, pad...]`` at positions
``L-1 .. L-1+T-1`` (L = len(sequence)); logits at position k are the target's distribution of
the token after the last token and d_1..d_k. The kernel accepts the longest prefix of drafts
that equal the target's own token at each position and emits the target token after them (the
bonus), so a step emits ``accepted + 1`` tokens per row.

KV bookkeeping: the forward wrote K/V at every fed position; those of the last token and the
accepted drafts are the sequence's (``num_cached = L + accepted``); entries past them (rejected
drafts, padding) are garbage that attention never reads (keys past a query's position are
masked) and the next forward that feeds those positions overwrites them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch


def fill_position_masks(matcher, drafts: list[int], rows: np.ndarray) -> None:
    """rows[j] = the allowed tokens after drafts[:j], for j = 1..len(drafts) (rows: int32
    [>= len(drafts) + 1, W]). The matcher is advanced along the drafts, then rolled back: it
    ends exactly as it started."""
    n = 0
    try:
        for j, t in enumerate(drafts, 1):
            if not matcher.accept(t):  # drafts were walked through a copy of this matcher
                raise RuntimeError(f"draft token {t} at position {j} rejected by the constraint")
            n += 1
            src = matcher.mask_row()
            rows[j, : src.shape[0]] = src
            rows[j, src.shape[0] :] = 0
    finally:
        matcher.rollback(n)


class _Inline:
    """``start_masks``' fill, run on the caller's thread when its result is asked for."""

    __slots__ = ("fill",)

    def __init__(self, fill) -> None:
        self.fill = fill

    def result(self):
        return self.fill()


class Verifier:
    """Buffers, the per-position masks (filled beside the forward), and the verify kernel's
    inputs.

    Where the masks are filled (``inline``; None: inline on CUDA). On CUDA the forward's launch
    returns at once, so the masks are filled after it, on the caller's thread, while the device
    runs: a thread filling them beside the launch would hold the GIL the launch's Python needs
    (a thread that waits for the GIL waits up to the switch interval, 5 ms, each time), and
    the launch would wait for most of the fill. On the CPU the forward is the host's own
    compute, whose matmuls release the GIL, so a host thread fills them from ``start_masks``
    on, beside it."""

    inline: bool | None = None

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.width = (vocab_size + 31) // 32
        self.device = device
        self.pin = device.type == "cuda"
        if self.inline is None:
            self.inline = self.pin
        self._buf: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.mask_seconds = 0.0  # host time spent on positions 1.. (position 0: MaskFiller)

    def _host(self, B: int, T: int) -> torch.Tensor:
        """A contiguous [B, T, W] int32 view of one growing (pinned on CUDA) host buffer."""
        n = B * T * self.width
        if self._buf is None or self._buf.numel() < n:
            self._buf = torch.empty(max(n, 8 * 9 * self.width), dtype=torch.int32, pin_memory=self.pin)
        return self._buf[:n].view(B, T, self.width)

    def start_masks(self, seqs, drafts: list[list[int]], T: int, masks):
        """Start the [B, T, W] bitmasks: position 0 from ``masks`` (the step's MaskFiller: its
        rows are filled or waited for where these are), the positions after each draft by
        walking the request's matcher (rolled back after). Called before the forward: on a
        host thread from now on, or, ``inline``, when ``bitmask`` asks for them after the
        launch. None when no row has a constraint; else what ``bitmask`` takes: a future of
        (bitmask [B, T, W] on the host, the constrained rows)."""
        if not masks.active:
            return None
        host = self._host(len(seqs), T)

        def fill():
            host0, constrained = masks.wait(hidden=True)
            t0 = time.perf_counter()
            rows = host.numpy()
            first = host0.numpy()
            for i in constrained:
                rows[i, 0] = first[i]
                if drafts[i]:
                    fill_position_masks(seqs[i].constraint, drafts[i], rows[i])
            self.mask_seconds += time.perf_counter() - t0
            return host, constrained

        if self.inline:
            return _Inline(fill)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="deepinfer-dspark-masks")
        return self._pool.submit(fill)

    def _to(self, rows: list) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, pin_memory=self.pin).to(self.device, non_blocking=True)

    def inputs(self, seqs, drafts: list[list[int]], T: int, constrained: list[int]) -> dict:
        """The verify kernel's per-row arguments in two host-to-device copies: int64 rows
        [drafts (padded to K), num_drafts, top_k, seed, step] (+ a row of constrained row ids
        when they fit) and float32 rows [temperature, top_p, min_p]."""
        B, K = len(seqs), T - 1
        width = K + 4
        ints = [d + [0] * (K - len(d)) + [len(d), s.params.top_k, s.seed, len(s.output_token_ids)]
                for s, d in zip(seqs, drafts)]  # fmt: skip
        idx_row = 0 < len(constrained) <= width
        if idx_row:
            ints.append(constrained + [0] * (width - len(constrained)))
        i = self._to(ints)  # [B (+1), K + 4]
        idx = i[B, : len(constrained)] if idx_row else (self._to(constrained) if constrained else None)
        f = torch.tensor(
            [[s.params.temperature, s.params.top_p, s.params.min_p] for s in seqs],
            dtype=torch.float32,
            pin_memory=self.pin,
        ).to(self.device, non_blocking=True)
        return dict(
            drafts=i[:B, :K],
            num_drafts=i[:B, K],
            top_k=i[:B, K + 1],
            seed=i[:B, K + 2],
            step=i[:B, K + 3],
            temperature=f[:, 0],
            top_p=f[:, 1],
            min_p=f[:, 2],
            indices=idx,
        )

    def bitmask(self, future) -> tuple[torch.Tensor | None, list[int]]:
        """(the bitmask [B, T, W] on the device, or None; the constrained rows) of
        ``start_masks``' future."""
        if future is None:
            return None, []
        host, constrained = future.result()
        if not constrained:
            return None, []
        return host.to(self.device, non_blocking=True), constrained
