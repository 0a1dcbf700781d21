"""Fixed-shape steps: the host-side plan of a decode or verify step, and the CUDA graphs that
replay them.

A fixed-shape step runs `LlamaModel.decode_static` over tiles of slots, slot-major: row i of a
tile is KV slot `slot_start + i`, so its keys are a slice of the cache, never a gather. Slots of
a tile that this step does not run are padding rows: token 0 at positions 0.., writing their
K/V into the cache's scratch slot (their outputs are dropped). A tile has `positions` new tokens
a row: 1 for a decode step, T (bucketed to T_BUCKETS) for DSpark's verify forward. Decode has
two ways to tile:

- graphs (default on CUDA): one tile [0, Bp), Bp the smallest batch bucket > the highest slot
  decoded. Buckets are 1, 2, 4, 8, then multiples of 16, and the cache's slot count itself.
- deterministic: tiles of a fixed size [t * tile, (t + 1) * tile), one per tile holding a decoded
  slot. Every tile has the same shapes, so a row's arithmetic (matmuls, norms, elementwise ops'
  vectorisation) is the same whatever else is in the batch and wherever it sits.

A verify step is one tile [0, Bp) of Tb positions a row; a real row's padding positions
continue its positions (their K/V land past its accepted length: garbage that attention never
reads and later steps overwrite), so it is used only where every row has room for Tb positions
(`StepGraphs.fits`).

Keys attended per tile: kv_len, the smallest of floor * 2^k covering the tile's longest sequence,
capped at the cache's length (in deterministic mode in units of the attention chunk, whose
blocks past a row's length are exact no-ops, so kv_len does not change that row's result).

The plans (`plan_decode`, `plan_verify`) are plain Python (testable without a GPU);
`StepGraphs` captures one CUDA graph per `Tile` (slot_start, rows, kv_len, positions) on first
use, or with ``capture=False`` runs the same fixed-shape forward from the same static inputs
eagerly (CPU tests, deterministic tiles on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels.decode_attention import ATTN_CHUNK
from .models.kv_cache import KVCache
from .models.llama import LlamaModel

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 16
KV_FLOOR = 256
T_BUCKETS = (2, 3, 5, 9, 17, 33)  # positions a row of a verify step
OUT_WIDTH = 9  # positions of the verify graphs' shared logits buffer at first (max_drafts 8, the default)


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


def t_bucket(T: int) -> int:
    """Positions a row of a verify step of T positions runs (T_BUCKETS; T itself past them)."""
    for t in T_BUCKETS:
        if t >= T:
            return t
    return T


@dataclass(frozen=True)
class Tile:
    slot_start: int  # rows are slots [slot_start, slot_start + rows)
    rows: int
    kv_len: int
    positions: int = 1  # new tokens a row: 1 = decode, > 1 = DSpark's verify forward


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
class VerifyPlan:
    tile: Tile  # [0, rows) x positions (bucketed)
    inputs: list[int]  # rows * positions tokens, rows * positions positions, rows write slots
    order: list[int] | None  # each row's slot (its row of the output), None when they are 0..B-1


def plan_verify(
    slots: list[int],
    tokens: list[list[int]],
    lengths: list[int],
    T: int,
    *,
    num_slots: int,
    scratch_slot: int,
    max_len: int,
) -> VerifyPlan:
    """Lay out one verify step: row b (KV slot slots[b], lengths[b] tokens so far) feeds
    tokens[b] = [last token, *drafts] at positions L-1 .. L-1+Tb-1, Tb = t_bucket(T)."""
    Tb = t_bucket(T)
    rows = bucket_for(max(slots) + 1, batch_buckets(num_slots))
    kv = kv_bucket(max(lengths) - 1 + Tb, max_len)
    tok = [0] * (rows * Tb)
    pos = list(range(Tb)) * rows
    write = [scratch_slot] * rows
    for r, row, L in zip(slots, tokens, lengths):
        tok[r * Tb : r * Tb + len(row)] = row
        pos[r * Tb : (r + 1) * Tb] = range(L - 1, L - 1 + Tb)
        write[r] = r
    in_order = slots == list(range(len(slots)))
    return VerifyPlan(Tile(0, rows, kv, Tb), tok + pos + write, None if in_order else list(slots))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: capture=False (run eagerly from the same inputs)
    inputs: torch.Tensor  # [2 * rows * positions + rows] int64: tokens, positions, write slots (static)
    logits: torch.Tensor | None  # decode [rows, V]; verify [rows, positions, V], a view of the shared buffer


class StepGraphs:
    """One CUDA graph of `model.decode_static` per `Tile` (slot_start, rows, kv_len, positions),
    for one KV cache: decode steps (positions 1) and DSpark's verify forward (positions > 1).

    Decode runs the runner's attention (and batch-invariant kernels in deterministic mode) and
    returns the graph's own [rows, V] logits; verify runs SDPA and writes [rows, positions, V]
    into the front of one shared buffer (graphs never replay at once, so memory does not grow
    with the number of shapes; a graph needing a wider one gets a new buffer, and the old ones
    stay alive for the graphs that write into them). Decode graphs share one memory pool, verify
    graphs another. ``capture=False`` keeps the static inputs and runs the forward eagerly.
    """

    def __init__(self, model: LlamaModel, cache: KVCache, *, attention: str = "sdpa", invariant: bool = False,
                 capture: bool = True):  # fmt: skip
        self.model, self.cache, self.attention, self.invariant = model, cache, attention, invariant
        self.capture = capture
        self.graphs: dict[Tile, _Graph] = {}
        self._pools: dict[bool, tuple] = {}  # verify (positions > 1)? -> graph pool handle
        self._outs: list[torch.Tensor] = []

    def fits(self, seqs, T: int) -> bool:
        """Every row's bucketed positions L-1 .. L-1+t_bucket(T)-1 lie inside the cache."""
        return max(len(s) for s in seqs) - 1 + t_bucket(T) <= self.cache.max_len

    def ensure(self, tile: Tile) -> bool:
        """Capture the graph of ``tile`` unless it exists; True when it was made now."""
        if tile in self.graphs:
            return False
        self.graphs[tile] = self._make(tile)
        return True

    def run(self, tile: Tile, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: the tile's flat int64 inputs (pinned host memory or device). Returns its logits:
        a graph's static output, valid until a graph writing there replays again. No host sync
        (after capture)."""
        self.ensure(tile)
        g = self.graphs[tile]
        g.inputs.copy_(inputs, non_blocking=True)
        if g.graph is None:
            return self._forward(tile, g.inputs)
        g.graph.replay()
        return g.logits

    def _out(self, rows: int, positions: int) -> torch.Tensor:
        """The [rows, positions, V] front of the shared verify logits buffer: rows for the largest
        batch bucket, at least OUT_WIDTH positions (a wider buffer is added when one needs it)."""
        buf = self._outs[-1] if self._outs else None
        if buf is None or buf.shape[1] < positions:
            most = batch_buckets(self.cache.num_slots)[-1]
            width = max(positions, OUT_WIDTH)
            buf = torch.empty(
                most, width, self.model.lm_head.shape[1], dtype=torch.float32, device=self.model.device
            )
            self._outs.append(buf)
        return buf[:rows, :positions]

    def _forward(self, tile: Tile, x: torch.Tensor) -> torch.Tensor:
        rows, P = tile.rows, tile.positions
        n = rows * P
        if P == 1:  # decode: [rows] inputs, [rows, V] logits
            return self.model.decode_static(
                x[:n], x[n : 2 * n], x[2 * n :], self.cache, slot_start=tile.slot_start, kv_len=tile.kv_len,
                attention=self.attention, invariant=self.invariant,
            )  # fmt: skip
        return self.model.decode_static(  # verify: [rows, P] inputs, logits into the shared buffer
            x[:n].view(rows, P),
            x[n : 2 * n].view(rows, P),
            x[2 * n :],
            self.cache,
            slot_start=tile.slot_start,
            kv_len=tile.kv_len,
            out=self._out(rows, P),
        )

    def _make(self, tile: Tile) -> _Graph:
        dev = self.model.device
        rows, P = tile.rows, tile.positions
        inputs = torch.zeros(2 * rows * P + rows, dtype=torch.int64, device=dev)
        inputs[rows * P : 2 * rows * P] = torch.arange(P, device=dev).repeat(rows)
        inputs[2 * rows * P :] = self.cache.scratch_slot  # the warm-up run writes only the scratch slot
        g = _Graph(None, inputs, None)
        if not self.capture:
            return g
        verify = P > 1
        if verify not in self._pools:
            self._pools[verify] = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(dev)  # warm up (cuBLAS handles, workspaces) off the capture
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._forward(tile, inputs)
        torch.cuda.current_stream(dev).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        # thread_local: the host thread filling bitmasks meanwhile may make CUDA calls of its own
        with torch.cuda.graph(g.graph, pool=self._pools[verify], capture_error_mode="thread_local"):
            g.logits = self._forward(tile, inputs)
        return g
