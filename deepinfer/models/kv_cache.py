"""A slot-based KV cache: each running sequence owns one slot (a row) for its whole life."""

from __future__ import annotations

import torch


class KVCache:
    """k, v: [num_layers, num_slots, num_kv_heads, max_len, head_dim].

    Position p of slot s holds the key/value of that sequence's token at position p. Rows past a
    sequence's current length may hold garbage (padding of a batched prefill): attention masks
    every key position beyond the query's own, so it is never read.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_len = max_len

    def fits(self, num_slots: int, max_len: int) -> bool:
        return num_slots <= self.num_slots and max_len <= self.max_len
