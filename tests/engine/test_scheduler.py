"""The engine scheduler alone (no model, no tensors): admission order and budget, slot reuse
after a finish, compaction moves, aborts of waiting and running requests."""

from __future__ import annotations

import pytest

from deepinfer.sampling_params import SamplingParams
from deepinfer.scheduler import Scheduler, SchedulerOutput, compaction_moves
from deepinfer.sequence import Sequence, Status


def _seq(rid: int, prompt_len: int = 4, max_tokens: int = 8) -> Sequence:
    sp = SamplingParams(max_tokens=max_tokens)
    return Sequence(rid, None, list(range(1, prompt_len + 1)), sp, seed=0, eos_token_ids=(), max_len=4096)


def _finish(s: Sequence) -> None:
    s.status = Status.FINISHED  # what on_token / fail do (the scheduler reads only the status)


def _sched(num_slots=4, max_len=64, *, max_num_seqs=64, budget=8192, buckets=None, seqs=()) -> Scheduler:
    sch = Scheduler(max_num_seqs, budget)
    for s in seqs:
        sch.add(s)
    sch.set_capacity(num_slots, max_len, buckets)
    return sch


def test_admits_in_order_into_the_lowest_free_slots():
    seqs = [_seq(i) for i in range(6)]
    sch = _sched(4, seqs=seqs)
    out = sch.schedule()
    assert isinstance(out, SchedulerOutput) and out.decode == [] and out.moves == []
    assert [s.request_id for s in out.prefill] == [0, 1, 2, 3] and out.batch == out.prefill
    assert [s.slot for s in out.prefill] == [0, 1, 2, 3] and all(
        s.status is Status.RUNNING for s in out.prefill
    )
    assert [s.request_id for s in sch.waiting] == [4, 5] and not sch.free_slots
    out = sch.schedule()  # no slot free: every running row decodes
    assert out.prefill == [] and [s.request_id for s in out.decode] == [0, 1, 2, 3]


def test_token_budget_and_max_num_seqs():
    seqs = [_seq(0, 10), _seq(1, 10), _seq(2, 30), _seq(3, 2)]
    sch = _sched(8, seqs=seqs, budget=24)
    assert [s.request_id for s in sch.schedule().prefill] == [0, 1]  # 20 tokens; the third would be 50
    out = sch.schedule()  # the first admitted always fits, even over the budget; FIFO: 3 waits behind 2
    assert [s.request_id for s in out.prefill] == [2]
    assert [s.request_id for s in sch.schedule().prefill] == [3]
    sch = _sched(8, seqs=[_seq(i) for i in range(5)], max_num_seqs=3)
    assert len(sch.schedule().prefill) == 3 and len(sch.schedule().decode) == 3 and len(sch.waiting) == 2


def test_needs_and_requests_longer_than_the_cache_wait():
    sch = Scheduler(4, 8192)
    for s in (_seq(0, 4, 8), _seq(1, 10, 40), _seq(2, 4, 8)):
        sch.add(s)
    assert sch.idle and sch.needs() == (3, 50)
    sch.set_capacity(4, 20)  # a cache too short for request 1: it waits at the head
    assert [s.request_id for s in sch.schedule().prefill] == [0]
    assert [s.request_id for s in sch.waiting] == [1, 2]
    with pytest.raises(RuntimeError):
        sch.set_capacity(4, 64)  # not while a request runs
    _finish(sch.running[0])
    assert sch.idle
    sch.set_capacity(4, 64)  # between runs: the larger cache
    out = sch.schedule()
    assert [s.request_id for s in out.finished] == [0]
    assert [s.request_id for s in out.prefill] == [1, 2] and [s.slot for s in out.prefill] == [0, 1]


def test_finished_rows_free_their_slots_for_the_next_admission():
    seqs = [_seq(i) for i in range(5)]
    sch = _sched(3, seqs=seqs)
    first = sch.schedule().prefill
    _finish(first[1])
    done = sch.reap()
    assert done == [first[1]] and first[1].slot is None and sch.free_slots == {1}
    out = sch.schedule()
    assert [(s.request_id, s.slot) for s in out.prefill] == [(3, 1)]
    assert [s.request_id for s in sch.running] == [0, 3, 2]  # slot order
    _finish(sch.running[0])
    out = sch.schedule()  # a finish seen by schedule() itself is reported there
    assert [s.request_id for s in out.finished] == [0] and [(s.request_id, s.slot) for s in out.prefill] == [
        (4, 0)
    ]
    assert sch.has_unfinished() and sch.reap() == []


def test_compaction_moves_when_the_batch_only_shrinks():
    seqs = [_seq(i) for i in range(8)]
    sch = _sched(8, seqs=seqs, buckets=[1, 2, 4, 8])
    sch.schedule()
    for s in seqs:
        if s.slot not in (2, 5, 7):
            _finish(s)
    out = sch.schedule()
    assert [(s.request_id, src, dst) for s, src, dst in out.moves] == [(5, 5, 0), (7, 7, 1)]
    assert [s.slot for s in out.decode] == [0, 1, 2] and [s.request_id for s in out.decode] == [5, 7, 2]
    assert sch.free_slots == {3, 4, 5, 6, 7}
    assert sch.schedule().moves == []  # already in the smallest bucket that holds 3 rows
    # no buckets (no graphs, or deterministic tiles): never
    sch = _sched(8, seqs=[_seq(i) for i in range(8)])
    sch.schedule()
    for s in sch.running[:-1]:
        _finish(s)
    assert sch.schedule().moves == [] and [s.slot for s in sch.running] == [7]
    # nothing moves while requests wait (the batch may grow again)
    sch = _sched(2, seqs=[_seq(i) for i in range(3)], buckets=[1, 2])
    sch.schedule()
    _finish(sch.running[0])
    out = sch.schedule()
    assert out.moves == [] and [(s.request_id, s.slot) for s in out.prefill] == [(2, 0)]


def test_compaction_moves_function():
    seqs = [_seq(i) for i in range(3)]
    for s, slot in zip(seqs, (1, 9, 12)):
        s.slot = slot
    moves = compaction_moves(seqs, {0, 2, 3, 4}, [1, 2, 4, 8, 16])
    assert [(src, dst) for _, src, dst in moves] == [(9, 0), (12, 2)]
    assert compaction_moves([], set(), [1]) == []


def test_abort_waiting_and_running():
    seqs = [_seq(i) for i in range(4)]
    sch = _sched(2, seqs=seqs)
    sch.schedule()  # 0, 1 running; 2, 3 waiting
    assert sch.abort(3) is seqs[3] and [s.request_id for s in sch.waiting] == [2]
    assert sch.abort(0) is seqs[0] and seqs[0].slot is None and sch.free_slots == {0}
    assert [s.request_id for s in sch.running] == [1]
    assert sch.abort(0) is None and sch.abort(99) is None
    assert sch.reap() == [seqs[3], seqs[0]]
    out = sch.schedule()
    assert [(s.request_id, s.slot) for s in out.prefill] == [(2, 0)]


def test_failed_requests_are_handed_back_without_running():
    bad = _seq(0)
    _finish(bad)
    sch = Scheduler(4, 8192)
    sch.add(bad)
    assert sch.has_unfinished() and not sch.waiting
    out = sch.schedule()
    assert out.finished == [bad] and out.batch == [] and not sch.has_unfinished()
