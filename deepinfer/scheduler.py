"""The engine's scheduler: who runs this step, in which KV slot. Plain data only (no tensors).

It owns the waiting queue (FIFO), the running list (kept in slot order: the fixed-shape decode
is slot-major) and the free KV slots. Each ``schedule()`` frees the slots of the requests that
finished, then decides one step and returns it as a ``SchedulerOutput``:

- prefill: waiting requests admitted into free slots, oldest first, at most ``max_num_seqs``
  running and ``max_num_batched_tokens`` prompt tokens (the first admitted always fits) -- a
  step that admits prefills only those;
- decode: else every running request (DSpark may turn the step into a verify step: ``verify``);
- moves: when nothing waits, the batch only shrinks: rows left in high slots move into the free
  slots below len(running), so the decode graphs run the smallest batch bucket that holds them
  (``compaction_moves``); the runner copies their KV entries.

The KV cache it schedules into is sized by its owner between runs (``set_capacity`` while
nothing runs: ``needs()`` is what the waiting requests ask for); a request whose length could
outgrow the current cache waits at the head of the queue until the running ones drain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    """One engine step, decided."""

    prefill: list[Sequence] = field(default_factory=list)  # admitted this step (slots assigned)
    decode: list[Sequence] = field(default_factory=list)  # the running rows, in slot order
    moves: list[tuple[Sequence, int, int]] = field(default_factory=list)  # (sequence, src slot, dst slot)
    finished: list[Sequence] = field(default_factory=list)  # finished since the last reap, slots freed
    verify: Any = None  # DSpark's plan for the decode rows (drafts to verify), set by the engine

    @property
    def batch(self) -> list[Sequence]:
        """The rows of this step's forward."""
        return self.prefill or self.decode


def compaction_moves(
    running: list[Sequence], free_slots, buckets: list[int]
) -> list[tuple[Sequence, int, int]]:
    """Moves (sequence, src, dst) putting ``running`` (in slot order) into its lowest slots when
    its highest slot needs a larger batch bucket than len(running) does: the sequences in
    slots >= len(running) go to the free slots below it, lowest first. [] when already compact."""
    n = len(running)
    if not n or running[-1].slot < next(b for b in buckets if b >= n):
        return []  # already in the smallest bucket that holds n rows
    movers = [s for s in running if s.slot >= n]
    return [(s, s.slot, dst) for s, dst in zip(movers, sorted(x for x in free_slots if x < n))]


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # slot order
        self.free_slots: set[int] = set()
        self.num_slots = 0  # KV slots of the cache scheduled into
        self.max_len = 0  # positions a slot holds
        self.buckets: list[int] | None = None  # batch buckets to compact into (None: never)
        self._done: list[Sequence] = []  # finished outside a step (failed at add, aborted)

    # -- requests in and out --------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request (one already finished -- its constraint failed to compile -- is only
        handed back by the next ``reap``)."""
        (self._done if seq.is_finished else self.waiting).append(seq)

    def abort(self, request_id) -> Sequence | None:
        """Take an unfinished request out, waiting or running (its slot freed now); it is handed
        back by the next ``reap``. None when there is no such unfinished request. The caller
        marks it finished."""
        for s in self.waiting:
            if s.request_id == request_id:
                self.waiting.remove(s)
                self._done.append(s)
                return s
        for s in self.running:
            if s.request_id == request_id and not s.is_finished:
                self.running.remove(s)
                self._free(s)
                self._done.append(s)
                return s
        return None

    def reap(self) -> list[Sequence]:
        """The requests that finished since the last reap; running ones leave their slots."""
        done, self._done = self._done, []
        finished = Status.FINISHED
        if any([s.status is finished for s in self.running]):
            keep = []
            for s in self.running:
                if s.status is finished:
                    self._free(s)
                    done.append(s)
                else:
                    keep.append(s)
            self.running = keep
        return done

    def _free(self, s: Sequence) -> None:
        self.free_slots.add(s.slot)
        s.slot = None

    # -- state ----------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        """Anything to run or to hand back."""
        return bool(self.waiting or self.running or self._done)

    @property
    def idle(self) -> bool:
        """No request holds a KV slot (the cache may be reallocated)."""
        return all(s.is_finished for s in self.running)

    def needs(self) -> tuple[int, int]:
        """(slots, positions a slot) the waiting requests ask of the KV cache."""
        return min(len(self.waiting), self.max_num_seqs), max(len(s) + s.max_tokens for s in self.waiting)

    def set_capacity(self, num_slots: int, max_len: int, buckets: list[int] | None = None) -> None:
        """Schedule into a (new) KV cache of ``num_slots`` slots of ``max_len`` positions, with
        ``buckets`` to compact into (None: no compaction). Only while idle."""
        if not self.idle:
            raise RuntimeError("the KV cache can change only while no request is running")
        self._done = self.reap()  # handed back by the next reap still
        self.num_slots, self.max_len, self.buckets = num_slots, max_len, buckets
        self.free_slots = set(range(num_slots))

    # -- one step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Free finished rows' slots, then decide this step: admissions (prefill), else the
        decode batch; slot moves when the batch only shrinks."""
        out = SchedulerOutput(finished=self.reap())
        if not self.waiting:
            out.moves = self._compact()
        budget = self.max_num_batched_tokens
        while self.waiting and self.free_slots and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            if (out.prefill and len(s) > budget) or len(s) + s.max_tokens > self.max_len:
                break  # over this step's token budget / waits for a larger cache (between runs)
            self.waiting.popleft()
            s.slot, s.status = min(self.free_slots), Status.RUNNING
            self.free_slots.remove(s.slot)
            budget -= len(s)
            out.prefill.append(s)
            self.running.append(s)
        if out.prefill:
            self.running.sort(key=lambda s: s.slot)
        else:
            out.decode = list(self.running)
        return out

    def _compact(self) -> list[tuple[Sequence, int, int]]:
        if self.buckets is None:
            return []
        moves = compaction_moves(self.running, self.free_slots, self.buckets)
        for s, src, dst in moves:
            self.free_slots.remove(dst)
            self.free_slots.add(src)
            s.slot = dst
        if moves:
            self.running.sort(key=lambda s: s.slot)
        return moves
