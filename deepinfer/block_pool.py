"""BlockPool: the KV cache's blocks as plain data -- who holds which block, and which full blocks
hold which tokens (prefix caching). No tensors: ``models/kv_cache.py`` holds the memory.

A block holds the K/V of ``block_size`` consecutive positions of one sequence. Block 0 is the
null block: never handed out; padding rows write their K/V there and it is never read.

Every other block is in one of three states:
- free: in ``_free`` (no content worth keeping);
- held: ``ref[b] > 0`` sequences have it in their block table;
- cached: held by nobody, but full and keyed by its hash, so a later request with the same
  prefix takes it back (``match``). Cached blocks are evicted least-recently-used first when
  ``allocate`` finds no free one.

A full block's key is a hash chained over the tokens of every block up to it (and ``extra``,
anything else that changes its K/V), so a key names a whole prefix. The key's tokens are stored
beside it and compared on a hit: a hash collision is a miss, never a wrong hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

NULL_BLOCK = 0


def block_keys(tokens: Sequence[int], block_size: int, extra: Hashable = None, start: int = 0,
               parent: int | None = None) -> list[tuple[int, tuple[int, ...]]]:  # fmt: skip
    """(hash, tokens) of the full blocks of ``tokens`` from block index ``start`` on, each hash
    chained from the previous block's (``parent``: the hash of block start - 1; None from 0)."""
    keys = []
    h = hash(("deepinfer-block", extra)) if parent is None else parent
    for i in range(start, len(tokens) // block_size):
        chunk = tuple(tokens[i * block_size : (i + 1) * block_size])
        h = hash((h, chunk))
        keys.append((h, chunk))
    return keys


class NoFreeBlocks(RuntimeError):
    """The pool has fewer free (or evictable) blocks than asked for."""


class BlockPool:
    """Parameters
    ----------
    num_blocks : int
        Blocks in the cache, the null block included (usable: num_blocks - 1).
    block_size : int
        Positions a block holds.
    caching : bool
        Keep full blocks for reuse by later requests (prefix caching).
    """

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.ref = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced full blocks, LRU first
        self._by_hash: dict[int, int] = {}  # hash -> block
        self._key: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)
        self.evictions = 0

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Blocks a sequence may ever hold (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks ``allocate`` can hand out now (free, or cached and evictable)."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.capacity - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks keyed for reuse (held or not)."""
        return len(self._key)

    # -- allocation -----------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """``n`` blocks, each held once: free ones first, then the least recently used cached
        ones (their keys dropped). Raises NoFreeBlocks (taking nothing) when there are fewer."""
        if n > self.num_free:
            raise NoFreeBlocks(f"asked for {n} KV blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._cached.popitem(last=False)
                self._forget(b)
                self.evictions += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one hold on each block. A block nobody holds becomes cached (when keyed) or free.
        Give a sequence's blocks last-first: its tail is then evicted before its prefix."""
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            self.ref[b] -= 1
            if self.ref[b] < 0:
                raise RuntimeError(f"KV block {b} freed more often than it was held")
            if self.ref[b] == 0:
                if b in self._key:
                    self._cached[b] = None
                else:
                    self._free.append(b)

    # -- prefix caching -------------------------------------------------------------------------
    def match(self, keys: Sequence[tuple[int, tuple[int, ...]]]) -> list[int]:
        """The blocks of the longest prefix of ``keys`` that is cached, each now held once more
        (and most recently used)."""
        if not self.caching:
            return []
        hits = []
        for key in keys:
            b = self.peek(key)
            if b is None:
                break
            hits.append(b)
        self.hold(hits)
        return hits

    def peek(self, key: tuple[int, tuple[int, ...]]) -> int | None:
        """The block cached with ``key`` (its tokens compared), or None; nothing is taken."""
        b = self._by_hash.get(key[0])
        return None if b is None or self._key[b][1] != key[1] else b

    def hold(self, blocks: Sequence[int]) -> None:
        """One more hold on each of these keyed blocks (found by ``peek``); most recently used."""
        for b in blocks:
            if self.ref[b] == 0:
                del self._cached[b]
            self.ref[b] += 1

    def register(self, block: int, key: tuple[int, tuple[int, ...]]) -> None:
        """``block`` is full with ``key``'s tokens: later requests may reuse it. A key already
        cached in another block keeps that one (this block stays unkeyed)."""
        if not self.caching or block in self._key or key[0] in self._by_hash:
            return
        self._by_hash[key[0]] = block
        self._key[block] = key

    def _forget(self, b: int) -> None:
        h, _ = self._key.pop(b)
        del self._by_hash[h]
