"""The verify forward at fixed shapes, replayed as CUDA graphs (the decode step already is one:
an eager multi-position forward would launch ~25 kernels a layer from Python and cost more
than the decode it saves).

Shapes are bucketed: rows to the decode graphs' batch buckets (``cuda_graphs.batch_buckets``),
positions per row to ``T_BUCKETS``, keys to ``cuda_graphs.kv_bucket``. Padding rows feed token 0
at positions 0.. into the cache's scratch slot (their outputs are dropped); padding positions of
a real row continue its positions (their K/V land past the row's accepted length: garbage that
attention never reads and later steps overwrite), so a step is used only when every row has
room for the bucketed positions in the cache (``fits``). The caller reads ``[:B, :T]`` of the
static logits before the next replay.

``capture=False`` runs the same fixed-shape forward eagerly (tests of the padding on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cuda_graphs import batch_buckets, bucket_for, kv_bucket
from ..models.llama import ForwardBatch

T_BUCKETS = (2, 3, 5, 9, 17, 33)


def t_bucket(T: int) -> int:
    for t in T_BUCKETS:
        if t >= T:
            return t
    return T


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    tokens: torch.Tensor  # [Bp, Tb] int64 (static: copy into it)
    positions: torch.Tensor  # [Bp, Tb] int64
    slots: torch.Tensor  # [Bp] int64
    logits: torch.Tensor | None  # [Bp, Tb, V] float32 (static: read after replay)


class VerifyGraphs:
    """One CUDA graph of ``model.forward`` per (rows, positions, keys) bucket, for one KV cache."""

    def __init__(self, model, cache, *, capture: bool = True) -> None:
        self.model, self.cache, self.capture = model, cache, capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple[int, int, int], _Graph] = {}

    def fits(self, seqs, T: int) -> bool:
        """Every row's bucketed positions L-1 .. L-1+Tb-1 lie inside the cache."""
        Tb = t_bucket(T)
        return len(seqs) <= self.cache.num_slots and max(len(s) for s in seqs) - 1 + Tb <= self.cache.max_len

    def run(self, seqs, drafts: list[list[int]], T: int) -> torch.Tensor:
        """Logits [B, T, V] (a view of the graph's static output) for rows [last, *drafts]."""
        cache = self.cache
        B, Tb = len(seqs), t_bucket(T)
        Bp = bucket_for(B, batch_buckets(cache.num_slots))
        kv = kv_bucket(max(len(s) for s in seqs) - 1 + Tb, cache.max_len)
        tokens = [[0] * Tb for _ in range(Bp)]
        positions = [list(range(Tb)) for _ in range(Bp)]
        slots = [cache.scratch_slot] * Bp
        for i, (s, d) in enumerate(zip(seqs, drafts)):
            last = s.output_token_ids[-1] if s.output_token_ids else s.prompt_token_ids[-1]
            tokens[i][: len(d) + 1] = [last, *d]
            positions[i] = list(range(len(s) - 1, len(s) - 1 + Tb))
            slots[i] = s.slot
        g = self.graphs.get((Bp, Tb, kv))
        if g is None:
            g = self.graphs[(Bp, Tb, kv)] = self._make(Bp, Tb, kv)
        pin = self.capture
        g.tokens.copy_(torch.tensor(tokens, dtype=torch.int64, pin_memory=pin), non_blocking=True)
        g.positions.copy_(torch.tensor(positions, dtype=torch.int64, pin_memory=pin), non_blocking=True)
        g.slots.copy_(torch.tensor(slots, dtype=torch.int64, pin_memory=pin), non_blocking=True)
        if g.graph is None:
            return self._forward(g, kv)[:B, :T]
        g.graph.replay()
        return g.logits[:B, :T]

    def _forward(self, g: _Graph, kv: int) -> torch.Tensor:
        batch = ForwardBatch(tokens=g.tokens, positions=g.positions, slots=g.slots, kv_len=kv)
        return self.model.forward(batch, self.cache)

    def _make(self, Bp: int, Tb: int, kv: int) -> _Graph:
        dev = self.model.device
        g = _Graph(
            None,
            torch.zeros(Bp, Tb, dtype=torch.int64, device=dev),
            torch.arange(Tb, device=dev).repeat(Bp, 1),
            torch.full((Bp,), self.cache.scratch_slot, dtype=torch.int64, device=dev),  # warm-up: scratch only
            None,
        )
        if not self.capture:
            return g
        side = torch.cuda.Stream(dev)  # warm up (cuBLAS handles, workspaces) off the capture
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._forward(g, kv)
        torch.cuda.current_stream(dev).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self.pool):
            g.logits = self._forward(g, kv)
        return g
