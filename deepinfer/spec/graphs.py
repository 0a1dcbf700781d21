"""The verify forward at fixed shapes, replayed as CUDA graphs (the decode step already is one:
an eager multi-position forward would launch ~25 kernels a layer from Python and cost more
than the decode it saves).

The forward is ``LlamaModel.decode_static`` with T positions a row, laid out slot-major as the
decode graphs are: row r is KV slot r, so a row's keys are a slice of the cache (no gather of
the cache, and attention needs no repeated K/V for GQA). Shapes are bucketed: rows to the batch
bucket covering the highest slot verified (``cuda_graphs.batch_buckets``), positions per row to
``T_BUCKETS``, keys to ``cuda_graphs.kv_bucket``. Slots not verified this step are padding rows:
token 0 at positions 0.., writing into the cache's scratch slot (their outputs are dropped);
padding positions of a real row continue its positions (their K/V land past the row's accepted
length: garbage that attention never reads and later steps overwrite), so a step is used only
when every row has room for the bucketed positions in the cache (``fits``). The caller reads
the returned logits before the next replay.

``capture=False`` runs the same fixed-shape forward eagerly (tests of the padding on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cuda_graphs import batch_buckets, bucket_for, kv_bucket

T_BUCKETS = (2, 3, 5, 9, 17, 33)
OUT_WIDTH = 9  # positions of the shared logits buffer at first (max_drafts 8, the default)


def t_bucket(T: int) -> int:
    for t in T_BUCKETS:
        if t >= T:
            return t
    return T


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    inputs: torch.Tensor  # [2 * Bp * Tb + Bp] int64: tokens, positions, write slots (static: copy into it)
    logits: torch.Tensor | None  # [Bp, Tb, V] float32, a view of the shared buffer (read after replay)


class VerifyGraphs:
    """One CUDA graph of ``model.decode_static`` (T positions a row) per (rows, positions, keys)
    bucket, for one KV cache."""

    def __init__(self, model, cache, *, capture: bool = True) -> None:
        self.model, self.cache, self.capture = model, cache, capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        # every graph writes its logits into the front of one shared [rows, positions, V] float32
        # buffer (graphs never replay at once), so memory does not grow with the number of
        # shapes; a graph needing a larger one gets a new buffer, and the old ones stay alive
        # for the graphs that write into them
        self._outs: list[torch.Tensor] = []

    def fits(self, seqs, T: int) -> bool:
        """Every row's bucketed positions L-1 .. L-1+Tb-1 lie inside the cache."""
        return max(len(s) for s in seqs) - 1 + t_bucket(T) <= self.cache.max_len

    def run(self, seqs, drafts: list[list[int]], T: int) -> torch.Tensor:
        """Logits [B, T, V] (rows in ``seqs`` order; a view of the graph's static output when
        the sequences hold slots 0..B-1 in order) for rows [last, *drafts]."""
        cache = self.cache
        B, Tb = len(seqs), t_bucket(T)
        slots = [s.slot for s in seqs]
        Bp = bucket_for(max(slots) + 1, batch_buckets(cache.num_slots))
        kv = kv_bucket(max(len(s) for s in seqs) - 1 + Tb, cache.max_len)
        tokens = [0] * (Bp * Tb)
        positions = list(range(Tb)) * Bp
        write = [cache.scratch_slot] * Bp
        for s, d in zip(seqs, drafts):
            r = s.slot
            last = s.output_token_ids[-1] if s.output_token_ids else s.prompt_token_ids[-1]
            tokens[r * Tb : r * Tb + len(d) + 1] = [last, *d]
            positions[r * Tb : (r + 1) * Tb] = range(len(s) - 1, len(s) - 1 + Tb)
            write[r] = r
        self.ensure(Bp, Tb, kv)
        g = self.graphs[(Bp, Tb, kv)]
        in_order = slots == list(range(B))
        host = torch.tensor(tokens + positions + write + ([] if in_order else slots), dtype=torch.int64,
                            pin_memory=self.capture)  # fmt: skip
        n = g.inputs.numel()
        g.inputs.copy_(host[:n], non_blocking=True)
        if g.graph is None:
            logits = self._forward(g, Bp, Tb, kv)
        else:
            g.graph.replay()
            logits = g.logits
        if in_order:
            return logits[:B, :T]
        return logits.index_select(0, host[n:].to(logits.device, non_blocking=True))[:, :T]

    def ensure(self, Bp: int, T: int, kv: int) -> bool:
        """Make the graph of (Bp rows, T bucketed, kv keys) unless it exists; True when made now."""
        key = (Bp, t_bucket(T), kv)
        if key in self.graphs:
            return False
        self.graphs[key] = self._make(*key)
        return True

    def _out(self, Bp: int, Tb: int) -> torch.Tensor:
        """The [Bp, Tb, V] front of the shared logits buffer: rows for the largest batch bucket,
        at least OUT_WIDTH positions (a wider buffer is added when a graph needs one)."""
        buf = self._outs[-1] if self._outs else None
        if buf is None or buf.shape[1] < Tb:
            rows = batch_buckets(self.cache.num_slots)[-1]
            width = max(Tb, OUT_WIDTH)
            buf = torch.empty(rows, width, self.model.lm_head.shape[1], dtype=torch.float32, device=self.model.device)
            self._outs.append(buf)
        return buf[:Bp, :Tb]

    def _forward(self, g: _Graph, Bp: int, Tb: int, kv: int) -> torch.Tensor:
        n = Bp * Tb
        x = g.inputs
        return self.model.decode_static(x[:n].view(Bp, Tb), x[n : 2 * n].view(Bp, Tb), x[2 * n :], self.cache,
                                        slot_start=0, kv_len=kv, out=self._out(Bp, Tb))  # fmt: skip

    def _make(self, Bp: int, Tb: int, kv: int) -> _Graph:
        dev = self.model.device
        inputs = torch.zeros(2 * Bp * Tb + Bp, dtype=torch.int64, device=dev)
        inputs[Bp * Tb : 2 * Bp * Tb] = torch.arange(Tb, device=dev).repeat(Bp)
        inputs[2 * Bp * Tb :] = self.cache.scratch_slot  # warm-up: scratch only
        g = _Graph(None, inputs, None)
        if not self.capture:
            return g
        side = torch.cuda.Stream(dev)  # warm up (cuBLAS handles, workspaces) off the capture
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._forward(g, Bp, Tb, kv)
        torch.cuda.current_stream(dev).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self.pool, capture_error_mode="thread_local"):
            g.logits = self._forward(g, Bp, Tb, kv)
        return g
