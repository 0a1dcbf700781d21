"""Data-parallel replicas behind one router: every request answered once (as one engine answers
it), prefix hits sent to the replica caching the prefix, and a killed replica's requests re-run
elsewhere."""

from __future__ import annotations

import os
import signal

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.parallel.replicas import Replicas
from deepinfer.parallel.router import Router

KW = dict(dtype="float32", device="cpu", kv_cache_memory=1 << 20, max_num_seqs=8, block_size=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def dp(parallel_folder):
    llm = LLM(parallel_folder("llama"), data_parallel_size=2, **KW)
    yield llm
    llm.close()


def test_router_costs_queued_tokens_and_cached_prefix():
    r = Router(2, block_size=4)
    long_ = list(range(10, 26))  # 4 blocks
    assert r.choose(long_) == 0  # a tie: the lowest index
    r.assign(0, long_, len(long_) + 4)
    assert r.choose([1, 2, 3, 4]) == 1  # replica 0 has 20 tokens queued
    r.assign(1, [1, 2, 3, 4], 8)
    # the same 16-token prefix: replica 0 computes 2 tokens (queue 20), replica 1 all 18 (queue 8)
    assert r.choose(long_ + [7, 8]) == 0
    r.finish(0, 20)
    r.report(0, free_blocks=0, total_blocks=8)  # replica 0 full: its cache does not help now
    assert r.choose(long_ + [7, 8]) == 1
    r.drop(1)
    assert r.choose([5]) == 0


def test_every_request_once_as_one_engine(dp, parallel_folder):
    assert isinstance(dp, Replicas)
    prompts = [[3 + i, 4 + i, 5 + i, 6, 7] for i in range(6)]
    one = LLM(parallel_folder("llama"), **KW).generate(prompts, GREEDY, use_tqdm=False)
    got = dp.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in one]
    assert sum(m > 0 for m in [dp.replica_metrics(i)["prompt_tokens"] for i in (0, 1)]) == 2  # both worked


def test_prefix_hits_go_to_their_cache(dp):
    p, q = list(range(30, 46)), list(range(50, 66))  # two 16-token prefixes (4 blocks each)
    dp.generate([p + [1], q + [1]], GREEDY, use_tqdm=False)  # spread by load: one replica caches p, one q
    hits = [dp.replica_metrics(i)["prefix_cache_hit_tokens"] for i in (0, 1)]
    rids = [dp.add_request(x + [7 + i, 8, 9], GREEDY) for i, x in enumerate((p, q, p, q))]
    owners = [dp.owner(r) for r in rids]
    assert owners[0] == owners[2] != owners[1] == owners[3]
    while dp.has_unfinished_requests():
        dp.step()
    for i in (0, 1):  # each replica found its prefix cached twice: 16 tokens a request
        assert dp.replica_metrics(i)["prefix_cache_hit_tokens"] - hits[i] == 32


def test_killed_replica_requests_rerun_elsewhere(dp):
    prompts = [[3 + i, 9, 4 + i, 5] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)  # still running at the kill
    rids = [dp.add_request(x, params) for x in prompts]
    victim = dp.owner(rids[0])
    outs = {}
    for o in dp.step(timeout=2.0):
        outs[o.request_id] = o
    os.kill(dp._procs[victim].pid, signal.SIGKILL)
    while dp.has_unfinished_requests():
        for o in dp.step():
            assert o.request_id not in outs  # exactly once
            outs[o.request_id] = o
    assert sorted(outs) == sorted(rids)
    assert all(len(o.token_ids) == 120 and o.finish_reason == "length" for o in outs.values())
    m = dp.metrics()
    assert m["replicas"] == 1 and m["requeued"] >= 1
