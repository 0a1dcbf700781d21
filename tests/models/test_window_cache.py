"""Sliding-window layers in the paged KV cache (docs/kv-cache.md, "Sliding windows"), through the
LLM on tiny random Gemma-3-style (one windowed layer, one global) and Mistral-style (every layer
windowed) checkpoints, CPU, float32, windows of 4 keys, blocks of 4 positions:

- window release: the windowed group gives back the blocks behind the window (and DSpark's
  rollback margin) while requests run, and outputs are those of a cache that keeps every block
  (ragged batches, long generations, prefix hits, DSpark verify steps rolled back), with the
  blocks held there never past ``Scheduler.window_bound`` a request;
- bounded replay: a preempted request, and a conversation continued on a cached prefix, resume at
  the largest block boundary whose window is still cached, with the outputs of a run without
  preemption or cache; when that window was evicted, a full recompute (``swa_full_recomputes``).
"""

from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.models.kv_cache import group_blocks, kv_groups, split_blocks

BS = 4
DSPARK = {"default": "all", "max_drafts": 3}  # every request speculates: verify steps roll back


def _llm(folder: str, **kw) -> LLM:
    kw.setdefault("dspark", DSPARK)
    return LLM(folder, dtype="float32", device="cpu", seed=0, block_size=BS, **kw)


def _keep_every_block(llm: LLM) -> LLM:
    """The cache as it was before window release: every block kept (the windowed layers read
    only their window of it)."""
    llm.scheduler._slide = lambda s: None
    return llm


def _windowed(llm: LLM) -> int:
    return next(g for g, w in enumerate(llm.scheduler.windows) if w)


def _run(llm: LLM, prompts, params, watch=None) -> list[list[int]]:
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {}
    for _ in range(5000):
        if not llm.has_unfinished_requests():
            break
        for o in llm.step():
            assert o.error is None, o.error
            got[o.request_id] = o.token_ids
        if watch is not None:
            watch(llm)
    return [got[i] for i in ids]


def _requests(seed: int, lengths, new: int):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 96) for _ in range(10)]  # a prefix of 2 full blocks: prefix hits
    prompts = [shared + [rng.randrange(3, 96) for _ in range(n)] for n in lengths]
    params = []
    for i in range(len(prompts)):  # greedy and seeded sampling in turn
        kind = {"temperature": 0} if i % 2 else {"seed": i}
        params.append(SamplingParams(max_tokens=new + 9 * i, ignore_eos=True, **kind))
    return prompts, params


def test_groups_and_their_pools():
    """Layers split into a full-attention and a sliding-window group only when both kinds are
    there; the budget buys blocks of both in equal numbers until the windowed pool has what it
    can use, the rest going to full attention."""
    assert kv_groups([0, 0, 0]) == [(0, [0, 1, 2])]  # Llama: one group, as before
    assert kv_groups([4, 4]) == [(4, [0, 1])]  # Mistral: one windowed group
    assert kv_groups([4, 8]) == [(8, [0, 1])]  # every layer windowed: the largest bounds them all
    assert kv_groups([4, 0, 4, 4, 0]) == [(0, [1, 4]), (4, [0, 2, 3])]  # Gemma: interleaved
    assert split_blocks(10 * (100 + 500), 100, 500, window_cap=50) == (10, 10)
    assert split_blocks(1000 * (100 + 500), 100, 500, window_cap=50) == ((600_000 - 50 * 500) // 100, 50)
    assert group_blocks(77, [1], [0], 8, 16, 256, 8192) == [77]
    with pytest.raises(ValueError, match="at least 2 of each"):
        group_blocks(1, [100, 500], [0, 1024], 8, 16, 4, 64)


@pytest.mark.parametrize("family", ["gemma3_text", "mistral"])
def test_window_release_keeps_outputs_and_bounds_blocks(family_folder, family):
    """5 ragged requests (13..53 prompt tokens sharing 2 blocks, 110..146 generated, greedy and
    seeded) with 4 running at once: the tokens of a cache that keeps every block; after every
    step each running request holds at most window_bound() blocks of the windowed group (that
    cache holds up to 50), and the group's pool no more than those."""
    folder = family_folder(family)[0]
    prompts, params = _requests(1, (3, 43, 15, 30, 8), 110)
    llm = _llm(folder, max_num_seqs=4)
    sch = llm.scheduler
    g = _windowed(llm)
    bound = sch.window_bound()
    assert bound == -(-(4 + 3) // BS) + 1 == 3  # window 4 + margin 3 (max_drafts), in blocks of 4
    seen = {"held": 0, "slid": 0}

    def watch(llm):
        for s in sch.running:
            held = sum(b != 0 for b in s.block_tables[g])
            assert held <= bound, (held, s.num_cached, s.block_tables[g])
            seen["held"], seen["slid"] = max(seen["held"], held), max(seen["slid"], s.num_slid)
        assert sch.pools[g].num_used <= bound * len(sch.running)

    got = _run(llm, prompts, params, watch)
    want_llm = _keep_every_block(_llm(folder, max_num_seqs=4))
    want = _run(want_llm, prompts, params)
    assert got == want
    assert seen["held"] == bound and seen["slid"] > 30  # blocks given back while running
    kept = sum(b != 0 for s in want_llm.scheduler.running for b in s.block_tables[g])
    assert kept == 0 and want_llm.scheduler.pools[g].num_cached > 50  # (that cache kept them)
    m = llm.metrics()
    assert m["prefix_cache_hit_tokens"] >= 8 * 4 and m["preemptions"] == 0
    st = llm.dspark.stats
    assert st.verify_steps > 0 and sum(st.rejected) > 0  # drafts written, then discarded
    assert sch.pools[g].num_used == 0 and all(p.num_used == 0 for p in sch.pools)


def test_window_release_in_deterministic_mode(family_folder):
    """Deterministic mode on the CPU (fixed decode tiles, per-row attention, chunk-aligned prefix
    hits) through the fixed-shape step with a block table per group: the same tokens as a cache
    that keeps every block."""
    folder = family_folder("gemma3_text")[0]
    prompts, params = _requests(2, (70, 5, 9), 60)
    got = _run(_llm(folder, deterministic=True), prompts, params)
    assert got == _run(_keep_every_block(_llm(folder, deterministic=True)), prompts, params)


def test_window_release_under_async_scheduling(family_folder):
    """Async scheduling (docs/async-scheduling.md) in deterministic mode: each decode step
    launches the next before its tokens are read, the block of each row's next position kept
    past ``commit``, while the windowed group gives back the blocks behind the window: the
    tokens of the engine without it, and no request ever holds more than window_bound()."""
    folder = family_folder("gemma3_text")[0]
    prompts, params = _requests(3, (3, 43, 15, 30, 8), 80)
    llm = _llm(folder, deterministic=True, max_num_seqs=4, dspark=False, async_scheduling=True)
    sch, g = llm.scheduler, _windowed(llm)
    bound = sch.window_bound()

    def watch(llm):
        for s in sch.running:
            assert sum(b != 0 for b in s.block_tables[g]) <= bound

    got = _run(llm, prompts, params, watch)
    want = _run(_llm(folder, deterministic=True, max_num_seqs=4, dspark=False), prompts, params)
    assert got == want
    assert llm.metrics()["decode_steps_ahead_taken"] > 100
    assert all(p.num_used == 0 for p in sch.pools)


def test_preempted_requests_replay_from_their_window(family_folder):
    """6 requests through a pool of 40 blocks a group: they preempt one another, and resume at the
    last block boundary whose window is cached (swa_replays), with the tokens of a pool that holds
    them all. A request whose blocks stayed cached recomputes at most window + margin + a block."""
    folder = family_folder("gemma3_text")[0]
    prompts, params = _requests(3, (20, 3, 35, 9, 27, 14), 70)
    want = _run(_llm(folder), prompts, params)
    small = _llm(folder)
    memory = small.model.block_bytes(BS) * 41
    llm = _llm(folder, kv_cache_memory=memory)
    sch = llm.scheduler
    assert [p.capacity for p in sch.pools] == [40, 40]
    replays, match = [], sch._match_windowed

    def spy(s, keys):
        match(s, keys)
        if sch._swa_hit and sch._swa_hit[0]:
            replays.append(sch._swa_hit[1])

    sch._match_windowed = spy
    assert _run(llm, prompts, params) == want
    m = llm.metrics()
    assert m["preemptions"] > 0 and m["swa_replays"] > 0 and m["swa_replay_tokens"] <= sum(replays)
    assert min(replays) <= 4 + 3 + BS


@pytest.mark.parametrize("family", ["gemma3_text", "mistral"])
def test_continued_conversation_replays_or_falls_back(family_folder, family):
    """A conversation continued on the engine that ran its first turn takes the cached prefix up
    to the last block boundary whose window is cached (one replay, a few tokens recomputed); the
    next turn (Gemma: full-attention blocks still cached), after the windowed group's cached
    blocks were evicted, recomputes everything (swa_full_recomputes). Both give the tokens of a
    fresh engine."""
    folder = family_folder(family)[0]
    rng = random.Random(4)
    first = [rng.randrange(3, 96) for _ in range(30)]
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = _llm(folder)
    out = _run(llm, [first], [greedy])[0]
    second = first + out + [rng.randrange(3, 96) for _ in range(6)]
    got = _run(llm, [second], [greedy])[0]
    assert got == _run(_llm(folder), [second], [greedy])[0]
    m = llm.metrics()
    assert m["swa_replays"] == 1 and m["swa_full_recomputes"] == 0
    assert m["prefix_cache_hit_tokens"] >= len(first) + len(out) - BS
    assert m["swa_replay_tokens"] == len(second) - m["prefix_cache_hit_tokens"] <= 4 + 3 + BS + 6

    if family == "mistral":  # (no full-attention group: a cache without the window is a plain miss)
        return
    third = second + got + [rng.randrange(3, 96) for _ in range(5)]
    pool = llm.scheduler.pools[_windowed(llm)]
    pool.free(pool.allocate(pool.num_free))  # memory pressure: every cached windowed block evicted
    hits = m["prefix_cache_hit_tokens"]
    assert _run(llm, [third], [greedy])[0] == _run(_llm(folder), [third], [greedy])[0]
    m = llm.metrics()
    assert m["swa_full_recomputes"] == 1 and m["swa_replays"] == 1
    assert m["prefix_cache_hit_tokens"] == hits  # nothing taken: every token recomputed


def test_bench_swa_smoke(capsys):
    """benchmarks/bench_swa.py at a tiny shape on the CPU: both tables print, the windowed group
    holds fewer blocks with release, and the replay recomputes fewer tokens than the full
    recompute (the script asserts a replay and a fallback happened)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_swa

    bench_swa.main(["--smoke"])
    out = capsys.readouterr().out
    release = next(line for line in out.splitlines() if line.startswith("| window release"))
    assert "1 global: 32, 1 windowed: 13 " in release  # a prefill chunk of 128 + the window of 64 + 8
    assert "1 global: 32, 1 windowed: 5 " in release  # while decoding: ceil((64 + 8) / 16) + 1 at most
    assert "1 global: 32, 1 windowed: 32 " in next(line for line in out.splitlines() if "every block" in line)
    replay = next(line for line in out.splitlines() if line.startswith("| replay"))
    assert int(replay.split("|")[2]) <= 64 + 8 + 16


@pytest.mark.gpu
def test_window_release_on_cuda_graphs(family_folder):
    """On CUDA: decode replayed as CUDA graphs with a static block table per group, prefill
    through the query-tiled kernel, DSpark's verify graphs: the tokens of a cache that keeps every
    block."""
    folder = family_folder("gemma3_text")[0]
    prompts, params = _requests(5, (3, 43, 15, 30, 8), 150)

    def make():
        return LLM(
            folder, dtype="float32", device="cuda", seed=0, block_size=BS, max_num_seqs=4, dspark=DSPARK
        )

    llm = make()
    got = _run(llm, prompts, params)
    assert got == _run(_keep_every_block(make()), prompts, params)
    assert llm.runner.graphs.groups == 2 and llm.dspark.stats.verify_steps > 0


@pytest.fixture(scope="module")
def gemma_model(family_folder):
    return _llm(family_folder("gemma3_text")[0]).model


@pytest.mark.parametrize("attention", ["torch", "sdpa", "rows"])
def test_released_blocks_are_never_read(gemma_model, attention):
    """The model alone (Gemma-3-style): a 30-token sequence prefilled, then its windowed table's
    entries behind the window pointed at the null block and those blocks filled with NaN. The
    next token's logits, by the eager forward and by the fixed-shape decode (one block table per
    group), are the bits of the tables that keep every block."""
    import torch

    from deepinfer.models.llama import ForwardBatch

    model = gemma_model
    assert [w for w, _ in model.kv_groups] == [0, 4]
    cache = model.new_cache([12, 12], BS)
    tokens = [(7 * i) % 90 + 3 for i in range(31)]
    table = list(range(1, 9))  # 8 blocks: positions 0..31, in both groups

    def to(x):
        return torch.tensor(x, dtype=torch.int64)

    model.forward(ForwardBatch.of_chunks(to, [table], [0], [tokens[:30]], BS, more=[[table]]), cache)
    released = [0] * 6 + table[6:]  # keys 24..29 are the window (and more) of position 30
    for layer in model.kv_groups[1][1]:
        cache.k[layer][1:7] = float("nan")
        cache.v[layer][1:7] = float("nan")

    def step(windowed: list[int]) -> torch.Tensor:
        if attention == "torch":
            batch = ForwardBatch.of_chunks(to, [table], [30], [tokens[30:]], BS, more=[[windowed]])
            return model.forward(batch, cache)
        slot = to([table[7] * BS + 30 % BS])
        tabs = [to([t]).to(torch.int32) for t in (table, windowed)]
        return model.decode_static(to([tokens[30]]), to([30]), slot, tabs[0], cache, kv_len=32,
                                   attention=attention, more=[(slot, tabs[1])])  # fmt: skip

    got = step(released)
    assert not got.isnan().any()
    for layer in model.kv_groups[1][1]:  # the bits every block would have held
        cache.k[layer][1:7] = 0.0
        cache.v[layer][1:7] = 0.0
    model.forward(ForwardBatch.of_chunks(to, [table], [0], [tokens[:30]], BS, more=[[table]]), cache)
    assert torch.equal(got, step(table))
