"""Fixed-shape steps: the host-side plan of a decode or verify step, and the CUDA graphs that
replay them.

A fixed-shape step runs `LlamaModel.decode_static` over tiles of rows. Row i of the step is
the i-th sequence of the batch; its inputs are its new tokens, their positions, their slots
(where their K/V are written) and its block table. Rows past the batch are padding: token 0 at
positions 0.., writing into the null block (their outputs are dropped). A tile has `positions`
new tokens a row: 1 for a decode step, T (bucketed to T_BUCKETS) for DSpark's verify forward.
Decode has two ways to tile:

- graphs (default on CUDA): one tile of Bp rows, Bp the smallest batch bucket >= the batch.
  Buckets are 1, 2, 4, 8, then multiples of 16, and the most rows the engine runs.
- deterministic: tiles of a fixed size, every tile the same shapes, so a row's arithmetic
  (matmuls, norms, elementwise ops' vectorisation) is the same whatever else is in the batch.

A verify row's padding positions continue its positions: inside its blocks they land past its
accepted length (garbage that attention never reads and later steps overwrite), past them in
the null block.

A model with sliding-window and full-attention layers has a block table per KV-cache group
(``kv_cache.kv_groups``): each group's slots and table follow the first group's in a tile's
inputs, with the same width (one static block table per group).

Keys per tile: kv_len, the smallest of floor * 2^k covering the tile's longest sequence, capped
at the model's length (in deterministic mode in units of the attention chunk, whose blocks past
a row's length are exact no-ops); the block tables are kv_len / block_size wide.

The plan (`plan_step`) is plain Python and numpy (testable without a GPU); `StepGraphs`
captures one CUDA graph per `Tile` (rows, kv_len, positions) on first use, or with
``capture=False`` runs the same fixed-shape forward from the same static inputs eagerly (CPU
tests, deterministic tiles on the CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
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
    rows: int
    kv_len: int  # keys the tile's attention may read: its block tables are kv_len / block_size wide
    positions: int = 1  # new tokens a row: 1 = decode, > 1 = DSpark's verify forward


@dataclass
class StepPlan:
    tiles: list[Tile]
    inputs: np.ndarray  # int64; per tile: tokens, positions, slots (rows x positions each), block tables,
    # then the slots and block tables of each further KV-cache group


def plan_step(
    tables: list[list[int]],
    tokens: list[list[int]],
    starts: list[int],
    *,
    block_size: int,
    max_len: int,
    positions: int = 1,
    rows: int | None = None,
    tile: int | None = None,
    more: tuple = (),
    kv_len: int | None = None,
) -> StepPlan:
    """Lay out one fixed-shape step: sequence i (block table ``tables[i]``) feeds ``tokens[i]``
    (at most ``positions`` of them; the rest of its row is padding) at positions ``starts[i]``
    onwards; its row in the stacked outputs is i.

    rows: the one tile's row count (a batch bucket >= len(tables); CUDA graphs). tile = n:
    fixed tiles of n rows with kv_len in whole attention chunks (deterministic mode). kv_len: the
    keys of every tile (at least its longest sequence needs) instead of the bucket: an attention
    that reads each row's keys up to its own position ("triton") costs the same at any width, so
    one width serves every length. A position past a sequence's blocks, and every position of a
    padding row, writes into the null block.
    more: the sequences' block tables of KV-cache groups 1.. (one list per group).
    """
    B, P = len(tables), positions
    if tile is None:
        groups, unit, floor = [(0, rows or B)], 1, KV_FLOOR
    else:
        groups, unit, floor = [(t0, tile) for t0 in range(0, B, tile)], ATTN_CHUNK, ATTN_CHUNK
    layers = (tables, *more)  # KV-cache groups
    tiles, parts = [], []
    for t0, R in groups:
        n = min(t0 + R, B) - t0  # real rows of this tile
        first = starts[t0 : t0 + n]
        kv = kv_bucket(max(first) + P, max_len, unit=unit, floor=floor)
        if kv_len is not None:
            if kv_len < kv:
                raise ValueError(f"kv_len {kv_len} is less than the {kv} keys this tile needs")
            kv = kv_len
        W = -(-kv // block_size)
        # the tile's inputs in one array (tile_size of them), each part a view into it
        x = np.zeros(R * (2 * P + len(layers) * (P + W)), np.int64)
        tok, pos = x[: R * P].reshape(R, P), x[R * P : 2 * R * P].reshape(R, P)
        if P == 1:
            tok[:n, 0] = [t[0] for t in tokens[t0 : t0 + n]]
            pos[:n, 0] = first
        else:
            for r, t in enumerate(tokens[t0 : t0 + n]):
                tok[r, : len(t)] = t
            pos[:] = np.arange(P, dtype=np.int64)
            pos[:n] += np.asarray(first, dtype=np.int64)[:, None]
        at = 2 * R * P
        for group in layers:
            slot, tab = x[at : at + R * P].reshape(R, P), x[at + R * P : at + R * (P + W)].reshape(R, W)
            _place(group[t0 : t0 + n], first, pos, block_size, slot, tab)
            at += R * (P + W)
        tiles.append(Tile(R, kv, P))
        parts.append(x)
    return StepPlan(tiles, parts[0] if len(parts) == 1 else np.concatenate(parts))


def _place(rows_tables: list[list[int]], first: list[int], pos: np.ndarray, block_size: int, slot: np.ndarray,
           tab: np.ndarray) -> None:  # fmt: skip
    """Fill a tile's slots [R, P] and block tables [R, W] (zeros on entry) of one KV-cache group:
    row r < n through ``rows_tables[r]``, its positions ``pos[r]`` (from ``first[r]``); a
    position past its row's blocks (and every padding row's) writes into the null block 0, at
    its slot (r * P + p) % block_size (`null_slots`): spread, not all onto one address."""
    n, W = len(rows_tables), tab.shape[1]
    R, P = slot.shape
    lens = [len(t) for t in rows_tables]
    wide = max(1, min(max(lens), W))
    flat: list[int] = []
    for t in rows_tables:
        flat += t[:wide]
        if len(t) < wide:
            flat += [0] * (wide - len(t))
    tab[:n, :wide] = np.asarray(flat, np.int64).reshape(n, wide)
    bs = block_size
    if P == 1 and n <= 64:  # one position a row, few rows: plain Python beats numpy's calls
        slot[:n, 0] = [
            t[p // bs] * bs + p % bs if p // bs < min(k, W) else r % bs
            for r, (t, p, k) in enumerate(zip(rows_tables, first, lens))
        ]
        if n < R:  # padding rows: null_slots of one position a row
            slot[n:, 0] = [r % bs for r in range(n, R)]
        return
    spread = null_slots(R, P, bs)
    slot[n:] = spread[n:]
    blk = pos[:n] // bs
    ids = tab[np.arange(n)[:, None], np.minimum(blk, W - 1)]
    inside = blk < np.minimum(np.asarray(lens, np.int64), W)[:, None]
    slot[:n] = np.where(inside, ids * bs + pos[:n] % bs, spread[:n])


def null_slots(rows: int, positions: int, block_size: int) -> np.ndarray:
    """[rows, positions] slots of the null block 0 for a tile's writes that have no block: the
    flat index modulo the block size, so many such writes in one step (padding rows, a wide
    verify step's positions past a row's blocks, the warm-up timing) do not all land on one
    address."""
    return (np.arange(rows * positions, dtype=np.int64) % block_size).reshape(rows, positions)


def tile_size(tile: Tile, block_size: int, groups: int = 1) -> int:
    """Ints of a tile's static inputs (``groups``: KV-cache groups, each with its slots and table)."""
    return tile.rows * (2 * tile.positions + groups * (tile.positions + -(-tile.kv_len // block_size)))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: capture=False (run eagerly from the same inputs)
    inputs: torch.Tensor  # the tile's static int64 inputs (see plan_step)
    logits: torch.Tensor | None  # decode [rows, V]; verify [rows, positions, V], a view of the shared buffer


def verify_attention(attention: str, invariant: bool) -> str:
    """``decode_static``'s attention for a verify forward (T positions a row) where decode runs
    ``attention``: the paged kernels' query-tiled one ("prefill": a row's keys read once for its T
    positions, where the per-position kernel reads them T times, the cost that grows with the
    width at a large batch), the per-position kernel in deterministic mode (``invariant``: its
    bits are a decode step's), SDPA where decode runs a one-token attention ("torch", "rows")."""
    if attention not in ("triton", "split"):
        return "sdpa"
    return "triton" if invariant else "prefill"


class StepGraphs:
    """One CUDA graph of `model.decode_static` per `Tile` (rows, kv_len, positions), for one KV
    cache: decode steps (positions 1) and DSpark's verify forward (positions > 1).

    Decode runs the runner's attention (and batch-invariant kernels in deterministic mode) and
    returns the graph's own [rows, V] logits; verify runs the attention ``verify_attention``
    names (where decode runs a paged Triton kernel, the query-tiled one that reads a row's keys
    once for all its positions; in deterministic mode decode's batch-invariant kernels, so a
    position's logits are the bits a decode step there gives) and writes
    [rows, positions, V] into the front of one shared buffer (graphs never replay at once, so
    memory does not grow with the number of shapes; a graph needing a wider one gets a new
    buffer, and the old ones stay alive for the graphs that write into them). Decode graphs
    share one memory pool, verify graphs another.
    ``capture=False`` keeps the static inputs and runs the forward eagerly.
    """

    def __init__(self, model: LlamaModel, cache: KVCache, *, max_rows: int, attention: str = "sdpa",
                 invariant: bool = False, capture: bool = True):  # fmt: skip
        self.model, self.cache, self.attention, self.invariant = model, cache, attention, invariant
        self.max_rows = max_rows
        self.capture = capture
        self.groups = len(model.kv_groups)
        self.graphs: dict[Tile, _Graph] = {}
        self._pools: dict[bool, tuple] = {}  # verify (positions > 1)? -> graph pool handle
        self._outs: list[torch.Tensor] = []

    def ensure(self, tile: Tile) -> bool:
        """Capture the graph of ``tile`` unless it exists; True when it was made now."""
        if tile in self.graphs:
            return False
        self.graphs[tile] = self._make(tile)
        return True

    def run(self, tile: Tile, inputs: torch.Tensor, fed: torch.Tensor | None = None) -> torch.Tensor:
        """inputs: the tile's flat int64 inputs (pinned host memory or device). Returns its logits:
        a graph's static output, valid until a graph writing there replays again. No host sync
        (after capture). fed: the first rows' tokens of a decode tile as a device tensor (the
        sampler's output of the step before: async scheduling), written over the staged ones."""
        self.ensure(tile)
        g = self.graphs[tile]
        g.inputs.copy_(inputs, non_blocking=True)
        if fed is not None:  # (a decode tile's inputs start with its rows' tokens)
            g.inputs[: len(fed)].copy_(fed, non_blocking=True)
        if g.graph is None:
            return self._forward(tile, g.inputs)
        g.graph.replay()
        return g.logits

    def time(self, tile: Tile, reps: int = 3) -> float:
        """Device seconds of one replay of ``tile``'s graph (captured first if need be), its
        inputs reset to the capture's: padding rows writing into the null block. Syncs."""
        self.ensure(tile)
        g = self.graphs[tile]
        g.inputs.copy_(self._idle_inputs(tile))
        replay = g.graph.replay if g.graph is not None else lambda: self._forward(tile, g.inputs)
        replay()
        if g.inputs.is_cuda:
            torch.cuda.synchronize(g.inputs.device)
        t0 = time.perf_counter()
        for _ in range(reps):
            replay()
        if g.inputs.is_cuda:
            torch.cuda.synchronize(g.inputs.device)
        return (time.perf_counter() - t0) / reps

    def _out(self, rows: int, positions: int) -> torch.Tensor:
        """The [rows, positions, V] front of the shared verify logits buffer: rows for the largest
        batch bucket, at least OUT_WIDTH positions (a wider buffer is added when one needs it)."""
        buf = self._outs[-1] if self._outs else None
        if buf is None or buf.shape[1] < positions:
            most = batch_buckets(self.max_rows)[-1]
            width = max(positions, OUT_WIDTH)
            buf = torch.empty(
                most, width, self.model.logits_width, dtype=torch.float32, device=self.model.device
            )
            self._outs.append(buf)
        return buf[:rows, :positions]

    def _forward(self, tile: Tile, x: torch.Tensor) -> torch.Tensor:
        R, P = tile.rows, tile.positions
        n = R * P
        tok, pos = x[:n], x[n : 2 * n]
        W = -(-tile.kv_len // self.cache.block_size)
        io, at = [], 2 * n  # (slots, block tables) of each KV-cache group
        for _ in range(self.groups):
            io.append((x[at : at + n], x[at + n : at + n + R * W].view(R, W)))
            at += n + R * W
        (slots, tables), more = io[0], tuple((s if P == 1 else s.view(R, P), t) for s, t in io[1:])
        if P == 1:  # decode: [rows] inputs, [rows, V] logits
            return self.model.decode_static(
                tok, pos, slots, tables, self.cache, kv_len=tile.kv_len, attention=self.attention,
                invariant=self.invariant, more=more,
            )  # fmt: skip
        # verify: [rows, P] inputs, logits into the shared buffer; deterministic mode runs the
        # decode's batch-invariant kernels, so each position computes what a decode step there would
        return self.model.decode_static(
            tok.view(R, P), pos.view(R, P), slots.view(R, P), tables, self.cache, kv_len=tile.kv_len,
            attention=verify_attention(self.attention, self.invariant), out=self._out(R, P), more=more,
            invariant=self.invariant,
        )  # fmt: skip

    def _idle_inputs(self, tile: Tile) -> torch.Tensor:
        """A tile's inputs with every row padding: positions 0.., all writes into the null block's
        slots (`null_slots`), empty block tables."""
        R, P = tile.rows, tile.positions
        x = np.zeros(tile_size(tile, self.cache.block_size, self.groups), np.int64)
        x[R * P : 2 * R * P] = np.tile(np.arange(P, dtype=np.int64), R)
        at, W = 2 * R * P, -(-tile.kv_len // self.cache.block_size)
        for _ in range(self.groups):
            x[at : at + R * P] = null_slots(R, P, self.cache.block_size).ravel()
            at += R * (P + W)
        return torch.from_numpy(x)

    def _make(self, tile: Tile) -> _Graph:
        dev = self.model.device
        P = tile.positions
        inputs = self._idle_inputs(tile).to(dev)  # the warm-up writes the null block
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
