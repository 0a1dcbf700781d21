"""ModelRunner: the only code that touches the device. Builds batch tensors from the scheduler's
plain data and runs every forward of the engine (a mixed step of prefill chunks and decodes,
DSpark's verify) over the paged KV cache.

A step's rows each feed their uncached tokens (``step(rows, counts)``): a decode row one token,
a prefill row a chunk of its prompt. Three ways to run it:
- eager (CPU; any step with a prefill chunk; CUDA with cuda_graphs=False): one flat `forward`
  over every row's tokens, no padding;
- CUDA graphs (default on CUDA, steps whose rows all decode one token): the fixed-shape
  `decode_static`, captured once per batch bucket and kv-length bucket and replayed (see
  cuda_graphs.py); one graph launch instead of ~25 kernel launches a layer;
- deterministic: kernels whose per-row arithmetic does not depend on the batch. On CUDA the
  Triton matmul, RMSNorm and attention of kernels/invariant.py and kernels/paged_attention.py,
  in the flat forward (`forward(invariant=True)`) and in decode (`decode_static(invariant=True)`,
  the same bucketed graphs); on the CPU each prefill chunk runs alone (the scheduler aligns
  chunks to DETERMINISTIC_CHUNK positions, so a chunk has the same shape with or without a
  prefix hit) and decode runs in fixed tiles of rows with per-row attention. Either way a
  request's logits are bit-identical whatever else is batched with it.
Verify (DSpark): T positions a row, [last token, *drafts, pad...]; replayed from the same
`StepGraphs` as decode where the decode is, else one eager `forward`; in deterministic mode
with the same per-position arithmetic as decode (batch-invariant kernels, or decode's tiles).
A ragged verify (``verify(..., ragged=True)``) feeds each row only its own drafts, every fed
position a decode row of its own, through the decode graphs (mixed steps' path), so it costs a
decode step of as many rows as it feeds.
No path synchronizes with the device: inputs go through pinned memory, logits come back as a
device tensor the caller reads when it needs to (so host work overlaps the forward).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from . import _threads  # noqa: F401  (OMP policy before torch)
from .cuda_graphs import (
    StepGraphs,
    Tile,
    batch_buckets,
    bucket_for,
    kv_bucket,
    plan_step,
    t_bucket,
    tile_size,
)
from .kernels import quantized
from .models.kv_cache import KVCache
from .models.llama import DECODE_ATTENTION, ForwardBatch, LlamaModel
from .sequence import Sequence

# Rows of a deterministic decode tile (torch kernels: every tile has this many rows whatever the
# batch, so a row's arithmetic never changes). Not used with the batch-invariant kernels.
DETERMINISTIC_TILE = 8
# Tokens a step's prompt chunks may add to its decode rows and still run in the decode graphs
# (default mode on CUDA): each prompt token becomes a decode row of its own, so a step where
# short prompts join the running batch replays a graph instead of the eager forward. A server
# meets several arrivals in one step (a few hundred prompt tokens) as often as one.
MIXED_TOKENS = 256
# The first decode graph above max_rows holds this many prompt tokens; each next one twice as
# many, up to MIXED_TOKENS (a step pads its prompt tokens by at most 2x, in few graphs).
MIXED_FIRST = 16
# Prefill chunk of the CPU's deterministic mode: chunks start at multiples of it, so a prompt's
# chunks are the same shapes whether a prefix of it was cached or not.
DETERMINISTIC_CHUNK = 64

log = logging.getLogger(__name__)  # warm-up progress (CUDA graph captures)


class ModelRunner:
    """Runs prefill, decode and verify steps of `model` over a paged KV cache.

    Parameters
    ----------
    cuda_graphs : bool or None
        Replay decode (and verify) steps as CUDA graphs; None = on CUDA only.
    deterministic : bool
        Batch-invariant forward: a request's logits do not depend on the rest of the batch.
        No global torch setting is changed.
    invariant_kernels : bool or None
        In deterministic mode, how: True = the batch-invariant Triton kernels (matmul, RMSNorm,
        attention) at any batch shape; False = torch kernels, prefill chunks alone and decode
        in fixed tiles of DETERMINISTIC_TILE rows. None: True on CUDA, False on CPU (where
        Triton only interprets).
    attention : "sdpa", "torch", "triton", "split", "rows" or None
        Attention of the fixed-shape decode (`LlamaModel.decode_static`). None: on CUDA "split"
        (the paged kernel, each row's keys split into runs of a program each), in deterministic
        mode "triton" (the same kernel, one program per row and KV head); in deterministic mode
        on the CPU "rows" (one SDPA call per row over its own keys).
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        cuda_graphs: bool | None = None,
        deterministic: bool = False,
        invariant_kernels: bool | None = None,
        attention: str | None = None,
    ):
        self.model = model
        self.device = model.device
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError(f"cuda_graphs=True needs a CUDA model, this one is on {self.device}")
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        self.deterministic = deterministic
        if deterministic and any(layer.moe is not None for layer in model.layers):
            raise ValueError(
                "deterministic mode does not cover mixture-of-experts models: a token's experts run "
                "grouped with the other tokens routed to them (see docs/models.md)"
            )
        self.invariant = deterministic and (on_cuda if invariant_kernels is None else invariant_kernels)
        self.tile = DETERMINISTIC_TILE if deterministic and not self.invariant else None
        # the attentions this mode allows, its default first ("rows" reads lengths on the host)
        if self.invariant:
            allowed = ("triton",)
        elif deterministic:
            allowed = ("torch", "triton") if on_cuda else ("rows", "torch", "triton")
        elif on_cuda:
            allowed = ("split", "triton", "sdpa", "torch")
        else:
            allowed = tuple(a for a in DECODE_ATTENTION if a != "rows")
        if attention is None:
            attention = allowed[0]
        if attention not in allowed:
            raise ValueError(f"attention must be one of {allowed} here, got {attention!r}")
        self.attention = attention
        # the eager forward's attention for one-token rows (prompt chunks take torch's SDPA):
        # the paged Triton kernel on CUDA (split over the keys in a decode step, unless
        # deterministic), torch on the CPU
        self.eager_attention = "triton" if on_cuda else "torch"
        # decode through decode_static (graph-shaped); also settable for tests of that path on CPU
        self.static_decode = self.cuda_graphs or deterministic
        self.cache: KVCache | None = None
        self.max_rows = 1
        # the fixed-shape steps over this cache: CUDA graphs (decode and verify), or run eagerly
        # from the same static inputs without cuda_graphs
        self.graphs: StepGraphs | None = None
        self._staging: list = [(None, None), (None, None)]  # pinned input buffers (CUDA), in turn
        self._turn = 0

    # -- the cache ------------------------------------------------------------------------------
    def allocate(self, num_blocks: int | list[int], block_size: int, max_rows: int) -> KVCache:
        """The paged KV cache (``num_blocks`` blocks, the null block included; a list: per
        KV-cache group) for at most ``max_rows`` sequences a step."""
        self.cache = self.graphs = None  # free an old one (and the graphs holding it) first
        self.cache = self.model.new_cache(num_blocks, block_size)
        self.max_rows = max_rows
        # (a tensor-parallel model brings its own StepGraphs, which its worker ranks mirror)
        self.graphs = getattr(self.model, "step_graphs_class", StepGraphs)(
            self.model,
            self.cache,
            max_rows=max_rows,
            attention=self.attention,
            invariant=self.invariant,
            capture=self.cuda_graphs,
        )
        return self.cache

    @property
    def max_len(self) -> int:
        """Positions a fixed-shape step may address (the RoPE tables' length)."""
        return self.model.cos.shape[0]

    def capture_graphs(self, max_len: int, positions: tuple[int, ...] = ()) -> int:
        """Capture now what decode (and, for each of ``positions``, the verify forward) would
        capture on first use: one decode graph per batch bucket x key bucket up to ``max_len``
        keys, one verify graph per batch bucket x width (x key bucket where its attention's cost
        depends on it; see ``verify_kv``). Returns the number of graphs captured."""
        assert self.cache is not None, "allocate() first"
        if not self.cuda_graphs or self.tile:
            return 0
        n, kvs, kv = 0, [], 0
        while kv < min(max_len, self.model.max_len):
            kv = kv_bucket(kv + 1, self.model.max_len)
            kvs.append(kv)
        verify_kvs = kvs if self.verify_kv is None else [self.verify_kv]
        t0 = time.perf_counter()
        for rows in self.buckets():
            before, t_rows = n, time.perf_counter()
            for kv in kvs:
                n += self.graphs.ensure(Tile(rows, kv))
            if rows <= self.max_rows:  # (above: mixed steps only; a verify step has at most max_rows rows)
                for T in sorted({t_bucket(T) for T in positions}):
                    for kv in verify_kvs:
                        n += self.graphs.ensure(Tile(rows, kv, T))
            if n > before:
                now = time.perf_counter()
                log.info("CUDA graphs at batch %d: %d captured in %.1f s (%d in %.1f s so far)",
                         rows, n - before, now - t_rows, n, now - t0)  # fmt: skip
        return n

    @property
    def verify_kv(self) -> int | None:
        """Keys of every verify graph where the paged Triton attention runs (it reads each row's
        keys up to its own position, so the width costs nothing and one graph per shape serves
        every length); None: the key buckets, as decode's."""
        return self.max_len if self.attention in ("triton", "split") else None

    def _to(self, rows: list) -> torch.Tensor:
        pin = self.device.type == "cuda"  # a pinned source makes the copy truly asynchronous
        return torch.tensor(rows, dtype=torch.int64, pin_memory=pin).to(self.device, non_blocking=True)

    # -- steps ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, rows: list[Sequence], counts: list[int]) -> torch.Tensor:
        """Row i computes its next ``counts[i]`` uncached tokens. Returns the logits [M, V] (not
        synced) of the rows whose tokens are then all cached (the ones that sample), in row
        order; ``num_cached`` advances."""
        decode = all(n == 1 and s.completes(1) for s, n in zip(rows, counts))
        if decode and self.static_decode:
            logits = self._decode_static(rows)
        elif self._mixed_fits(rows, counts):
            logits = self._mixed_static(rows, counts)
        elif self.tile:
            logits = self._step_tiles(rows, counts)
        else:
            logits = self._forward(rows, counts)
        for s, n in zip(rows, counts):
            s.num_cached += n
        return logits

    @property
    def feeds_device_tokens(self) -> bool:
        """Can a decode step take its tokens from a device tensor (``step_ahead``)? Through the
        fixed-shape decode of this process's own graphs (not a tensor-parallel model's, whose
        worker ranks take every input from the host)."""
        return self.static_decode and type(self.graphs) is StepGraphs

    @torch.inference_mode()
    def step_ahead(self, rows: list[Sequence], tokens: torch.Tensor) -> torch.Tensor:
        """A decode step launched before the rows' newest tokens reach the host (async
        scheduling): row i feeds ``tokens[i]`` (int64 on the device, sampled by the step before
        and not yet appended) at position ``len(rows[i])``, whose block the caller has reserved.
        Returns the logits [len(rows), V] (not synced). ``num_cached`` is left as it is: the
        caller advances it when it takes the step."""
        assert self.feeds_device_tokens, "step_ahead needs the fixed-shape decode"
        return self._run_tiles(rows, [[0]] * len(rows), [len(s) for s in rows], fed=tokens)

    @property
    def graph_rows(self) -> int:
        """Rows of the largest decode graph: ``max_rows``, and MIXED_TOKENS more where mixed steps
        replay the decode graphs (CUDA graphs, default mode)."""
        return self.max_rows + (MIXED_TOKENS if self.cuda_graphs and not self.deterministic else 0)

    def buckets(self) -> list[int]:
        """The decode graphs' row counts: ``batch_buckets(max_rows)``, then, for mixed steps,
        max_rows + 16, + 32, + 64, ... up to ``graph_rows``."""
        low = batch_buckets(self.max_rows)
        extra, m = [], MIXED_FIRST
        while self.max_rows + m < self.graph_rows:
            extra.append(self.max_rows + m)
            m *= 2
        return low + extra + ([self.graph_rows] if self.graph_rows > self.max_rows else [])

    def _mixed_fits(self, rows: list[Sequence], counts: list[int]) -> bool:
        """A step with prompt chunks that the decode graphs can run: default mode on CUDA, at most
        ``graph_rows`` tokens, every position inside the graphs' RoPE tables."""
        if not self.cuda_graphs or self.deterministic or sum(counts) > self.graph_rows:
            return False
        return max(s.num_cached + n for s, n in zip(rows, counts)) <= self.model.max_len

    def _mixed_static(self, rows: list[Sequence], counts: list[int]) -> torch.Tensor:
        """A step with prompt chunks through the decode graphs: each fed token a decode row of its
        own (its token, its position, its sequence's blocks), as ``verify_tiles`` lays out
        positions. The step writes every row's K/V before any row attends, so a prompt token sees
        the tokens before it in its chunk. Logits of the rows that sample, in row order."""
        seqs, tokens, starts, last = [], [], [], []
        for s, n in zip(rows, counts):
            ids = s.all_token_ids
            for j in range(s.num_cached, s.num_cached + n):
                seqs.append(s)
                tokens.append([ids[j]])
                starts.append(j)
            if s.completes(n):
                last.append(len(seqs) - 1)
        logits = self._run_tiles(seqs, tokens, starts)
        if len(last) == len(seqs):
            return logits
        return logits[self._to(last)]

    def _step_tiles(self, rows: list[Sequence], counts: list[int]) -> torch.Tensor:
        """Deterministic mode with torch kernels: each prefill chunk alone, the decode rows in
        fixed tiles; the sampled rows' logits in row order."""
        decodes = [s for s, n in zip(rows, counts) if n == 1 and s.completes(1)]
        out = {}
        if decodes:
            for s, x in zip(decodes, self._decode_static(decodes)):
                out[id(s)] = x
        for s, n in zip(rows, counts):
            if id(s) not in out:
                x = self._forward([s], [n])
                if len(x):
                    out[id(s)] = x[0]
        sampled = [out[id(s)] for s, n in zip(rows, counts) if s.completes(n)]
        if not sampled:
            return torch.empty(0, self.model.logits_width, device=self.device)
        return torch.stack(sampled)

    def verify_cap(self) -> int | None:
        """Most tokens a verify forward should hold, whatever its rows; None for no cap. On the
        CPU a decode step of at most `quantized.GEMV_ROWS` rows multiplies an int4 model's
        matrices in the C GEMV (int8 activations, each row's arithmetic its own). A verify
        forward of at most that many tokens runs the same kernels, its attention as decode rows
        (`llama.CHUNK_ROWS`), so each position's logits are bit for bit those of a decode step
        there, at about the cost of a decode step of as many rows. With more tokens torch's
        int4 kernel (bfloat16 activations) rounds otherwise, and a token costs more than a decode
        step's: at 8 rows on the embedded model a verify forward of 2 positions took 2.3 times
        a decode forward, of 3 positions 4.3 times, so no draft could pay. So a verify step holds
        at most GEMV_ROWS tokens there: 1 row up to 3 drafts, 2 rows 1 each, more rows none."""
        if (
            self.device.type == "cpu"
            and not self.deterministic
            and getattr(self.model, "int4", False)
            and self.model.dtype == torch.bfloat16
            and quantized._GEMV.fn is not None
        ):
            return quantized.GEMV_ROWS
        return None

    def ragged_tokens(self, default: bool = True) -> int:
        """Most tokens a ragged verify forward (``verify(..., ragged=True)``) may feed: where the
        decode CUDA graphs run it (default mode on CUDA), ``graph_rows``; with ``default`` False,
        also the fixed tiles of deterministic mode (any number: how every verify forward runs
        there) and elsewhere the static decode inputs of the largest batch (``max_rows``); else 0."""
        if self.cuda_graphs and not self.deterministic:
            return self.graph_rows
        if default:
            return 0
        return 1 << 30 if self.tile else self.max_rows

    def verify(
        self,
        seqs: list[Sequence],
        drafts: list[list[int]],
        T: int,
        *,
        graphs: bool = True,
        ragged: bool = False,
    ) -> torch.Tensor:
        """DSpark's verify forward: row b feeds [last token, *drafts[b]] (right-padded to T) at
        positions L-1 .. L-1+T-1 (L = len(seqs[b])), its blocks covering the real ones; logits
        [B, T, V] float32, the target's distribution after each prefix. Replayed as CUDA graphs
        where decode is (``graphs``, and every row's bucketed positions inside the model's
        length): then a view of the graphs' shared output, to be read before the next replay.
        Leaves ``num_cached`` to the caller (it depends on how many drafts are accepted). In
        deterministic mode every position computes the bits a decode step there gives (the
        batch-invariant kernels on CUDA; the fixed decode tiles on the CPU, ``verify_tiles``).
        ``ragged``: each fed position a row of the decode graphs (``verify_tiles``; at most
        ``ragged_tokens`` in all), so the forward costs what a decode step of that many rows
        does, not B x T positions."""
        if self.tile or (ragged and self._ragged_fits(seqs, drafts)):
            return self.verify_tiles(seqs, drafts, T)
        fits = max(len(s) for s in seqs) - 1 + t_bucket(T) <= self.model.max_len
        if fits and (self.invariant or (graphs and self.cuda_graphs)):
            return self.verify_static(seqs, drafts, T)
        return self.verify_eager(seqs, drafts, T)

    @torch.inference_mode()
    def verify_static(self, seqs: list[Sequence], drafts: list[list[int]], T: int) -> torch.Tensor:
        """The verify forward at fixed shapes through ``self.graphs`` (captured on CUDA; on the
        CPU run eagerly from the same static inputs)."""
        assert self.cache is not None, "allocate() first"
        Tb = t_bucket(T)
        plan = plan_step(
            [s.block_table for s in seqs],
            [[_last_token(s), *d] for s, d in zip(seqs, drafts)],
            [len(s) - 1 for s in seqs],
            block_size=self.cache.block_size,
            max_len=self.max_len,
            positions=Tb,
            rows=bucket_for(len(seqs), batch_buckets(self.max_rows)),
            more=self._more(seqs),
            kv_len=self.verify_kv,
        )
        logits = self.graphs.run(plan.tiles[0], self._host(plan.inputs))
        self._staged()
        return logits[: len(seqs), :T]

    def _ragged_fits(self, seqs: list[Sequence], drafts: list[list[int]]) -> bool:
        """Can the decode graphs (or static decode inputs) run this ragged verify: at most
        ``ragged_tokens`` fed positions, every one inside the graphs' RoPE tables?"""
        fed = len(seqs) + sum(map(len, drafts))
        if fed > self.ragged_tokens(default=False):
            return False
        return max(len(s) + len(d) for s, d in zip(seqs, drafts)) <= self.model.max_len

    @torch.inference_mode()
    def verify_tiles(self, seqs: list[Sequence], drafts: list[list[int]], T: int) -> torch.Tensor:
        """The verify forward as decode rows: each fed position a row of its own (its token, its
        position, its sequence's blocks) in decode's tiles (the fixed tiles in deterministic
        mode, a decode graph's rows elsewhere), rows in (sequence, position) order. A tile writes
        every row's K/V before any row attends, and tiles run in turn, so a position sees the
        K/V of the positions before it; each gets the logits a decode step there would (bit for
        bit in deterministic mode). [B, T, V]; a row's padding positions are left unwritten
        (never read: the verify kernel stops at the row's drafts)."""
        rows, tokens, starts, index = [], [], [], []
        for b, (s, d) in enumerate(zip(seqs, drafts)):
            for t, tok in enumerate([_last_token(s), *d]):
                rows.append(s)
                tokens.append([tok])
                starts.append(len(s) - 1 + t)
                index.append(b * T + t)
        logits = self._run_tiles(rows, tokens, starts, fresh=False)
        out = torch.empty(len(seqs) * T, logits.shape[1], dtype=logits.dtype, device=logits.device)
        return out.index_copy_(0, self._to(index), logits).view(len(seqs), T, -1)

    @torch.inference_mode()
    def verify_eager(self, seqs: list[Sequence], drafts: list[list[int]], T: int) -> torch.Tensor:
        """The verify forward as one eager ``forward`` over the rows (logits at every position);
        a row's padding positions past its blocks write into the null block."""
        assert self.cache is not None, "allocate() first"
        bs = self.cache.block_size
        chunks = [[_last_token(s), *d] + [0] * (T - 1 - len(d)) for s, d in zip(seqs, drafts)]
        groups = []
        for g in range(len(self.model.kv_groups)):
            tables = []
            for s in seqs:  # the null block stands in for positions past the row's blocks
                t = _table(s, g)
                need = -(-(len(s) - 1 + T) // bs)
                tables.append(t + [0] * max(0, need - len(t)))
            groups.append(tables)
        starts = [len(s) - 1 for s in seqs]
        batch = ForwardBatch.of_chunks(self._to, groups[0], starts, chunks, bs, logits="all", more=groups[1:])
        attention = self._chunk_attention() if T > 1 else self.eager_attention
        out = self.model.forward(batch, self.cache, invariant=self.invariant, attention=attention)
        return out.view(len(seqs), T, -1)

    def _chunk_attention(self) -> str:
        """The eager forward's attention for rows of several tokens (prompt chunks, a verify
        forward's T positions): on CUDA the query-tiled paged kernel (the per-token kernel would
        re-read a sequence's keys once per query), on the CPU torch's SDPA a sequence."""
        return "prefill" if self.eager_attention == "triton" else "torch"

    def _more(self, seqs: list[Sequence]) -> list[list[list[int]]]:
        """The sequences' block tables of KV-cache groups 1.. (none for a model of one group)."""
        return [[_table(s, g) for s in seqs] for g in range(1, len(self.model.kv_groups))]

    def _host(self, inputs: np.ndarray) -> torch.Tensor:
        """A fixed-shape step's inputs in host memory the device copies from asynchronously: on
        CUDA one of two pinned staging buffers, used in turn (a fresh ``pin_memory()`` each step
        cost 0.5 ms at batch 256). A buffer is reused only once the copy from it two steps ago
        is done (``_staged`` records it)."""
        if self.device.type != "cuda":
            return torch.from_numpy(inputs)
        self._turn ^= 1
        buf, done = self._staging[self._turn]
        if done is not None:
            done.synchronize()  # (long done in practice: every step reads its tokens back)
        if buf is None or buf.numel() < len(inputs):
            buf = torch.empty(max(len(inputs), 1 << 14), dtype=torch.int64, pin_memory=True)
        self._staging[self._turn] = (buf, None)
        view = buf[: len(inputs)]
        view.numpy()[:] = inputs
        return view

    def _staged(self) -> None:
        """The copies from the current staging buffer are queued: mark when they are done."""
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self._staging[self._turn] = (self._staging[self._turn][0], ev)

    def _decode_static(self, seqs: list[Sequence]) -> torch.Tensor:
        return self._run_tiles(seqs, [[_last_token(s)] for s in seqs], [len(s) - 1 for s in seqs])

    def _run_tiles(self, seqs: list[Sequence], tokens: list[list[int]], starts: list[int],
                   fed: torch.Tensor | None = None, fresh: bool = True) -> torch.Tensor:  # fmt: skip
        """One decode row each (``tokens[i]`` at ``starts[i]`` through ``seqs[i]``'s blocks; a
        sequence may have several rows), in fixed shapes: logits [rows, V], a fresh tensor
        (``fresh`` False: maybe a view of the graphs' output, to be read before the next replay).
        fed: the rows' tokens as a device tensor instead of ``tokens`` (``step_ahead``)."""
        assert self.cache is not None, "allocate() first"
        plan = plan_step(
            [s.block_table for s in seqs],
            tokens,
            starts,
            block_size=self.cache.block_size,
            max_len=self.max_len if self.tile else self.model.max_len,
            rows=None if self.tile else bucket_for(len(seqs), self.buckets()),
            tile=self.tile,
            more=self._more(seqs),
        )
        host = self._host(plan.inputs)
        outs, at, row = [], 0, 0
        for tile in plan.tiles:  # (tiles of one shape replay one graph: keep each one's output)
            n = tile_size(tile, self.cache.block_size, self.graphs.groups)
            part = host[at : at + n]
            if fed is None:
                x = self.graphs.run(tile, part)
            else:  # (the tile's real rows: the last tile's may be fewer)
                x = self.graphs.run(tile, part, fed[row : row + tile.rows])
            outs.append(x.clone() if len(plan.tiles) > 1 else x)
            at += n
            row += tile.rows
        self._staged()
        logits = outs[0] if len(outs) == 1 else torch.cat(outs)
        if not fresh:
            return logits[: len(seqs)]
        return logits[: len(seqs)].clone()  # a fresh tensor: the graphs' outputs get reused

    def _forward(self, rows: list[Sequence], counts: list[int]) -> torch.Tensor:
        assert self.cache is not None, "allocate() first"
        ids = [s.all_token_ids for s in rows]
        batch = ForwardBatch.of_chunks(
            self._to,
            [s.block_table for s in rows],
            [s.num_cached for s in rows],
            [t[s.num_cached : s.num_cached + n] for s, t, n in zip(rows, ids, counts)],
            self.cache.block_size,
            per_row=self.deterministic,
            more=self._more(rows),
        )
        sampled = [i for i, (s, n) in enumerate(zip(rows, counts)) if s.completes(n)]
        if len(sampled) < len(rows):  # only the rows that sample need logits
            batch.logits_index = batch.logits_index[self._to(sampled)]
        attention = self.eager_attention
        if max(counts) > 1:
            attention = self._chunk_attention()
        elif attention == "triton" and not self.deterministic:  # one token a row: split the keys
            attention = "split"
        return self.model.forward(batch, self.cache, invariant=self.invariant, attention=attention)


def _table(s: Sequence, g: int) -> list[int]:
    """The sequence's block table of KV-cache group g (a sequence given one table, as benchmarks
    lay them out by hand, uses it in every group)."""
    return s.block_tables[g] if g < len(s.block_tables) else s.block_tables[0]


def _last_token(s: Sequence) -> int:
    """The sequence's newest token (not cached yet when it was sampled last step)."""
    return s.output_token_ids[-1] if s.output_token_ids else s.prompt_token_ids[-1]
