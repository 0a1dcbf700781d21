"""The paged KV cache: K and V of every layer in fixed-size blocks, reached through block tables.

    k, v: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]

Position p of a sequence whose block table is t lives at block t[p // block_size], row
p % block_size. Its flat index, ``t[p // block_size] * block_size + p % block_size``, is its
*slot*: a forward writes a token's K/V at its slot (``k[layer].view(-1, nkv, hd)[slot]``).
Block 0 is the null block (``block_pool.NULL_BLOCK``): padding rows write there and nothing
reads it. Who holds which block is ``deepinfer.block_pool.BlockPool``'s business.

Groups (``kv_groups``): a model that mixes full-attention and sliding-window layers keeps two
caches, one per group of layers, each with its own blocks and block ids (a sequence has a block
table per group), so that a windowed layer's blocks behind the window can be given back while
the full-attention layers keep theirs. Then ``k`` and ``v`` are lists of per-layer
[num_blocks_of_its_group, block_size, nkv, hd] views; ``k[layer]`` reads the same either way.
A model whose layers all have one window keeps one group: the single tensor above.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import torch

DEFAULT_BLOCK_SIZE = 16
CPU_DEFAULT_BYTES = 1 << 30  # the pool on the CPU when no kv_cache_memory is given
CUDA_DEFAULT_FRACTION = 0.8  # of the device memory free once the weights are loaded


def kv_groups(windows: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(window, layers) of each KV-cache group, for layers of these sliding windows (0: full
    attention). One group when no layer has full attention or every layer has (the window then is
    the largest); else the full-attention layers (window 0) first, then the windowed ones under
    the largest of their windows (a window only bounds what a layer reads: the largest bounds
    them all)."""
    every = list(range(len(windows)))
    full = [i for i in every if not windows[i]]
    if not full or len(full) == len(every):
        return [(max(windows, default=0), every)]
    windowed = [i for i in every if windows[i]]
    return [(0, full), (max(windows[i] for i in windowed), windowed)]


def window_pool_blocks(window: int, margin: int, block_size: int, max_num_seqs: int,
                       max_num_batched_tokens: int) -> int:  # fmt: skip
    """Blocks a sliding-window group's pool needs (the null block included): each running request
    holds at most ceil((window + margin) / block_size) + 1 between steps, plus what a step adds
    (a verify step's margin + 1 positions, at most max_num_batched_tokens prompt positions in
    all); twice that, so that as many again of finished or preempted requests' tails stay
    cached for bounded replay."""
    per = -(-(window + margin) // block_size) + 1 + -(-(margin + 1) // block_size)
    return 2 * (max_num_seqs * per + -(-max_num_batched_tokens // block_size)) + 1


def split_blocks(budget: int, full_bytes: int, window_bytes: int, window_cap: int) -> tuple[int, int]:
    """(full-attention blocks, sliding-window blocks) for ``budget`` bytes, a block of each group
    costing ``full_bytes`` and ``window_bytes``: as many of each while the sliding-window group
    needs no more than ``window_cap`` (``window_pool_blocks``), the rest to full attention."""
    n = budget // (full_bytes + window_bytes)
    if n <= window_cap:
        return n, n
    n = (budget - window_cap * window_bytes) // full_bytes
    return n, min(window_cap, n)


def group_blocks(num_blocks: int, block_bytes: list[int], windows: list[int], margin: int, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:  # fmt: skip
    """Blocks of each KV-cache group (``windows``: theirs, as ``kv_groups`` orders them; a block
    of group g costs ``block_bytes[g]``) for the budget of ``num_blocks`` blocks of every layer:
    that count for one group, ``split_blocks`` for two."""
    if len(windows) == 1:
        return [num_blocks]
    cap = window_pool_blocks(windows[1], margin, block_size, max_num_seqs, max_num_batched_tokens)
    counts = list(split_blocks(num_blocks * sum(block_bytes), block_bytes[0], block_bytes[1], cap))
    if min(counts) < 2:
        raise ValueError(f"the KV budget holds {counts} blocks (full attention, sliding window); at least 2 "
                         "of each are needed: give LLM a larger kv_cache_memory")  # fmt: skip
    return counts


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A tensor of zeros. On the CPU its memory is an anonymous map: the kernel hands out zero
    pages as they are first written, so a cache costs the memory of the blocks used so far, not
    of the whole pool (and allocating it costs no time)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, n), dtype=dtype).view(shape)


class KVCache:
    """Parameters
    ----------
    num_blocks : int or sequence of int
        Blocks of each group (the null block included); an int: the same for every group.
    groups : list of layer-index lists, or None
        The layers of each group (``kv_groups``); None: one group of every layer.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int | Sequence[int],
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        groups: Sequence[Sequence[int]] | None = None,
    ):
        groups = [list(range(num_layers))] if groups is None else [list(g) for g in groups]
        blocks = [num_blocks] * len(groups) if isinstance(num_blocks, int) else list(num_blocks)
        if len(blocks) != len(groups):
            raise ValueError(f"{len(blocks)} block counts for {len(groups)} KV-cache groups")
        row = (block_size, num_kv_heads, head_dim)
        # zeros, not empty: attention never reads a slot it did not write, but garbage NaNs in a
        # block that a masked SDPA row touches would still poison it
        if len(groups) == 1:
            self.k = zeros((num_layers, blocks[0], *row), dtype, device)
            self.v = zeros((num_layers, blocks[0], *row), dtype, device)
        else:
            self.k, self.v = [None] * num_layers, [None] * num_layers
            for layers, n in zip(groups, blocks):
                k = zeros((len(layers), n, *row), dtype, device)
                v = zeros((len(layers), n, *row), dtype, device)
                for j, i in enumerate(layers):
                    self.k[i], self.v[i] = k[j], v[j]
        self._flat: dict[int, tuple] = {}
        self.group_blocks = blocks
        self.num_blocks = blocks[0]
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:  # fmt: skip
        """K and V of one block in every layer."""
        return (
            2
            * num_layers
            * block_size
            * num_kv_heads
            * head_dim
            * torch.empty((), dtype=dtype).element_size()
        )

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of one layer as [num_blocks * block_size, nkv, hd]: indexed by slot (views made
        once; every layer of every step asks)."""
        made = self._flat.get(layer)
        if made is None or made[0] is not self.k or made[1] is not self.v:
            k, v = self.k[layer], self.v[layer]
            made = self._flat[layer] = (self.k, self.v, k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:]))
        return made[2], made[3]


def kv_blocks(memory: int | float | None, per_block: int, device: torch.device, worst: int) -> int:
    """Blocks of the paged KV cache for a budget of ``memory``: bytes (int), a fraction of the
    device's free memory (CUDA) or of the machine's (CPU) (float in (0, 1]), or None: 80% of the
    free device memory on CUDA, 1 GiB on the CPU, never more than ``worst`` blocks. ValueError
    for a budget of the wrong type or too small (two blocks at least)."""
    cuda = device.type == "cuda"
    if memory is None:
        budget = (
            int(CUDA_DEFAULT_FRACTION * torch.cuda.mem_get_info(device)[0]) if cuda else CPU_DEFAULT_BYTES
        )
        n = min(budget // per_block, worst)
    elif isinstance(memory, float):
        if not 0 < memory <= 1:
            raise ValueError(f"kv_cache_memory as a float is a fraction in (0, 1], got {memory!r}")
        if cuda:
            total = torch.cuda.mem_get_info(device)[0]
        else:
            import os

            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        n = int(memory * total) // per_block
    elif isinstance(memory, int) and not isinstance(memory, bool):
        n = memory // per_block
    else:
        raise ValueError(f"kv_cache_memory must be bytes (int) or a fraction (float), got {memory!r}")
    if n < 2:
        raise ValueError(
            f"kv_cache_memory={memory!r} holds {n} KV blocks of {per_block} bytes; at least 2 are needed"
        )
    return n
