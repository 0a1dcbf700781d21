"""Fixed-shape decode: the host-side plan of a step, and the CUDA graphs that replay it.

A fixed-shape step runs `LlamaModel.decode_static` over tiles of slots, slot-major: row i of a
tile is KV slot `slot_start + i`, so its keys are a slice of the cache, never a gather. Slots of
a tile that this step does not decode are padding rows: token 0 at position 0, writing their
K/V into the cache's scratch slot (their outputs are dropped). Two ways to tile:

- graphs (default on CUDA): one tile [0, Bp), Bp the smallest batch bucket > the highest slot
  decoded. Buckets are 1, 2, 4, 8, then multiples of 16, and the cache's slot count itself.
- deterministic: tiles of a fixed size [t * tile, (t + 1) * tile), one per tile holding a decoded
  slot. Every tile has the same shapes, so a row's arithmetic (matmuls, norms, elementwise ops'
  vectorisation) is the same whatever else is in the batch and wherever it sits.

Keys attended per tile: kv_len, the smallest of floor * 2^k covering the tile's longest sequence,
capped at the cache's length (in deterministic mode in units of the attention chunk, whose
blocks past a row's length are exact no-ops, so kv_len does not change that row's result).

The plan is plain Python (testable without a GPU); `DecodeGraphs` captures one CUDA graph per
(tile, kv_len) on first use, all sharing one memory pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models.decode_attention import ATTN_CHUNK
from .models.kv_cache import KVCache
from .models.llama import LlamaModel

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 16
KV_FLOOR = 256


def batch_buckets(num_slots: int) -> list[int]:
    """Batch sizes a graph is captured for: 1, 2, 4, 8, 16, 32, 48, ... below num_slots, then num_slots."""
    small = [b for b in SMALL_BUCKETS if b < num_slots]
    return small + list(range(BUCKET_STEP, num_slots, BUCKET_STEP)) + [num_slots]


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket >= n."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"batch of {n} rows exceeds the largest bucket ({buckets[-1]})")


def kv_bucket(need: int, max_len: int, *, unit: int = 1, floor: int = KV_FLOOR) -> int:
    """Keys to attend for a longest sequence of `need` tokens: floor * 2^k >= need, at most max_len
    (rounded up to whole `unit`s; max_len is a multiple of `unit`)."""
    if need > max_len:
        raise ValueError(f"sequence length {need} exceeds the KV cache ({max_len} positions)")
    n = floor
    while n < need:
        n *= 2
    n = -(-n // unit) * unit
    return min(n, max_len)


@dataclass(frozen=True)
class Tile:
    slot_start: int  # rows are slots [slot_start, slot_start + rows)
    rows: int
    kv_len: int


@dataclass
class DecodePlan:
    tiles: list[Tile]
    inputs: list[int]  # per tile, 3 x rows ints: tokens, then positions, then write slots
    order: list[int]  # for each decoded sequence (in call order), its row in the tiles' stacked outputs


def plan_decode(
    slots: list[int],
    tokens: list[int],
    positions: list[int],
    *,
    num_slots: int,
    scratch_slot: int,
    max_len: int,
    tile: int | None = None,
) -> DecodePlan:
    """Lay out one decode step of the sequences in `slots` (with their last token and its position).

    tile None: one bucketed tile from slot 0 (CUDA graphs). tile = n: fixed tiles of n slots and
    kv_len in whole attention chunks (deterministic mode); the cache then has at least
    ceil(num_slots / n) * n slots besides the scratch one.
    """
    if len(set(slots)) != len(slots):
        raise ValueError(f"two sequences share a KV slot: {slots}")
    by_slot = {s: i for i, s in enumerate(slots)}
    if tile is None:
        rows = bucket_for(max(slots) + 1, batch_buckets(num_slots))
        starts, unit, floor = [0], 1, KV_FLOOR
    else:
        rows = tile
        starts, unit, floor = sorted({s // tile * tile for s in slots}), ATTN_CHUNK, ATTN_CHUNK
    tiles: list[Tile] = []
    inputs: list[int] = []
    order = [0] * len(slots)
    for k, s0 in enumerate(starts):
        members = [(s, by_slot[s]) for s in range(s0, s0 + rows) if s in by_slot]
        need = max(positions[i] for _, i in members) + 1
        tiles.append(Tile(s0, rows, kv_bucket(need, max_len, unit=unit, floor=floor)))
        tok, pos, write = [0] * rows, [0] * rows, [scratch_slot] * rows
        for s, i in members:
            r = s - s0
            tok[r], pos[r], write[r] = tokens[i], positions[i], s
            order[i] = k * rows + r
        inputs += tok + pos + write
    return DecodePlan(tiles, inputs, order)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [3, rows] int64: tokens, positions, write slots (static: copy into it)
    logits: torch.Tensor  # [rows, V] float32 (static: read after replay)


class DecodeGraphs:
    """One CUDA graph of `model.decode_static` per (tile, kv_len), for one KV cache."""

    def __init__(self, model: LlamaModel, cache: KVCache, *, attention: str, invariant: bool = False):
        self.model, self.cache, self.attention, self.invariant = model, cache, attention, invariant
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Tile, _Graph] = {}

    def ensure(self, tile: Tile) -> bool:
        """Capture the graph of ``tile`` unless it exists; True when it was captured now."""
        if tile in self.graphs:
            return False
        self.graphs[tile] = self._capture(tile)
        return True

    def run(self, tile: Tile, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: [3, rows] int64 (pinned host memory or device). Returns the graph's static
        logits [rows, V]: valid until this graph replays again. No host sync (after capture)."""
        self.ensure(tile)
        g = self.graphs[tile]
        g.inputs.copy_(inputs, non_blocking=True)
        g.graph.replay()
        return g.logits

    def _capture(self, tile: Tile) -> _Graph:
        dev = self.model.device
        inputs = torch.zeros(3, tile.rows, dtype=torch.int64, device=dev)
        inputs[2].fill_(self.cache.scratch_slot)  # the warm-up run writes only the scratch slot

        def step() -> torch.Tensor:
            return self.model.decode_static(
                inputs[0], inputs[1], inputs[2], self.cache,
                slot_start=tile.slot_start, kv_len=tile.kv_len, attention=self.attention,
                invariant=self.invariant,
            )

        side = torch.cuda.Stream(dev)  # warm up (cuBLAS handles, workspaces) off the capture
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the host thread filling bitmasks meanwhile may make CUDA calls of its own
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = step()
        return _Graph(graph, inputs, logits)
