"""The collectives of a tensor-parallel or expert-parallel forward: thin calls on torch.distributed
(NCCL on CUDA, gloo on the CPU), one object per rank's group.

- ``all_reduce``: the sum of the ranks' partial products after a row-parallel projection (attention's
  ``wo``, the MLP's ``wd``). In deterministic mode it is an all-gather then a sum in rank order, so
  each element's result is the same bits whatever the tensor's shape (a ring all-reduce's order of
  addition depends on where an element falls in its chunks, hence on the batch).
- ``gather_vocab``: the logits of every rank's vocabulary shard, concatenated (sampling needs them all).
- ``all_to_all``: rows sent to the ranks that own their experts (``all_to_all_single``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# torch >= 2.12 names it all_gather_single (all_gather_into_tensor before)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class Group:
    rank: int  # this process's rank in the group
    size: int
    group: object  # a torch.distributed ProcessGroup
    deterministic: bool = False  # batch-invariant reductions (see the module docstring)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.deterministic:
            parts = self.all_gather(x)
            out = parts[0].clone()
            for p in parts[1:]:  # rank order, element by element
                out += p
            return out
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's x (same shape on each), in rank order."""
        flat = x.contiguous().view(1, -1)
        out = torch.empty((self.size, flat.shape[1]), dtype=x.dtype, device=x.device)
        _all_gather(out, flat, group=self.group)
        return [y.view(x.shape) for y in out.unbind(0)]

    def gather_vocab(self, y: torch.Tensor, width: int) -> torch.Tensor:
        """y [..., V / size] (this rank's vocabulary shard, the last one padded) -> [..., width]."""
        return torch.cat(self.all_gather(y), dim=-1)[..., :width]

    def all_to_all(self, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """Rows of x [sum(send), ...]: send[r] of them (in order) to rank r; returns the rows the
        ranks sent here, [sum(recv), ...] in rank order."""
        out = torch.empty((sum(recv), *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group)
        return out
