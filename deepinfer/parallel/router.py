"""Which data-parallel replica takes a request: the least loaded, counting the tokens it would
have to compute, and where the request's prompt prefix is already cached.

The router keeps, per replica, the tokens it has been sent and not yet finished (each request's
prompt plus its ``max_tokens``), the free KV blocks it last reported, and an index of the block
keys of the prompts it was sent (chained hashes of whole blocks, as `block_pool.block_keys`
computes them; least recently used first out, at most the replica's cache size). A request
costs a replica

    queued tokens + prompt tokens past its cached prefix  (+ a penalty when its free KV blocks
                                                          cannot hold them: it would wait or evict)

and goes to the cheapest (the lowest index on a tie). A shared prefix thus draws a request to
the replica holding it unless that replica is busier by more than the prefix saves.
"""

from __future__ import annotations

from collections import OrderedDict

from ..block_pool import block_keys

DEFAULT_INDEX_BLOCKS = 1 << 16  # index entries a replica keeps before it reports its cache size


class Router:
    def __init__(self, replicas: int, block_size: int) -> None:
        self.block_size = block_size
        self.queued = [0] * replicas  # tokens sent, not finished
        self.free_blocks: list[int | None] = [None] * replicas  # last reported (None: not yet)
        self.capacity = [DEFAULT_INDEX_BLOCKS] * replicas
        self.index: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
        self.alive = [True] * replicas

    def keys(self, ids: list[int]) -> list[int]:
        return [h for h, _ in block_keys(ids, self.block_size)]

    def cached_tokens(self, r: int, keys: list[int]) -> int:
        """Tokens of the prompt's leading blocks in replica r's index."""
        n = 0
        for k in keys:
            if k not in self.index[r]:
                break
            n += 1
        return n * self.block_size

    def cost(self, r: int, ids: list[int], keys: list[int]) -> int:
        new = len(ids) - self.cached_tokens(r, keys)
        c = self.queued[r] + new
        free = self.free_blocks[r]
        if free is not None and free * self.block_size < new:
            c += 1 << 30  # cannot hold it now: only if every replica is as full
        return c

    def choose(self, ids: list[int]) -> int:
        """The replica for a prompt of token ids ``ids``."""
        keys = self.keys(ids)
        live = [r for r, a in enumerate(self.alive) if a]
        if not live:
            raise RuntimeError("no data-parallel replica is alive")
        return min(live, key=lambda r: (self.cost(r, ids, keys), r))

    def assign(self, r: int, ids: list[int], tokens: int) -> None:
        """Replica r takes a request: ``tokens`` more queued, its prompt's blocks indexed."""
        self.queued[r] += tokens
        index = self.index[r]
        for k in self.keys(ids):
            index[k] = None
            index.move_to_end(k)
        while len(index) > self.capacity[r]:
            index.popitem(last=False)

    def finish(self, r: int, tokens: int) -> None:
        self.queued[r] -= tokens

    def report(self, r: int, free_blocks: int, total_blocks: int) -> None:
        self.free_blocks[r] = free_blocks
        self.capacity[r] = total_blocks

    def drop(self, r: int) -> None:
        """Replica r is gone: nothing more goes there."""
        self.alive[r] = False
        self.queued[r] = 0
        self.index[r].clear()
