"""The engine scheduler and its block pool alone (no model, no tensors): admission by free
blocks and budget, chunked prefill beside decodes, prefix hits (also within one step),
preemption of the youngest request, refusal of a request the pool cannot hold, aborts, and the
pool back to empty after a run."""

from __future__ import annotations

import random

import pytest

from deepinfer.block_pool import NULL_BLOCK, BlockPool, NoFreeBlocks, block_keys
from deepinfer.sampling_params import SamplingParams
from deepinfer.scheduler import Scheduler, SchedulerOutput
from deepinfer.sequence import Sequence, Status

BS = 4


def _seq(rid: int, prompt, max_tokens: int = 8) -> Sequence:
    if isinstance(prompt, int):
        prompt = [1000 + rid * 100 + i for i in range(prompt)]  # unique tokens: no prefix hits
    sp = SamplingParams(max_tokens=max_tokens)
    return Sequence(rid, None, list(prompt), sp, seed=0, eos_token_ids=(), max_len=4096)


def _sched(num_blocks=64, *, max_num_seqs=64, budget=8192, caching=True, align=None, seqs=()) -> Scheduler:
    sch = Scheduler(max_num_seqs, budget, BlockPool(num_blocks, BS, caching=caching), chunk_align=align)
    for s in seqs:
        sch.add(s)
    return sch


def _run(sch: Scheduler, out: SchedulerOutput, token=7) -> None:
    """What the engine does after a step: the rows' tokens are cached, each sampling row gains a
    token (and finishes at max_tokens), then commit."""
    for s, n in zip(out.rows, out.counts):
        s.num_cached += n
    for s in out.batch:
        s.output_token_ids.append(token)
        if len(s.output_token_ids) >= s.max_tokens:
            s.status = Status.FINISHED
    for s, _ in out.refused:
        s.status = Status.FINISHED
    sch.commit(out.rows)


def _drain(sch: Scheduler, limit=10_000) -> list[Sequence]:
    done = []
    for _ in range(limit):
        if not sch.has_unfinished():
            return done
        out = sch.schedule()
        done += out.finished
        _run(sch, out)
    raise AssertionError("the scheduler did not drain")


# -- the pool ------------------------------------------------------------------------------------
def test_pool_allocates_frees_and_evicts_least_recently_used():
    pool = BlockPool(5, BS)
    a = pool.allocate(2)
    assert NULL_BLOCK not in a and pool.num_free == 2 and pool.num_used == 2
    with pytest.raises(NoFreeBlocks, match="asked for 3 KV blocks, 2 free"):
        pool.allocate(3)
    keys = block_keys(list(range(8)), BS)
    pool.register(a[0], keys[0])
    pool.register(a[1], keys[1])
    pool.free(a[::-1])  # cached now, evictable; the tail first
    assert pool.num_free == 4 and pool.num_cached == 2
    assert pool.match(keys) == a and pool.num_free == 2  # held again
    pool.free(a[::-1])
    b = pool.allocate(3)  # 2 free + 1 evicted: the LRU one is the tail block a[1]
    assert pool.evictions == 1 and a[1] in b and pool.match(keys) == [a[0]]
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([b[0]] * 2)


def test_block_keys_chain_over_the_whole_prefix_and_a_collision_is_a_miss():
    k1 = block_keys([1, 2, 3, 4, 5, 6, 7, 8], BS)
    k2 = block_keys([9, 9, 9, 9, 5, 6, 7, 8], BS)
    assert k1[1][1] == k2[1][1] and k1[1][0] != k2[1][0]  # same tokens, other prefix: other key
    assert block_keys([1, 2, 3, 4, 5, 6, 7, 8], BS, start=1, parent=k1[0][0]) == k1[1:]
    pool = BlockPool(4, BS)
    (b,) = pool.allocate(1)
    pool.register(b, (k1[0][0], (0, 0, 0, 0)))  # the same hash over other tokens
    assert pool.match(k1) == []


# -- admission and chunked prefill ---------------------------------------------------------------
def test_admits_oldest_first_within_the_token_budget_and_chunks_a_long_prompt():
    seqs = [_seq(0, 10), _seq(1, 3), _seq(2, 30)]
    sch = _sched(budget=16, seqs=seqs)
    out = sch.schedule()
    assert [(s.request_id, n) for s, n in zip(out.rows, out.counts)] == [(0, 10), (1, 3), (2, 3)]
    assert out.batch == seqs[:2] and not out.decode  # request 2 is mid-prompt: it does not sample
    _run(sch, out)
    out = sch.schedule()  # decodes of 0 and 1 beside the next chunk of 2, in one step
    assert [(s.request_id, n) for s, n in zip(out.rows, out.counts)] == [(0, 1), (1, 1), (2, 14)]
    _run(sch, out)
    out = sch.schedule()
    assert [(s.request_id, n) for s, n in zip(out.rows, out.counts)] == [(0, 1), (1, 1), (2, 13)]
    assert out.batch == seqs and not out.decode
    _run(sch, out)
    assert sch.schedule().decode


def test_admission_waits_for_free_blocks_and_max_num_seqs():
    sch = _sched(num_blocks=7, seqs=[_seq(i, 8, max_tokens=2) for i in range(4)])  # 6 usable blocks
    out = sch.schedule()
    assert [s.request_id for s in out.rows] == [0, 1, 2]  # 2 blocks each; the 4th waits
    assert sch.pool.num_free == 0 and len(sch.waiting) == 1
    sch = _sched(max_num_seqs=2, seqs=[_seq(i, 3) for i in range(3)])
    assert [s.request_id for s in sch.schedule().rows] == [0, 1]


def test_prefix_hits_across_steps_and_within_one_step():
    shared = list(range(1, 13))  # 3 full blocks
    seqs = [_seq(i, shared + [100 + i, 200 + i]) for i in range(3)]
    sch = _sched(seqs=seqs)
    out = sch.schedule()
    # request 0 computes all 14; 1 and 2 share its 3 full blocks in the same step
    assert out.counts == [14, 2, 2] and sch.hit_tokens == 24 and sch.prefill_tokens == 18
    assert seqs[1].block_table[:3] == seqs[0].block_table[:3] == seqs[2].block_table[:3]
    assert all(sch.pool.ref[b] == 3 for b in seqs[0].block_table[:3])
    _drain(sch)
    later = _seq(9, shared + [1, 2, 3, 4, 5])
    sch.add(later)
    out = sch.schedule()
    assert out.counts == [5] and later.num_cached == 12  # from the cache, across runs
    # a prompt of exactly 3 full blocks still computes its last token
    exact = _seq(10, shared)
    sch.add(exact)
    _run(sch, out)
    out = sch.schedule()
    assert dict(zip([s.request_id for s in out.rows], out.counts))[10] == 4


def test_no_hits_when_caching_is_off_and_hits_aligned_in_deterministic_mode():
    shared = list(range(1, 41))  # 10 blocks of 4
    sch = _sched(caching=False, seqs=[_seq(0, shared + [1]), _seq(1, shared + [2])])
    assert sch.schedule().counts == [41, 41] and sch.hit_tokens == 0
    sch = _sched(align=16, seqs=[_seq(0, shared + [1])])
    out = sch.schedule()
    assert out.counts == [16]  # chunks end at multiples of 16
    _drain(sch)
    sch.add(_seq(1, shared + [2]))
    out = sch.schedule()
    assert sch.hit_tokens == 32 and out.counts == [9]  # 10 blocks cached, 8 = 2 x 16 of them taken


# -- preemption and refusal ----------------------------------------------------------------------
def test_youngest_is_preempted_and_recomputes_from_its_cached_blocks():
    a, b = _seq(0, 7, max_tokens=20), _seq(1, 7, max_tokens=20)
    sch = _sched(num_blocks=10, seqs=[a, b])  # 9 usable blocks: 2 each now, 7 each at the end
    for _ in range(60):
        out = sch.schedule()
        _run(sch, out)
        if sch.preemptions:
            break
    assert sch.preemptions == 1 and b.status is Status.WAITING and sch.waiting[0] is b and not b.block_table
    assert a in sch.running and b.num_cached == 0
    made = len(b.output_token_ids)
    done = _drain(sch)
    assert {s.request_id for s in done} == {0, 1} and len(b.output_token_ids) == 20 and made > 0
    assert sch.prefill_tokens > 14  # b recomputed what it had
    assert sch.pool.num_used == 0


def test_a_request_larger_than_the_pool_is_refused_alone():
    big, ok = _seq(0, 30), _seq(1, 5, max_tokens=3)
    sch = _sched(num_blocks=6, seqs=[big, ok])  # 5 usable blocks = 20 positions
    out = sch.schedule()
    assert [s.request_id for s, _ in out.refused] == [0] and "more than the whole KV cache holds (20)" in (
        out.refused[0][1]
    )
    assert [s.request_id for s in out.rows] == [1]
    grows = _seq(2, 10, max_tokens=50)  # fits at first, outgrows the pool alone
    sch = _sched(num_blocks=6, seqs=[grows])
    refused = []
    for _ in range(40):
        out = sch.schedule()
        refused += out.refused
        _run(sch, out)
    # 20 positions: 10 of prompt and 10 outputs computed; the 11th output has no room
    assert [s.request_id for s, _ in refused] == [2] and len(grows.output_token_ids) == 11
    assert "needs 21 KV positions" in refused[0][1]
    assert sch.pool.num_used == 0 and not sch.has_unfinished()


def test_reserve_and_commit_release_rejected_draft_blocks():
    s = _seq(0, 6)
    sch = _sched(seqs=[s])
    _run(sch, sch.schedule())
    assert len(s.block_table) == 2 and len(s) == 7
    assert sch.reserve([s], 9)  # positions 6 .. 14
    assert len(s.block_table) == 4
    s.num_cached = 8  # two accepted
    s.output_token_ids += [1, 2]
    sch.commit([s])
    assert len(s.block_table) == 2 and sch.pool.num_used == 2 and s.num_registered == 2


def test_abort_frees_blocks_at_once():
    seqs = [_seq(i, 9) for i in range(3)]
    sch = _sched(seqs=seqs, max_num_seqs=2)
    _run(sch, sch.schedule())
    used = sch.pool.num_used
    assert sch.abort(0) is seqs[0] and sch.pool.num_used == used - 3 and not seqs[0].block_table
    assert sch.abort(2) is seqs[2] and sch.abort(2) is None and sch.abort(99) is None
    assert [s.request_id for s in sch.reap()] == [0, 2]


def test_random_workload_never_loses_a_request_and_returns_the_pool_to_empty():
    rng = random.Random(0)
    prefix = list(range(1, 30))
    seqs = []
    for i in range(120):
        p = prefix[: rng.randrange(0, 29)] + [5000 + i] * rng.randrange(1, 20)
        seqs.append(_seq(i, p, max_tokens=rng.randrange(1, 25)))
    sch = _sched(num_blocks=40, budget=32, max_num_seqs=16, seqs=seqs)
    done = _drain(sch)
    assert sorted(s.request_id for s in done) == list(range(120))
    assert all(len(s.output_token_ids) == s.max_tokens for s in done)
    assert sch.preemptions > 0 and sch.hit_tokens > 0
    assert sch.pool.num_used == 0 and all(r == 0 for r in sch.pool.ref)


@pytest.mark.parametrize("align", [None, 2 * BS])
def test_each_step_matches_the_reference_formulas_on_a_random_workload(align):
    """``schedule`` and ``commit`` keep their per-row work inline; each step of a random workload
    (prefix hits, chunked prompts, preemptions) is checked against the definitions: the rows that
    sample are those the step completes, a decode step is one of one-token rows that all complete,
    the prompt tokens computed are each row's below its prefill end, and after ``commit`` a
    running row has keyed exactly its full cached blocks."""
    rng = random.Random(1)
    prefix = list(range(1, 40))
    seqs = [
        _seq(
            i,
            prefix[: rng.randrange(0, 39)] + [7000 + i] * rng.randrange(1, 30),
            max_tokens=rng.randrange(1, 30),
        )
        for i in range(80)
    ]
    sch = _sched(num_blocks=48, budget=24, max_num_seqs=12, align=align, seqs=seqs)
    steps = decodes = 0
    while sch.has_unfinished():
        before = sch.prefill_tokens
        out = sch.schedule()
        pairs = list(zip(out.rows, out.counts))
        assert out.batch == [s for s, n in pairs if s.completes(n)]
        assert out.decode == (bool(pairs) and all(n == 1 and s.completes(1) for s, n in pairs))
        want = sum(max(0, min(s.num_cached + n, s.prefill_end) - s.num_cached) for s, n in pairs)
        assert sch.prefill_tokens - before == want
        _run(sch, out)
        for s in sch.running:
            if s.status is Status.RUNNING and s.block_table:
                assert s.num_registered == s.num_cached // BS
        steps += 1
        decodes += out.decode
        assert steps < 10_000
    assert decodes > 0 and sch.preemptions > 0 and sch.hit_tokens > 0
    assert sch.pool.num_used == 0


def test_admit_false_holds_arrivals_while_the_running_rows_decode():
    """``schedule(admit=False)`` (a decode step of the running rows already launched ahead): the
    running rows are scheduled and a waiting request is admitted only by the next schedule, or
    at once when no running row has work."""
    a, b = _seq(1, 5), _seq(2, 3)
    sch = _sched(seqs=[a])
    _run(sch, sch.schedule())
    sch.add(b)
    out = sch.schedule(admit=False)
    assert out.rows == [a] and out.decode and list(sch.waiting) == [b]
    _run(sch, out)
    out = sch.schedule()
    assert out.rows == [a, b] and not sch.waiting
    c = _seq(3, 3)
    assert _sched(seqs=[c]).schedule(admit=False).rows == [c]  # nothing running: admitted anyway
