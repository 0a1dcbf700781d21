"""A slot-based KV cache: each running sequence owns one slot (a row) for its whole life."""

from __future__ import annotations

import torch


class KVCache:
    """k, v: [num_layers, num_slots + spare_slots, num_kv_heads, max_len, head_dim].

    Position p of slot s holds the key/value of that sequence's token at position p. Rows past a
    sequence's current length may hold garbage (padding of a batched prefill): attention masks
    every key position beyond the query's own, so it is never read.

    Slots [0, num_slots) are handed to sequences. The `spare_slots` after them exist for the
    fixed-shape decode (CUDA graphs, deterministic tiles), which pads a batch to whole buckets
    of slots; the last one (`scratch_slot`) is where padding rows write their K/V.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        spare_slots: int = 0,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_layers, num_slots + spare_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.spare_slots = spare_slots
        self.max_len = max_len

    @property
    def scratch_slot(self) -> int:
        return self.num_slots + self.spare_slots - 1

    def fits(self, num_slots: int, max_len: int) -> bool:
        return num_slots <= self.num_slots and max_len <= self.max_len
