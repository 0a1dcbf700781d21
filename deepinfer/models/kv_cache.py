"""The paged KV cache: K and V of every layer in fixed-size blocks, reached through block tables.

    k, v: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]

Position p of a sequence whose block table is t lives at block t[p // block_size], row
p % block_size. Its flat index, ``t[p // block_size] * block_size + p % block_size``, is its
*slot*: a forward writes a token's K/V at its slot (``k[layer].view(-1, nkv, hd)[slot]``).
Block 0 is the null block (``block_pool.NULL_BLOCK``): padding rows write there and nothing
reads it. Who holds which block is ``deepinfer.block_pool.BlockPool``'s business.
"""

from __future__ import annotations

import torch

DEFAULT_BLOCK_SIZE = 16
CPU_DEFAULT_BYTES = 1 << 30  # the pool on the CPU when no kv_cache_memory is given
CUDA_DEFAULT_FRACTION = 0.8  # of the device memory free once the weights are loaded


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: attention never reads a slot it did not write, but garbage NaNs in a
        # block that a masked SDPA row touches would still poison it
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
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
        """(k, v) of one layer as [num_blocks * block_size, nkv, hd]: indexed by slot."""
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
