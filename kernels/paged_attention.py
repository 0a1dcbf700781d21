"""Paged attention: query rows attend to their sequence's keys, read through a block table.

One layer of the cache is ``k_cache``, ``v_cache``: [num_blocks, block_size, nkv, hd]; a
sequence's keys live in the blocks its row of ``block_tables`` ([S, W]) names, key p at
``k_cache[table[p // block_size], p % block_size]``. Block 0 is the null block (rows are padded
with it; its content is garbage), and a row reads no key past its own length, so neither the null
block nor the unused slots of a sequence's last block change a result. A query row at position p
of its sequence sees keys [0, p] (causal); its g query heads of one KV head come as a [g, hd]
block (GQA without repeating K/V). What it computes, as a Python loop:

    for n, h:  t = block_tables[seq_ids[n]];  ps = range(positions[n] + 1)
               keys = stack([k_cache[t[p // bs], p % bs, h] for p in ps])          # [len, hd]
               o[n, h] = softmax(q[n, h] @ keys.T / sqrt(hd)) @ (the same rows of v_cache)

Five implementations:
- `paged_attention_reference`: that loop in float64 on CPU, the oracle of the tests.
- `paged_attention_triton` (CUDA; CPU under TRITON_INTERPRET=1): one program per (row, KV head)
  walks fixed BLOCK_N-key blocks from key 0 up to the row's own length (online softmax), reading
  each key's block id from the table. One launch, no host sync (CUDA-graph capturable), and
  batch-invariant: only the row's own length and data shape its reduction.
- `paged_attention_torch` (the CPU path; any device): a varlen batch (rows of a sequence are its
  newest tokens) by SDPA. Decode rows (one row a sequence) share one gathered, length-masked
  call; a chunk of several rows gets one call over its own keys with a causal offset mask.
  ``per_row=True``: one call per sequence over exactly its own keys, batch-invariant.
- `paged_prefill_triton` (CUDA; CPU under TRITON_INTERPRET=1): the varlen batch of
  `paged_attention_torch` in one launch, flash-attention style: a program takes a tile of
  consecutive query tokens of one sequence with their g heads of one KV head, loads each block of
  keys once for the whole tile and stops at the tile's last query position. For prompt chunks
  and DSpark's verify forward (the per-token kernel reads a sequence's keys once per token).
  Not promised batch-invariant, and it rounds unlike the per-token kernel (other dot shapes).
- `paged_invariant_triton` (CUDA; CPU under TRITON_INTERPRET=1): deterministic mode's one kernel
  for prefill chunks, decode and verify. Query tiles as in `paged_prefill_triton` (one shape,
  fixed by (g, head_dim, dtype)), but every row runs the same update sequence in any tile: the
  same absolute key blocks in order, and a block in which the row sees no key leaves it exactly
  unchanged. A token's bits are the same in a chunk of any size, in any batch, and as a decode row.
  (A tile reads its sequence's keys up to its last row's position: those slots must be finite.)
They differ from each other in rounding; the per-token Triton kernel, ``per_row=True`` and
`paged_invariant_triton` are each invariant on their own.

Soft-capping (Gemma 2): every function takes ``softcap`` (0: none); a score s = q k / sqrt(hd)
becomes ``softcap * tanh(s / softcap)`` before the softmax.

Sliding window: every function takes ``window`` (0: none). A query at position p then sees keys
(p - window, p] only: ``window`` keys, itself included (transformers' sliding-window mask). The
Triton kernels start at the window's first key block (the query tiles: the window of the tile's
first query), so a windowed layer reads at most ``window`` + a block (+ a tile) of keys a row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import decode_attention_c

BLOCK_N = 64  # keys per step of the Triton program
SPLITS = 16  # the most runs of a row's keys in the split decode (`decode_splits`)
PROGRAMS_PER_SM = 2  # the split decode aims at this many programs a multiprocessor


def decode_splits(rows: int, kv_heads: int, device: torch.device) -> int:
    """Runs a row's keys are cut into by the split decode of ``rows`` rows: enough that (rows x KV heads x
    runs) fills PROGRAMS_PER_SM programs on each multiprocessor, at most SPLITS, at least 1 (SPLITS
    off CUDA: the Triton interpreter, where only tests ask for the split). A row's bits then depend on
    the number of rows in its step (the default mode's decode is not batch-invariant; deterministic
    mode runs paged_invariant_triton)."""
    if device.type != "cuda":
        return SPLITS
    sms = _multiprocessors(device)
    return max(1, min(SPLITS, -(-PROGRAMS_PER_SM * sms // max(1, rows * kv_heads))))


def _multiprocessors(device: torch.device) -> int:
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


_SMS: dict[int, int] = {}

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_cache(fn: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor) -> None:  # fmt: skip
    """Shapes and dtypes shared by the four functions (no value is read: no host sync)."""
    if q.dim() != 4:
        raise ValueError(f"{fn}: expected q of shape [N, nkv, g, hd], got {tuple(q.shape)}")
    _, nkv, _, hd = q.shape
    if k_cache.dim() != 4 or k_cache.shape[2:] != (nkv, hd):
        raise ValueError(
            f"{fn}: expected k_cache of shape [num_blocks, block_size, {nkv}, {hd}] (q's nkv, hd), "
            f"got {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{fn}: expected v_cache of k_cache's shape {tuple(k_cache.shape)}, "
                         f"got {tuple(v_cache.shape)}")  # fmt: skip
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"{fn}: expected k_cache and v_cache in q's dtype {q.dtype}, "
                         f"got {k_cache.dtype} and {v_cache.dtype}")  # fmt: skip
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"{fn}: expected k_cache and v_cache contiguous in head_dim (stride 1), got "
                         f"strides {k_cache.stride(-1)} and {v_cache.stride(-1)}")  # fmt: skip
    if block_tables.dim() != 2 or block_tables.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: expected block_tables int32 or int64 of shape [S, W], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")  # fmt: skip


def _check_rows(fn: str, q: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor) -> None:
    for name, t in (("seq_ids", seq_ids), ("positions", positions)):
        if t.shape != (q.shape[0],) or t.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{fn}: expected {name} int64 (or int32) of shape [{q.shape[0]}] (q's rows), "
                             f"got {t.dtype} {tuple(t.shape)}")  # fmt: skip


def _check_window(fn: str, window) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"{fn}: expected window a host int >= 0 (0: no sliding window), got {window!r}")


def _check_block_size(fn: str, k_cache: torch.Tensor) -> None:
    bs = k_cache.shape[1]
    if bs < 1 or bs & (bs - 1):
        raise ValueError(f"{fn}: expected block_size (k_cache.shape[1]) a power of two, got {bs}")


def _check_one_device(fn: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{fn}: expected every tensor on one device, got {sorted(map(str, devices))}")


def _check_tiles(fn: str, q: torch.Tensor, block_tables: torch.Tensor, B: int, max_query_len) -> None:
    """The query-tiled kernels' shared arguments: a table row per sequence (B of them), and
    max_query_len a host int that covers q's rows."""
    if block_tables.shape[0] < B:
        raise ValueError(f"{fn}: expected a block_tables row per sequence ({B}), got {block_tables.shape[0]}")
    N = q.shape[0]
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or max_query_len < 0:
        raise ValueError(f"{fn}: expected max_query_len a host int >= 0 (the most rows of a sequence), "
                         f"got {max_query_len!r}")  # fmt: skip
    if N > 0 and (B == 0 or max_query_len == 0):
        raise ValueError(f"{fn}: q has {N} rows but there are {B} sequences and max_query_len is "
                         f"{max_query_len} (expected both >= 1)")  # fmt: skip


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q: [N, nkv, g, hd]; k_cache, v_cache: [num_blocks, block_size, nkv, hd]; block_tables:
    [S, W] int; seq_ids, positions: [N] int. -> [N, nkv, g, hd] float64 on CPU.
    Row n: softmax(q[n] k^T / sqrt(hd)) v over keys [0, positions[n]] of sequence seq_ids[n]
    (the module docstring's loop, in float64); with a window, keys (positions[n] - window,
    positions[n]] only."""
    fn = "paged_attention_reference"
    _check_cache(fn, q, k_cache, v_cache, block_tables)
    _check_rows(fn, q, seq_ids, positions)
    _check_window(fn, window)
    bs = k_cache.shape[1]
    tables = block_tables.cpu().long()
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()
    out = torch.empty(q.shape, dtype=torch.float64)
    for n, (s, p) in enumerate(zip(seq_ids.tolist(), positions.tolist())):
        ps = torch.arange(max(0, p + 1 - window) if window else 0, p + 1)
        blocks = tables[s, ps // bs]
        k = k_cache[blocks, ps % bs].double().transpose(0, 1)  # [nkv, len, hd]
        v = v_cache[blocks, ps % bs].double().transpose(0, 1)
        scores = q[n].double().cpu() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [nkv, g, len]
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        out[n] = torch.softmax(scores, dim=-1) @ v
    return out


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    window: int = 0,
    softcap: float = 0.0,
    splits: int = 1,
) -> torch.Tensor:
    """q: [N, nkv, g, hd]; k_cache, v_cache: [num_blocks, block_size, nkv, hd] (q's dtype, last dim
    contiguous, block_size a power of two); block_tables: [S, W] int32/int64; seq_ids, positions:
    [N] int64 (or int32), on q's device. -> [N, nkv, g, hd] in q's dtype. One launch, no host sync.
    Row n reads keys [0, positions[n]] of sequence seq_ids[n] (with a window: the last ``window``
    of them); the caller keeps positions[n] < W * block_size (a key past the table would be
    skipped, not read).

    splits: cut each row's keys into at most this many runs of whole BLOCK_N-key blocks (the split
    decode's: ``decode_splits``), a program each, merged in run order inside the launch (flash-
    decoding: enough programs at a small batch); 1: one program a row. The cut depends on the row's
    own length, window and ``splits`` only, so at a given ``splits`` a row's bits do not depend on the
    other rows; they differ from ``splits=1``'s once a row has more than one run. Split launches on
    one device must not overlap in time (they share its counters: one stream, or graphs replayed in
    turn, is fine); under CUDA graph capture, make the same call once before capturing (it sizes the
    counters)."""
    fn = "paged_attention_triton"
    _check_cache(fn, q, k_cache, v_cache, block_tables)
    _check_rows(fn, q, seq_ids, positions)
    _check_window(fn, window)
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"{fn}: expected splits a host int >= 1 (1: no split), got {splits!r}")
    _check_block_size(fn, k_cache)
    _check_one_device(fn, q, k_cache, v_cache, block_tables, seq_ids, positions)
    q = q.contiguous()
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    from .fused import dependent_launch
    from .paged_attention_triton import launch

    # the kernel reads row n's index at offset n
    seq_ids, positions = seq_ids.contiguous(), positions.contiguous()
    launch(q, k_cache, v_cache, out, block_tables, seq_ids, positions, 1.0 / math.sqrt(q.shape[-1]), BLOCK_N,
           window, softcap, splits, dependent_launch(q, q.shape[0]))  # fmt: skip
    return out


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    *,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q: [N, nkv, g, hd] (last dim contiguous, else copied); k_cache, v_cache: [num_blocks,
    block_size, nkv, hd] (q's dtype, last dim contiguous, block_size a power of two);
    block_tables: [B, W] int32/int64, row b = sequence b (more rows are allowed, unread);
    query_start: [B + 1], seq_lens: [B], int32/int64 tensors on q's device; max_query_len: a host
    int >= every T_b. -> [N, nkv, g, hd] in q's dtype, contiguous. One launch, no host sync.

    What `paged_attention_torch` computes: sequence b owns q rows [query_start[b],
    query_start[b + 1]) (T_b of them, possibly 0), its newest tokens at positions
    seq_lens[b] - T_b .. seq_lens[b] - 1 whose K/V are already in the cache; the row at position p
    sees keys [0, p]. Grid (B, nkv, cdiv(max_query_len, BLOCK_M)): a program takes BLOCK_M
    consecutive tokens of one sequence and their g heads of one KV head as one tile (programs past
    T_b exit at once), loads each BLOCK_N-key block once for the tile and stops at the tile's last
    query position (BLOCK_M, BLOCK_N: `config` in kernels/paged_prefill_triton.py).

    The values are not checked (that would be a host sync); the caller keeps query_start[0] = 0,
    query_start[B] = N, 0 <= T_b <= seq_lens[b], seq_lens[b] <= W * block_size (a key past the
    table is skipped, not read) and max_query_len >= max T_b (rows past it are left unwritten).
    Not promised batch-invariant, and it rounds unlike `paged_attention_triton` (other dot
    shapes): deterministic mode keeps the per-token kernel."""
    fn = "paged_prefill_triton"
    _check_cache(fn, q, k_cache, v_cache, block_tables)
    _check_window(fn, window)
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{fn}: expected q float32, bfloat16 or float16, got {q.dtype}")
    _check_block_size(fn, k_cache)
    for name, t in (("query_start", query_start), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{fn}: expected {name} a tensor on q's device (paged_attention_torch takes "
                             f"host lists), got {type(t).__name__}")  # fmt: skip
    if seq_lens.dim() != 1 or seq_lens.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: expected seq_lens int32 or int64 of shape [B], got {seq_lens.dtype} "
                         f"{tuple(seq_lens.shape)}")  # fmt: skip
    B = seq_lens.shape[0]
    if query_start.shape != (B + 1,) or query_start.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: expected query_start int32 or int64 of shape [{B + 1}] (B + 1 for {B} "
                         f"seq_lens), got {query_start.dtype} {tuple(query_start.shape)}")  # fmt: skip
    _check_tiles(fn, q, block_tables, B, max_query_len)
    N = q.shape[0]
    _check_one_device(fn, q, k_cache, v_cache, block_tables, query_start, seq_lens)
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if N == 0 or B == 0:
        return out
    from .paged_prefill_triton import launch

    launch(q, k_cache, v_cache, out, block_tables, query_start.contiguous(), seq_lens.contiguous(),
           max_query_len, 1.0 / math.sqrt(q.shape[-1]), window, softcap)  # fmt: skip
    return out


def paged_invariant_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    positions: torch.Tensor,
    max_query_len: int,
    *,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q: [N, nkv, g, hd] (last dim contiguous, else copied); k_cache, v_cache: [num_blocks,
    block_size, nkv, hd] (q's dtype, last dim contiguous, block_size a power of two);
    block_tables: [B, W] int32/int64, row b = sequence b (more rows are allowed, unread);
    query_start: [B + 1], positions: [N], int32/int64 tensors on q's device; max_query_len: a
    host int >= every T_b. -> [N, nkv, g, hd] in q's dtype, contiguous. One launch, no host sync.

    Sequence b owns q rows [query_start[b], query_start[b + 1]) (T_b of them, possibly 0); row n
    at position positions[n] sees keys [0, positions[n]] of its sequence (with a window: the last
    ``window`` of them), as `paged_attention_triton` with seq_ids n -> b. Grid (cdiv(max_query_len,
    BLOCK_M), nkv, B): a program takes BLOCK_M consecutive rows of one sequence and their g heads
    of one KV head as one tile and loads each BLOCK_N-key block once for the tile, from the tile's
    first key to its greatest position (BLOCK_M and the tile: `config` in
    kernels/paged_invariant_triton.py, a function of (g, hd, dtype) alone).

    Batch-invariant, and invariant to the tiling: a row's bits depend on its query, its position
    and its sequence's keys alone, not on the rows beside it in its tile or in the call (a
    prompt's token gives the same bits in one chunk, in chunks of any sizes, and as a decode row,
    T_b = 1). Rounds unlike `paged_attention_triton` and `paged_prefill_triton`.

    The values are not checked (that would be a host sync); the caller keeps query_start[0] = 0,
    query_start[B] = N, query_start non-decreasing, positions[n] < W * block_size (a key past the
    table is skipped, not read) and max_query_len >= max T_b (rows past it are left unwritten).
    A tile reads its sequence's keys up to its greatest position: those slots must hold finite
    values, even where a row of the tile does not see them (its p = 0 there, and 0 * inf is NaN).
    The engine's cache starts zeroed and holds only finite K/V."""
    fn = "paged_invariant_triton"
    _check_cache(fn, q, k_cache, v_cache, block_tables)
    _check_window(fn, window)
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{fn}: expected q float32, bfloat16 or float16, got {q.dtype}")
    _check_block_size(fn, k_cache)
    for name, t in (("query_start", query_start), ("positions", positions)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{fn}: expected {name} a tensor on q's device, got {type(t).__name__}")
    if query_start.dim() != 1 or query_start.shape[0] < 1 or query_start.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: expected query_start int32 or int64 of shape [B + 1], got "
                         f"{query_start.dtype} {tuple(query_start.shape)}")  # fmt: skip
    N = q.shape[0]
    if positions.shape != (N,) or positions.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{fn}: expected positions int64 (or int32) of shape [{N}] (q's rows), got "
                         f"{positions.dtype} {tuple(positions.shape)}")  # fmt: skip
    B = query_start.shape[0] - 1
    _check_tiles(fn, q, block_tables, B, max_query_len)
    _check_one_device(fn, q, k_cache, v_cache, block_tables, query_start, positions)
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if N == 0 or B == 0:
        return out
    from .paged_invariant_triton import launch

    launch(q, k_cache, v_cache, out, block_tables, query_start.contiguous(), positions.contiguous(),
           max_query_len, 1.0 / math.sqrt(q.shape[-1]), window, softcap)  # fmt: skip
    return out


class DecodeKeys(NamedTuple):
    """Where the keys of one-token rows lie in a layer's flat cache (``KVCache.flat``): worked out
    once a step by `decode_keys`, read by `paged_decode_torch` in every layer."""

    slots: torch.Tensor  # [R, L] int64: row r's keys in order, then its last one repeated
    mask: torch.Tensor | None  # [R, 1, 1, L] bool (True: a key of the row); None: every slot is
    start: int | None = None  # one row whose keys are slots start .. start + L - 1: read as a view
    lens: torch.Tensor | None = None  # [R] int64: how many keys each row has (None: one row, L)


def decode_keys(
    block_tables: torch.Tensor, seq_lens: list[int], block_size: int, window: int = 0
) -> DecodeKeys:
    """The keys of R rows of one token each: row r (at position seq_lens[r] - 1, through
    block_tables[r]) sees keys [max(0, n - window), n) of its sequence (n = seq_lens[r]; window
    0: from 0). Padding repeats a row's last key (written, so finite) and is masked out."""
    _check_window("decode_keys", window)
    if len(seq_lens) == 1 and block_tables.device.type == "cpu":  # (the CPU at batch 1: on the host)
        n = seq_lens[0]
        lo = max(0, n - window) if window else 0
        first, last = lo // block_size, (n - 1) // block_size
        blocks = block_tables[0, first : last + 1].tolist()
        if blocks == list(range(blocks[0], blocks[0] + len(blocks))):  # its blocks in a row
            start = blocks[0] * block_size + lo % block_size
            return DecodeKeys(torch.arange(start, start + n - lo)[None], None, start)
    n = torch.tensor(seq_lens, dtype=torch.int64, device=block_tables.device)
    lo = (n - window).clamp_(min=0) if window else torch.zeros_like(n)
    L = int((n - lo).max())
    pos = torch.minimum(lo[:, None] + torch.arange(L, device=n.device), n[:, None] - 1)  # [R, L]
    blocks = block_tables[: len(seq_lens)].long().gather(1, pos // block_size)
    mask = None
    if int((n - lo).min()) != L:
        mask = (torch.arange(L, device=n.device) < (n - lo)[:, None])[:, None, None, :]
    slots = blocks * block_size + pos % block_size
    start = None
    if len(seq_lens) == 1 and bool((slots[0, 1:] - slots[0, :-1] == 1).all()):  # its blocks in a row
        start = int(slots[0, 0])
    return DecodeKeys(slots, mask, start, n - lo)


def paged_decode_torch(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, keys: DecodeKeys,
                       softcap: float = 0.0) -> torch.Tensor:  # fmt: skip
    """The attention of one-token rows (the CPU's decode step; what `paged_attention_torch` does
    for them): q [R, nkv, g, hd]; k_flat, v_flat: a layer's cache by slot [slots, nkv, hd] (its K/V
    of the rows' own tokens already written); keys: `decode_keys` of the rows. -> [R, nkv, g, hd].
    One gather of exactly the keys each row sees (no block of garbage to zero, unlike the batched
    decode call of `paged_attention_torch`) and one SDPA call; bfloat16 rows, where the C library
    is built, one C call instead (`decode_attention_c`), which reads each row's own keys in place."""
    R, nkv, _, hd = q.shape
    L = keys.slots.shape[1]
    if decode_attention_c.usable(q, k_flat, v_flat, softcap):
        if R > 1:
            return decode_attention_c.decode_attention_rows(q, k_flat, v_flat, keys.slots, keys.lens)
        slots = None if keys.start is not None else keys.slots.view(-1)
        return decode_attention_c.decode_attention(q, k_flat, v_flat, slots, keys.start or 0, L)
    if keys.start is not None:  # one row, its keys side by side: views [1, nkv, L, hd], no gather
        k, v = (_rows_view(c, keys.start, L) for c in (k_flat, v_flat))
    else:
        k = k_flat.index_select(0, keys.slots.view(-1)).view(R, L, nkv, hd).transpose(1, 2)
        v = v_flat.index_select(0, keys.slots.view(-1)).view(R, L, nkv, hd).transpose(1, 2)
    if softcap:
        return attend(q, k, v, keys.mask, softcap)
    return _attend_float32(q, k, v, keys.mask)


def _rows_view(flat: torch.Tensor, start: int, L: int) -> torch.Tensor:
    """Slots start .. start + L - 1 of a flat cache [slots, nkv, hd] as [1, nkv, L, hd], one op."""
    s0, s1, s2 = flat.stride()
    return flat.as_strided(
        (1, flat.shape[1], L, flat.shape[2]), (L * s0, s1, s0, s2), flat.storage_offset() + start * s0
    )


def _attend_float32(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """SDPA (scale 1/sqrt(hd)) of one-token rows with the keys and values read once into float32:
    two batched matmuls and a softmax, rounded to q's dtype at the end (SDPA computes in float32
    too). On the CPU at a decode step's shapes this runs in 0.6-0.75 of SDPA's time on the cache's
    bfloat16 views (its kernel reads each KV head's keys at a stride of nkv heads, in blocks).
    q [R, nkv, g, hd]; k, v [R, nkv, L, hd]; mask [R, 1, 1, L] bool (True: seen) or None."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v.float()).to(q.dtype)


def _own_keys(cache: torch.Tensor, table_row: torch.Tensor, n: int, lo: int = 0) -> torch.Tensor:
    # keys [lo, n) of one sequence: [1, nkv, n - lo, hd]
    bs = cache.shape[1]
    first = lo // bs
    blocks = cache[table_row[first : -(-n // bs)]]  # [nb, bs, nkv, hd]
    return blocks.flatten(0, 1)[lo - first * bs : n - first * bs].transpose(0, 1).unsqueeze(0)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           softcap: float = 0.0) -> torch.Tensor:  # fmt: skip
    """SDPA (scale 1/sqrt(hd)); with ``softcap``, the scores soft-capped first (then in float32, as
    SDPA has no soft-cap). mask: bool (True: seen) or additive, broadcast to the scores."""
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
    s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return (torch.softmax(s, dim=-1).to(v.dtype) @ v).to(q.dtype)


def _sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, window: int = 0,
              softcap: float = 0.0) -> torch.Tensor:  # fmt: skip
    """q: [T, nkv, g, hd], the newest T tokens of a sequence of n keys, whose keys [n - L, n) are
    k, v: [1, nkv, L, hd] -> [T, nkv, g, hd]. One SDPA call; the T * g query heads of a KV head as
    T * g queries, the one at position p = n - T + t seeing keys <= p (and > p - window)."""
    T, nkv, g, hd = q.shape
    L = k.shape[2]
    if T == 1 and (not window or L <= window):  # every key is visible: no mask
        return attend(q, k, v, softcap=softcap)  # [1, nkv, g, hd]: one batch row of g queries
    qs = q.permute(1, 0, 2, 3).reshape(1, nkv, T * g, hd)
    pos = torch.arange(n - T, n, device=q.device).repeat_interleave(g)[:, None]  # [T * g, 1]
    keys = torch.arange(n - L, n, device=q.device)
    mask = keys <= pos  # [T * g, L]
    if window:
        mask &= keys > pos - window
    o = attend(qs, k, v, mask, softcap)  # [1, nkv, T * g, hd]
    return o[0].reshape(nkv, T, g, hd).transpose(0, 1)


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: list[int],
    seq_lens: list[int],
    *,
    per_row: bool = False,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q: [N, nkv, g, hd]; k_cache, v_cache: [num_blocks, block_size, nkv, hd] (q's dtype);
    block_tables: [S, W] int32/int64, row b = sequence b; query_start: B + 1 offsets from 0 to N;
    seq_lens: B lengths. -> [N, nkv, g, hd] in q's dtype.

    Sequence b owns q rows [query_start[b], query_start[b + 1]) (T_b of them, possibly 0): its
    newest tokens, at positions seq_lens[b] - T_b .. seq_lens[b] - 1, their K/V already in the
    cache; its keys are [0, seq_lens[b]). Sequences with T_b == 1 are done together: one gather
    of their blocks through the table ([R, nb * bs, nkv, hd], slots past a row's length zeroed, as
    they may hold NaN) and one length-masked SDPA call; every other sequence gets one call over its
    own keys with a causal offset mask. ``per_row=True``: every sequence gets its own call over
    exactly its own keys, so its result does not depend on the rest of the batch. ``window``: a
    query sees its last ``window`` keys only (a chunk's call reads from its first query's window).
    """
    fn = "paged_attention_torch"
    _check_cache(fn, q, k_cache, v_cache, block_tables)
    _check_window(fn, window)
    N = q.shape[0]
    B = len(seq_lens)
    bs = k_cache.shape[1]
    W = block_tables.shape[1]
    if len(query_start) != B + 1 or query_start[0] != 0 or query_start[-1] != N:
        raise ValueError(f"{fn}: expected query_start of {B + 1} offsets from 0 to {N} (q's rows) for "
                         f"{B} seq_lens, got {list(query_start)}")  # fmt: skip
    if B > block_tables.shape[0]:
        raise ValueError(f"{fn}: expected a block_tables row per sequence ({B}), got {block_tables.shape[0]}")
    for b, n in enumerate(seq_lens):
        T = query_start[b + 1] - query_start[b]
        if T < 0 or n < T:
            raise ValueError(f"{fn}: sequence {b} has {T} query rows but seq_len {n} (expected 0 <= rows <= "
                             f"seq_len, query_start non-decreasing)")  # fmt: skip
        if -(-n // bs) > W:
            raise ValueError(f"{fn}: sequence {b}'s {n} keys need {-(-n // bs)} blocks of {bs}, "
                             f"more than the table's {W}")  # fmt: skip
    out = torch.empty_like(q)
    tables = block_tables.to(device=q.device, dtype=torch.int64)
    decode = [] if per_row else [b for b in range(B) if query_start[b + 1] - query_start[b] == 1]
    if decode:
        rows = torch.tensor(decode, device=q.device)
        starts = torch.tensor([query_start[b] for b in decode], device=q.device)
        lens = torch.tensor([seq_lens[b] for b in decode], device=q.device)
        nb = -(-max(seq_lens[b] for b in decode) // bs)
        blocks = tables[rows, :nb]  # [R, nb]
        cols = torch.arange(nb * bs, device=q.device)
        visible = cols < lens[:, None]  # [R, L]
        if window:
            visible &= cols >= lens[:, None] - window
        hidden = ~visible[:, :, None, None]
        # [R, L, nkv, hd] -> [R, nkv, L, hd]; garbage past a row's length (the null block, unused
        # slots) is zeroed: a NaN there would survive the mask (0 * NaN in p @ v)
        k = k_cache[blocks].flatten(1, 2).masked_fill_(hidden, 0).transpose(1, 2)
        v = v_cache[blocks].flatten(1, 2).masked_fill_(hidden, 0).transpose(1, 2)
        out[starts] = attend(q[starts], k, v, visible[:, None, None, :], softcap)
    done = set(decode)
    for b in range(B):
        s, e = query_start[b], query_start[b + 1]
        if b in done or s == e:
            continue
        n = seq_lens[b]
        lo = max(0, n - (e - s) + 1 - window) if window else 0  # the first query's first key
        k, v = _own_keys(k_cache, tables[b], n, lo), _own_keys(v_cache, tables[b], n, lo)
        out[s:e] = _sequence(q[s:e], k, v, n, window, softcap)
    return out
