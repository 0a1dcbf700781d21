"""The engine's scheduler: who runs this step, how many of their tokens, in which KV blocks.
Plain data only (no tensors).

It owns the waiting queue (FIFO), the running list (admission order) and the ``BlockPool``.
Each ``schedule()`` frees the blocks of the requests that finished, then decides one step and
returns it as a ``SchedulerOutput``: rows, each computing its next ``count`` uncached tokens,
at most ``max_num_batched_tokens`` in all:

- running requests first, oldest first: a decode row computes one token; a request whose
  prompt is longer than the budget computes it in chunks over several steps (chunked prefill),
  beside the decodes of the others in the same step;
- then waiting requests, oldest first, while the budget, ``max_num_seqs`` and the free blocks
  allow: each takes the longest cached prefix of its tokens (prefix caching: full blocks keyed
  by a hash chained over their tokens) and computes the rest, or a chunk of it (with
  ``admit=False``, only when no running request has work: async scheduling's decode step of
  the running rows is already on the device);
- when a running request needs a block and none is free, the youngest running request is
  preempted: its blocks are released (its full ones stay cached), it goes back to the front of
  the queue and later recomputes what it had (mostly prefix hits). Nothing is dropped and
  nothing is computed twice into an output.

A request that cannot fit the whole pool even alone fails (``refused``) with a message that
says so; its neighbours go on. After the forward the engine calls ``commit``: the blocks that
became full are keyed for reuse, and blocks past what is cached (DSpark's rejected drafts) are
released, but for the block of each row's next position when the next decode step is already
running (async scheduling, ``commit(ahead=True)``).

Sliding windows (docs/kv-cache.md, "Sliding windows"): a model's layers may form two KV-cache
groups, full attention and sliding window, each with its own ``BlockPool`` and a block table per
sequence. After each step a sliding-window group gives back the blocks wholly before
``num_cached - window + 1 - margin`` (``margin``: DSpark's rollback reach), pointing their entries
at the null block, so a running request holds at most ``window_bound`` blocks there. A request
admitted with a prefix hit takes it at the largest block boundary P* within the full-attention
hit where the sliding-window group still has the blocks of the window before P* (bounded
replay); without one it recomputes everything.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .block_pool import NULL_BLOCK, BlockPool, block_keys
from .sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    """One engine step, decided."""

    rows: list[Sequence] = field(default_factory=list)  # the forward's rows, oldest first
    counts: list[int] = field(default_factory=list)  # tokens each row computes
    batch: list[Sequence] = field(default_factory=list)  # rows whose tokens are then all cached: they sample
    decode: bool = False  # every row computes its one newest token (a decode step: graphs, DSpark)
    finished: list[Sequence] = field(default_factory=list)  # finished since the last reap, blocks freed
    refused: list[tuple[Sequence, str]] = field(default_factory=list)  # cannot fit the pool: fail with this
    verify: Any = None  # DSpark's plan for the decode rows (drafts to verify), set by the engine


class Scheduler:
    """Parameters
    ----------
    max_num_seqs, max_num_batched_tokens : int
        Most running requests; most tokens computed in one step.
    pool : BlockPool, or a list of them
        The KV cache's blocks: one pool per KV-cache group (``kv_cache.kv_groups``).
    chunk_align : int or None
        Prefill chunks end at multiples of this many positions and prefix hits are rounded down
        to them (deterministic mode on the CPU: a chunk's shape does not depend on a hit).
    windows : list of int or None
        Each group's sliding window (0: full attention); None: no windows.
    margin : int
        Positions a sliding-window group keeps behind its window: DSpark's rollback reach
        (``DSparkConfig.rollback_margin``).
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        pool: BlockPool | list[BlockPool],
        *,
        chunk_align: int | None = None,
        windows: list[int] | None = None,
        margin: int = 0,
    ) -> None:
        pools = [pool] if isinstance(pool, BlockPool) else list(pool)
        pool = pools[0]
        windows = [0] * len(pools) if windows is None else list(windows)
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens!r}")
        if chunk_align is not None and chunk_align % pool.block_size:
            raise ValueError(
                f"chunk_align {chunk_align} is not a multiple of the block size {pool.block_size}"
            )
        if len(windows) != len(pools) or any(p.block_size != pool.block_size for p in pools):
            raise ValueError(f"{len(pools)} KV pools (one block size) need as many windows, got {windows}")
        if sum(1 for w in windows if w) > 1 or margin < 0:
            raise ValueError(f"one sliding-window group at most and margin >= 0, got {windows}, {margin}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pools, self.windows, self.margin = pools, windows, margin
        self._windowed = any(windows)
        self.pool = pool
        self._bs = pool.block_size
        self.chunk_align = chunk_align
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._done: list[Sequence] = []  # finished outside a step (failed at add, aborted, refused)
        self._arrival = itertools.count()
        # counters (LLM.metrics)
        self.prompt_tokens = 0  # tokens of admitted requests' prompts (and of recomputed outputs)
        self.prefill_tokens = 0  # of those, computed (the rest were prefix hits)
        self.hit_tokens = 0
        self.preemptions = 0
        self.swa_replays = 0  # hits taken at P* with only the window before it (bounded replay)
        self.swa_replay_tokens = 0  # tokens those recomputed
        self.swa_full_recomputes = 0  # a prefix was cached but no window before any P* > 0 was

    # -- requests in and out --------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request (one already finished -- its constraint failed to compile -- is only
        handed back by the next ``reap``)."""
        seq.arrival = next(self._arrival)
        seq.block_tables = [[] for _ in self.pools]
        (self._done if seq.is_finished else self.waiting).append(seq)

    def abort(self, request_id) -> Sequence | None:
        """Take an unfinished request out, waiting or running (its blocks freed now); it is handed
        back by the next ``reap``. None when there is no such unfinished request. The caller
        marks it finished."""
        for s in self.waiting:
            if s.request_id == request_id:
                self.waiting.remove(s)
                self._release(s)  # (a preempted request holds nothing; this is a no-op then)
                self._done.append(s)
                return s
        for s in self.running:
            if s.request_id == request_id and not s.is_finished:
                self.running.remove(s)
                self._release(s)
                self._done.append(s)
                return s
        return None

    def reap(self) -> list[Sequence]:
        """The requests that finished since the last reap; running ones release their blocks."""
        done, self._done = self._done, []
        finished = Status.FINISHED
        if any([s.status is finished for s in self.running]):
            keep = []
            for s in self.running:
                if s.status is finished:
                    self._release(s)
                    done.append(s)
                else:
                    keep.append(s)
            self.running = keep
        return done

    # -- state ----------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        """Anything to run or to hand back."""
        return bool(self.waiting or self.running or self._done)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self, admit: bool = True) -> SchedulerOutput:
        """Free finished rows' blocks, then decide this step (see the module docstring).
        ``admit=False``: waiting requests wait one step more unless no running row has work
        (async scheduling: the running rows' decode step is already on the device)."""
        out = SchedulerOutput(finished=self.reap())
        budget = self.max_num_batched_tokens
        preempted = False
        running = Status.RUNNING
        for s in list(self.running):
            if s.status is not running or budget <= 0:
                continue  # preempted below by an older row, or no budget left
            n = min(len(s) - s.num_cached, budget)
            if self.chunk_align:
                n = self._chunk(s, n)
            while not self._grow(s, s.num_cached + n):
                if len(self.running) == 1:  # alone and still too long: the pool cannot hold it
                    self._refuse(s, out, s.num_cached + n)
                    break
                victim = max((r for r in self.running if r not in out.rows), key=lambda r: r.arrival)
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            else:
                self._take(s, n, out)
                budget -= n
        admit = not preempted and (admit or not out.rows)
        while admit and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            if not self._fits(len(s)):  # cannot even compute its prompt
                self.waiting.popleft()
                self._refuse(s, out, len(s))
                continue
            self._swa_hit = None
            self._match(s)
            n = self._chunk(s, min(len(s) - s.num_cached, budget))
            if not self._grow(s, s.num_cached + n):
                self._release(s)  # its hits back to the cache; it waits for blocks
                break
            self.waiting.popleft()
            s.status = Status.RUNNING
            self.running.append(s)
            self.prompt_tokens += len(s)
            self.hit_tokens += s.num_cached
            if self._swa_hit:
                self.swa_replays += self._swa_hit[0]
                self.swa_replay_tokens += self._swa_hit[1]
                self.swa_full_recomputes += self._swa_hit[2]
            s.prefill_end = len(s)
            self._take(s, n, out)
            budget -= n
        # every row computes one token and completes (the rows that sample are all of them)
        rows = len(out.rows)
        out.decode = rows > 0 and len(out.batch) == rows and out.counts.count(1) == rows
        return out

    def reserve(self, seqs: list[Sequence], positions: int) -> bool:
        """Blocks for each sequence's positions L-1 .. L-1+positions-1 (DSpark's verify forward
        writes its drafts there), from free blocks only. False when they are not there (what was
        taken is released at ``commit``)."""
        return all(self._grow(s, len(s) - 1 + positions) for s in seqs)

    def commit(self, rows: list[Sequence], ahead: bool = False) -> None:
        """After a step: key the blocks of ``rows`` that became full (DSpark's accepted drafts)
        and release blocks past what each has cached (its rejected ones). ``ahead``: the next
        decode step of these rows is already running (async scheduling): the block of each
        row's next position stays."""
        for s in rows:
            tables = s.block_tables
            if not tables[0]:
                continue
            cached = s.num_cached
            self._register(s, min(cached, len(s)))
            keep = self._blocks(cached + ahead)
            for pool, table in zip(self.pools, tables):
                if len(table) > keep:
                    pool.free(table[: keep - 1 : -1])
                    del table[keep:]
            if self._windowed:
                self._slide(s)

    def window_bound(self) -> int:
        """Most blocks a running request holds in the sliding-window group between steps:
        the window and margin behind its next position, plus the block that one starts in."""
        w = max(self.windows)
        return self._blocks(w + self.margin) + 1 if w else 0

    # -- helpers --------------------------------------------------------------------------------
    def _blocks(self, positions: int) -> int:
        return -(-positions // self._bs)

    def _fits(self, positions: int) -> bool:
        """A request of this many positions, running alone, fits every pool (a sliding-window
        group holds its window and margin, and at most one step's tokens past them)."""
        for pool, w in zip(self.pools, self.windows):
            need = self._blocks(positions)
            if w:
                step = self._blocks(self.max_num_batched_tokens + self.margin)
                need = min(need, self.window_bound() + step)
            if need > pool.capacity:
                return False
        return True

    def _slide(self, s: Sequence) -> None:
        """Give back the sliding-window group's blocks wholly before the window (and margin)
        of the sequence's next position; their entries point at the null block (never read)."""
        for g, w in enumerate(self.windows):
            if not w:
                continue
            table = s.block_tables[g]
            n = min(len(table), max(0, s.num_cached - w + 1 - self.margin) // self.pool.block_size)
            if n > s.num_slid:
                self.pools[g].free(table[s.num_slid : n])  # oldest first: evicted first
                table[s.num_slid : n] = [NULL_BLOCK] * (n - s.num_slid)
                s.num_slid = n

    def _chunk(self, s: Sequence, n: int) -> int:
        """At most n tokens, ending at a multiple of chunk_align when set."""
        if self.chunk_align:
            n = min(n, self.chunk_align - s.num_cached % self.chunk_align)
        return n

    def _take(self, s: Sequence, n: int, out: SchedulerOutput) -> None:
        """Schedule n tokens of s. The blocks they fill are keyed now: a request admitted later
        in this step may already share them (every row's K/V of a layer is written before any
        row's attention of that layer reads)."""
        out.rows.append(s)
        out.counts.append(n)
        if s.completes(n):
            out.batch.append(s)
        cached = s.num_cached
        end = cached + n
        if cached < s.prefill_end:  # (a decode row computes no prompt token)
            self.prefill_tokens += min(end, s.prefill_end) - cached
        self._register(s, end)

    def _register(self, s: Sequence, positions: int) -> None:
        """Key the sequence's full blocks below ``positions`` (their tokens are known)."""
        full = positions // self._bs
        if full <= s.num_registered:
            return
        if self.pool.caching:
            keys = self._keys(s, full)
            for pool, table in zip(self.pools, s.block_tables):
                for i in range(s.num_registered, full):
                    if table[i] != NULL_BLOCK:
                        pool.register(table[i], keys[i])
        s.num_registered = full

    def _grow(self, s: Sequence, positions: int) -> bool:
        """Blocks for ``positions`` positions; False (taking nothing) when the pool lacks them."""
        blocks = self._blocks(positions)
        if len(self.pools) == 1:
            table = s.block_tables[0]
            need = blocks - len(table)
            if need <= 0:
                return True
            if need > self.pool.num_free:
                return False
            table += self.pool.allocate(need)
            return True
        if any(blocks - len(t) > p.num_free for p, t in zip(self.pools, s.block_tables)):
            return False
        for p, t in zip(self.pools, s.block_tables):
            if blocks > len(t):
                t += p.allocate(blocks - len(t))
        return True

    def _keys(self, s: Sequence, n: int) -> list:
        """(hash, tokens) of the sequence's first n full blocks (kept on it: its tokens never
        change below its length)."""
        keys = s.block_keys
        if len(keys) < n:
            bs = self.pool.block_size
            parent = keys[-1][0] if keys else None
            keys += block_keys(s.all_token_ids[: n * bs], bs, start=len(keys), parent=parent)
        return keys

    def _match(self, s: Sequence) -> None:
        """Take the longest cached prefix of the sequence's tokens (but its last token, whose
        logits are needed), in whole chunk_align units when set."""
        if not self.pool.caching or s.block_table:
            return
        n = (len(s) - 1) // self.pool.block_size
        if self.chunk_align:
            unit = self.chunk_align // self.pool.block_size
            n -= n % unit
        if self._windowed:
            self._match_windowed(s, self._keys(s, n)[:n] if n else [])
            return
        hits = self.pool.match(self._keys(s, n)[:n]) if n else []
        if self.chunk_align and len(hits) % unit:
            cut = len(hits) - len(hits) % unit
            self.pool.free(hits[cut:][::-1])  # (cut may be 0)
            hits = hits[:cut]
        s.block_table = hits
        s.num_cached = len(hits) * self.pool.block_size
        s.num_registered = len(hits)

    def _match_windowed(self, s: Sequence, keys: list) -> None:
        """The prefix hit of a model with a sliding-window group: the largest block boundary P*
        within the full-attention hit (every block below P* cached there) where the sliding-window
        group has the blocks of the window before P* (keys P* - w + 1 .. P* - 1, all a query at
        P* or later reads there). Its table points at the null block below them."""
        bs = self.pool.block_size
        unit = self.chunk_align // bs if self.chunk_align else 1
        g = next(i for i, w in enumerate(self.windows) if w)
        w, wpool = self.windows[g], self.pools[g]
        full = [i for i, x in enumerate(self.windows) if not x]
        hits = self.pools[full[0]].match(keys) if full else None
        H = len(keys) if hits is None else len(hits)
        present = [wpool.peek(k) for k in keys[:H]]

        def low(j: int) -> int:  # the window's first block for a hit of j blocks
            return max(0, j * bs - w + 1) // bs

        j, run = 0, 0
        for i, b in enumerate(present):
            run = run + 1 if b is not None else 0
            if run >= i + 1 - low(i + 1) and (i + 1) % unit == 0:
                j = i + 1
        if hits is not None:
            self.pools[full[0]].free(hits[j:][::-1])
            s.block_tables[full[0]] = hits[:j]
        lo = low(j) if j else 0
        wpool.hold(present[lo:j])
        s.block_tables[g] = [NULL_BLOCK] * lo + present[lo:j]
        s.num_slid = lo
        s.num_cached = j * bs
        s.num_registered = j
        if j == 0 and (H if hits is not None else any(b is not None for b in present)):
            self._swa_hit = (0, 0, 1)
        elif lo:
            self._swa_hit = (1, len(s) - j * bs, 0)

    _swa_hit = None  # (replays, replay tokens, full recomputes) of the last match, counted at admission

    def _release(self, s: Sequence) -> None:
        """Give back the sequence's blocks (last first: its tail is evicted before its prefix)."""
        for pool, table in zip(self.pools, s.block_tables):
            if table:
                pool.free(table[::-1])
        s.block_tables = [[] for _ in self.pools]
        s.num_cached = s.num_registered = s.num_slid = 0

    def _preempt(self, s: Sequence) -> None:
        self.running.remove(s)
        self._release(s)
        s.status = Status.WAITING
        self.waiting.appendleft(s)
        self.preemptions += 1

    def _refuse(self, s: Sequence, out: SchedulerOutput, positions: int) -> None:
        if s in self.running:
            self.running.remove(s)
        self._release(s)
        tokens = self.pool.capacity * self.pool.block_size
        why = (
            f"the request needs {positions} KV positions (its prompt and the output it has so far), "
            f"more than the whole KV cache holds ({tokens}); give LLM a larger kv_cache_memory"
        )
        out.refused.append((s, why))
        self._done.append(s)
