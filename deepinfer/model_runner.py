"""ModelRunner: the only code that touches the device. Builds batch tensors, runs every forward
of the engine (prefill, decode, DSpark's verify) and moves KV entries between slots.

Prefill: ragged prompts are right-padded to the longest; each row keeps its own positions, so
padding only writes cache rows past the prompt, which the masks never read.
Decode, three ways:
- eager (CPU; CUDA with cuda_graphs=False): one `forward` over the running rows, ordered by KV
  slot so contiguous slots are a slice of the cache rather than a gather;
- CUDA graphs (default on CUDA): the fixed-shape `decode_static`, captured once per batch bucket
  and kv-length bucket and replayed (see cuda_graphs.py); one graph launch instead of ~25 kernel
  launches a layer;
- deterministic: kernels whose per-row arithmetic does not depend on the batch. On CUDA the
  Triton matmul, RMSNorm and attention of kernels/invariant.py, in batched prefill
  (`forward(invariant=True)`) and in decode (`decode_static(invariant=True)`, replayed as the
  same bucketed graphs); on CPU prefill one request at a time and decode in fixed tiles of
  slots (every tile one shape) with the block attention. Either way a request's logits are
  bit-identical whatever else is batched with it and wherever it sits.
Verify (DSpark): T positions a row, [last token, *drafts, pad...]; replayed from the same
`StepGraphs` as decode (tiles of T positions) where the decode is, else one eager `forward`.
No path synchronizes with the device: inputs go through pinned memory, logits come back as a
device tensor the caller reads when it needs to (so host work overlaps the forward).
"""

from __future__ import annotations

import torch

from . import _threads  # noqa: F401  (OMP policy before torch)
from .cuda_graphs import StepGraphs, Tile, batch_buckets, kv_bucket, plan_decode, plan_verify, t_bucket
from .kernels.decode_attention import ATTN_CHUNK
from .models.kv_cache import KVCache
from .models.llama import DECODE_ATTENTION, ForwardBatch, LlamaModel
from .sequence import Sequence

# Rows of a deterministic decode tile (torch kernels: every tile has this many rows whatever the
# batch, so a row's arithmetic never changes). Not used with the batch-invariant kernels.
DETERMINISTIC_TILE = 8


class ModelRunner:
    """Runs prefill, decode and verify steps of `model` over a slot KV cache.

    Parameters
    ----------
    cuda_graphs : bool or None
        Replay decode (and verify) steps as CUDA graphs; None = on CUDA only.
    deterministic : bool
        Batch-invariant forward: a request's logits do not depend on the rest of the batch.
        No global torch setting is changed.
    invariant_kernels : bool or None
        In deterministic mode, how: True = the batch-invariant Triton kernels (matmul, RMSNorm,
        attention) at any batch shape; False = torch kernels over fixed tiles of
        DETERMINISTIC_TILE slots (each kernel sees one problem whatever the batch). None: True
        on CUDA, False on CPU (where Triton only interprets).
    attention : "sdpa", "torch", "triton", "rows" or None
        Attention of the fixed-shape decode (`LlamaModel.decode_static`). None: "sdpa" (torch's
        SDPA with a length mask); in deterministic mode "triton" with the invariant kernels,
        else the batch-invariant "rows" on CPU (one SDPA call per decoded row over its own keys)
        and "torch" (fixed key blocks) on CUDA, where "rows" is not allowed (host reads).
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
        self.invariant = deterministic and (on_cuda if invariant_kernels is None else invariant_kernels)
        self.tile = DETERMINISTIC_TILE if deterministic and not self.invariant else None
        # the attentions this mode allows, its default first ("rows" reads lengths on the host)
        if self.invariant:
            allowed = ("triton",)
        elif deterministic:
            allowed = ("torch", "triton") if on_cuda else ("rows", "torch", "triton")
        else:
            allowed = tuple(a for a in DECODE_ATTENTION if not (on_cuda and a == "rows"))
        if attention is None:
            attention = allowed[0]
        if attention not in allowed:
            raise ValueError(f"attention must be one of {allowed} here, got {attention!r}")
        self.attention = attention
        # decode through decode_static (graph-shaped); also settable for tests of that path on CPU
        self.static_decode = self.cuda_graphs or deterministic
        self.cache: KVCache | None = None
        # the fixed-shape steps over this cache: CUDA graphs (decode and verify), or run eagerly
        # from the same static inputs without cuda_graphs
        self.graphs: StepGraphs | None = None

    def ensure_cache(self, num_slots: int, max_len: int) -> None:
        """(Re)allocate the KV cache when it is smaller than asked; only between requests."""
        if self.cache is None or not self.cache.fits(num_slots, max_len):
            self.cache = self.graphs = None  # free the old one (and the graphs holding it) first
            tile = self.tile or 1
            spare = -(-num_slots // tile) * tile - num_slots + 1  # whole tiles + the scratch slot
            self.cache = self.model.new_cache(
                num_slots, max_len, spare_slots=spare, len_multiple=ATTN_CHUNK if self.tile else 1
            )
            self.graphs = StepGraphs(
                self.model,
                self.cache,
                attention=self.attention,
                invariant=self.invariant,
                capture=self.cuda_graphs,
            )

    def slot_buckets(self) -> list[int] | None:
        """The batch buckets of the decode graphs' single tile, which the scheduler compacts
        the running rows into (None: no compaction -- no graphs, or deterministic tiles)."""
        if not self.cuda_graphs or self.tile or self.cache is None:
            return None
        return batch_buckets(self.cache.num_slots)

    def capture_graphs(self, max_len: int, positions: tuple[int, ...] = ()) -> int:
        """Capture now what decode (and, for each of ``positions``, the verify forward) would
        capture on first use: one graph per batch bucket x key bucket up to ``max_len`` keys.
        Returns the number of graphs captured."""
        assert self.cache is not None, "ensure_cache() first"
        if not self.cuda_graphs or self.tile:
            return 0
        cache, n = self.cache, 0
        kvs, kv = [], 0
        while kv < min(max_len, cache.max_len):
            kv = kv_bucket(kv + 1, cache.max_len)
            kvs.append(kv)
        for rows in batch_buckets(cache.num_slots):
            for kv in kvs:
                n += self.graphs.ensure(Tile(0, rows, kv))
                for T in positions if not self.deterministic else ():  # no drafts in deterministic mode
                    n += self.graphs.ensure(Tile(0, rows, kv, t_bucket(T)))
        return n

    def move_slots(self, moves: list[tuple[Sequence, int, int]]) -> None:
        """Copy the KV entries of the sequences the scheduler moved, ``(sequence, src, dst)``
        (compaction: one copy each of K and V, the sequence's first len(sequence) positions)."""
        if not moves:
            return
        k, v = self.cache.k, self.cache.v  # [layers, slots, nkv, max_len, hd]
        for s, src, dst in moves:
            length = len(s)
            k[:, dst, :, :length] = k[:, src, :, :length]
            v[:, dst, :, :length] = v[:, src, :, :length]

    def _to(self, rows: list) -> torch.Tensor:
        pin = self.device.type == "cuda"  # a pinned source makes the copy truly asynchronous
        return torch.tensor(rows, dtype=torch.int64, pin_memory=pin).to(self.device, non_blocking=True)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Run every uncached token of each sequence; logits [B, V] of each one's last token."""
        if self.tile and len(seqs) > 1:  # torch kernels: a request's prefill never sees its neighbours
            return torch.cat([self.prefill([s]) for s in seqs])
        chunks = [s.all_token_ids[s.num_cached :] for s in seqs]
        T = max(len(c) for c in chunks)
        tokens = [c + [0] * (T - len(c)) for c in chunks]
        positions = [list(range(s.num_cached, s.num_cached + T)) for s in seqs]
        from_zero = all(s.num_cached == 0 for s in seqs)
        logits = self._forward(seqs, tokens, positions, [len(c) - 1 for c in chunks], from_zero)
        for s in seqs:
            s.num_cached = len(s)
        return logits

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step for sequences whose last token is not cached yet; logits [B, V] (not synced)."""
        last = [_last_token(s) for s in seqs]
        if self.static_decode:
            logits = self._decode_static(seqs, last)
        else:
            logits = self._forward(seqs, [[t] for t in last], [[len(s) - 1] for s in seqs], None)
        for s in seqs:
            s.num_cached = len(s)
        return logits

    def verify(
        self, seqs: list[Sequence], drafts: list[list[int]], T: int, *, graphs: bool = True
    ) -> torch.Tensor:
        """DSpark's verify forward: row b feeds [last token, *drafts[b]] (right-padded to T) at
        positions L-1 .. L-1+T-1 (L = len(seqs[b])); logits [B, T, V] float32, the target's
        distribution after each prefix. Replayed as CUDA graphs where decode is (``graphs``
        and every row has room for the bucketed positions): then a view of the graphs' shared
        output, to be read before the next replay. Leaves ``num_cached`` to the caller (it
        depends on how many drafts are accepted)."""
        if graphs and self.cuda_graphs and self.graphs.fits(seqs, T):
            return self.verify_static(seqs, drafts, T)
        return self.verify_eager(seqs, drafts, T)

    @torch.inference_mode()
    def verify_static(self, seqs: list[Sequence], drafts: list[list[int]], T: int) -> torch.Tensor:
        """The verify forward at fixed shapes through ``self.graphs`` (captured on CUDA; on the
        CPU run eagerly from the same static inputs)."""
        assert self.cache is not None, "ensure_cache() first"
        cache = self.cache
        plan = plan_verify(
            [s.slot for s in seqs],
            [[_last_token(s), *d] for s, d in zip(seqs, drafts)],
            [len(s) for s in seqs],
            T,
            num_slots=cache.num_slots,
            scratch_slot=cache.scratch_slot,
            max_len=cache.max_len,
        )
        host = torch.tensor(plan.inputs + (plan.order or []), dtype=torch.int64,
                            pin_memory=self.device.type == "cuda")  # fmt: skip
        n = len(plan.inputs)
        logits = self.graphs.run(plan.tile, host[:n])
        if plan.order is None:
            return logits[: len(seqs), :T]
        return logits.index_select(0, host[n:].to(logits.device, non_blocking=True))[:, :T]

    def verify_eager(self, seqs: list[Sequence], drafts: list[list[int]], T: int) -> torch.Tensor:
        """The verify forward as one eager ``forward`` over the rows (logits at every position)."""
        assert self.cache is not None, "ensure_cache() first"
        tokens, positions = [], []
        for s, d in zip(seqs, drafts):
            tokens.append([_last_token(s), *d] + [0] * (T - 1 - len(d)))
            start = len(s) - 1
            positions.append(list(range(start, start + T)))
        batch = ForwardBatch.of_rows(self._to, [s.slot for s in seqs], tokens, positions)
        return self.model.forward(batch, self.cache)  # [B, T, V]

    def _decode_static(self, seqs: list[Sequence], last: list[int]) -> torch.Tensor:
        assert self.cache is not None, "ensure_cache() first"
        cache = self.cache
        plan = plan_decode(
            [s.slot for s in seqs],
            last,
            [len(s) - 1 for s in seqs],
            num_slots=cache.num_slots,
            scratch_slot=cache.scratch_slot,
            max_len=cache.max_len,
            tile=self.tile,
        )
        # one pinned host buffer: every tile's [3, rows] inputs, then the output row order
        host = torch.tensor(
            plan.inputs + plan.order, dtype=torch.int64, pin_memory=self.device.type == "cuda"
        )
        outs, at = [], 0
        for tile in plan.tiles:
            outs.append(self.graphs.run(tile, host[at : at + 3 * tile.rows]))
            at += 3 * tile.rows
        order = host[at:].to(self.device, non_blocking=True)
        logits = outs[0] if len(outs) == 1 else torch.cat(outs)
        return logits.index_select(0, order)  # a fresh tensor: the graphs' outputs get reused

    def _forward(
        self,
        seqs: list[Sequence],
        tokens: list[list[int]],
        positions: list[list[int]],
        last: list[int] | None,
        from_zero: bool = False,
    ) -> torch.Tensor:
        assert self.cache is not None, "ensure_cache() first"
        batch = ForwardBatch.of_rows(
            self._to,
            [s.slot for s in seqs],
            tokens,
            positions,
            logits_index=last if len(tokens[0]) > 1 else None,
            from_zero=from_zero,
        )
        logits = self.model.forward(batch, self.cache, invariant=self.invariant)
        return logits if logits.dim() == 2 else logits[:, -1]


def _last_token(s: Sequence) -> int:
    """The sequence's newest token (not cached yet when it was sampled last step)."""
    return s.output_token_ids[-1] if s.output_token_ids else s.prompt_token_ids[-1]
