"""The paged KV cache seen from the LLM on the tiny random-weight model (CPU, float32): prefix
caching, chunked prefill and preemption leave every output as it is without them; deterministic
mode stays bit-identical with a prefix hit; requests the pool cannot hold fail alone; aborts and
DSpark's rejected drafts give their blocks back."""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.model_runner import DETERMINISTIC_CHUNK

BS = 16  # the default block size
SCHEMA = {  # (test_dspark.py's, smaller: forced spans for DSpark to draft)
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome", "Madrid"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
TINY_REGEX = r"(alpha|beta) forced text that is long enough, then [0-9]{3} and done"


def _llm(tiny_folder, **kw) -> LLM:
    kw.setdefault("dspark", False)
    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0, **kw)


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def _tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _drain(llm: LLM, peak: list[int] | None = None, limit: int = 5000) -> dict:
    """step() until nothing is left (an engine that stalls fails, not hangs); each request's
    final output, checked to come once. ``peak``: [most KV blocks held after a step]."""
    got = {}
    for _ in range(limit):
        if not llm.has_unfinished_requests():
            return got
        for o in llm.step():
            assert o.finished and o.request_id not in got, o.request_id
            got[o.request_id] = o
        if peak is not None:
            peak[0] = max(peak[0], llm.metrics()["kv_blocks_used"])
    raise AssertionError(f"not drained after {limit} steps: {llm.metrics()}")


def _run(llm: LLM, prompts, params, peak: list[int] | None = None) -> list:
    """generate() through add_request / step: the outputs in prompt order."""
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = _drain(llm, peak)
    assert sorted(got) == sorted(ids)  # every request exactly once
    return [got[i] for i in ids]


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 40000) for _ in range(n)]


# -- prefix caching --------------------------------------------------------------------------------
def test_prefix_caching_leaves_outputs_unchanged(tiny_folder, monkeypatch_session):
    """12 prompts sharing a 70-token prefix (4 full blocks), greedy and seeded sampling, and two
    made of one block repeated (a block's key names its whole prefix, not its own tokens only):
    the same tokens with and without prefix caching; with it, 11 of the 12 take the shared blocks
    from the cache (within the first step), and a second generate() hits on every prompt."""
    rng = random.Random(1)
    shared, block = _ids(rng, 70), _ids(rng, BS)
    prompts = [shared + _ids(rng, 3 + 2 * i) for i in range(12)] + [block * 4 + [5], block * 4 + [6, 7]]
    params = [
        SamplingParams(max_tokens=16, ignore_eos=True, **(dict(temperature=0) if i % 2 else
                       dict(temperature=0.8, seed=100 + i)))
        for i in range(len(prompts))
    ]  # fmt: skip
    off, on = _llm(tiny_folder, prefix_caching=False), _llm(tiny_folder, prefix_caching=True)
    want = _tokens(off, prompts, params)
    assert _tokens(on, prompts, params) == want
    m_off, m_on = off.metrics(), on.metrics()
    assert m_off["prefix_cache_hit_tokens"] == 0 and m_off["kv_blocks_cached"] == 0
    assert m_on["prompt_tokens"] == m_off["prompt_tokens"] == sum(map(len, prompts))
    shared_full = (70 // BS) * BS
    assert m_on["prefix_cache_hit_tokens"] == 11 * shared_full + 4 * BS  # (+ the repeated block's 4)
    assert m_off["prefill_tokens"] - m_on["prefill_tokens"] == m_on["prefix_cache_hit_tokens"]
    assert m_on["prefill_tokens"] + m_on["prefix_cache_hit_tokens"] == m_on["prompt_tokens"]
    # again, across generate() calls: each prompt's own full blocks are cached now
    assert _tokens(on, prompts, params) == want
    again = on.metrics()["prefix_cache_hit_tokens"] - m_on["prefix_cache_hit_tokens"]
    assert again == sum((len(p) - 1) // BS * BS for p in prompts) > m_on["prefix_cache_hit_tokens"]
    assert on.metrics()["kv_blocks_used"] == off.metrics()["kv_blocks_used"] == 0


def test_a_continuation_reuses_the_answers_computed_blocks_only(tiny_folder, monkeypatch_session):
    """A follow-up prompt = prompt + answer + more (a chat's next turn) hits the blocks the first
    request computed, answer included, but not the block holding the answer's last token, whose
    K/V was never computed (it was sampled, then the request ended)."""
    rng = random.Random(9)
    first = _ids(rng, 40)
    on, off = _llm(tiny_folder), _llm(tiny_folder, prefix_caching=False)
    answer = _tokens(on, [first], _greedy(24))[0]  # 40 + 24 = 64 positions: 4 full blocks
    follow = [first + answer + _ids(rng, 5), first + answer[:10] + _ids(rng, 30)]
    before = on.metrics()["prefix_cache_hit_tokens"]
    assert _tokens(on, follow, _greedy(8)) == _tokens(off, follow, _greedy(8))
    # each hits blocks 0-2: block 3 holds the answer's uncomputed last token / other tokens
    assert on.metrics()["prefix_cache_hit_tokens"] - before == 2 * 3 * BS


def _recording(llm: LLM) -> dict[tuple[int, int], torch.Tensor]:
    """Wrap the step's one sampling call: every row's logits by (seed, step)."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    inner = llm.sample_fn

    def sample_fn(logits, **kw):
        keys = zip(torch.as_tensor(kw["seed"]).tolist(), torch.as_tensor(kw["step"]).tolist())
        for row, key in zip(logits, keys):
            seen[key] = row.detach().cpu().clone()
        return inner(logits, **kw)

    llm.sample_fn = sample_fn
    return seen


def test_deterministic_logits_bit_identical_with_a_prefix_hit(tiny_folder, monkeypatch_session):
    """Deterministic mode: a 150-token prompt gets the same tokens and bit-identical logits at
    every step on a fresh engine and on one where an earlier request shared its first 130 tokens
    (a hit of 128 positions, a multiple of DETERMINISTIC_CHUNK: the chunks keep their shapes)."""
    rng = random.Random(2)
    target = _ids(rng, 150)
    sharer = target[:130] + _ids(rng, 20)
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    runs = []
    for warm in (False, True):
        llm = _llm(tiny_folder, deterministic=True)
        if warm:
            llm.generate([sharer], _greedy(4), use_tqdm=False)
        before = llm.metrics()["prefix_cache_hit_tokens"]
        seen = _recording(llm)
        tokens = _tokens(llm, [target], params)[0]
        runs.append((tokens, seen, llm.metrics()["prefix_cache_hit_tokens"] - before))
    (cold, cold_logits, cold_hits), (warm, warm_logits, warm_hits) = runs
    assert cold_hits == 0 and warm_hits == 128 and 128 % DETERMINISTIC_CHUNK == 0  # 8 blocks of 16
    assert warm == cold and len(cold) == 12
    assert warm_logits.keys() == cold_logits.keys() == {(5, i) for i in range(12)}
    for k in cold_logits:
        assert torch.equal(warm_logits[k], cold_logits[k]), k


def test_deterministic_hits_round_down_to_whole_chunks(tiny_folder, monkeypatch_session):
    """On the CPU a deterministic prefix hit is a whole number of DETERMINISTIC_CHUNK positions:
    a shared 120-token prefix (7 full blocks) is a hit of 64, the rest recomputed alike."""
    rng = random.Random(3)
    first = _ids(rng, 130)
    second = first[:120] + _ids(rng, 30)
    llm = _llm(tiny_folder, deterministic=True)
    plain = _llm(tiny_folder, deterministic=True, prefix_caching=False)
    want = _tokens(plain, [first, second], _greedy(6))
    assert _tokens(llm, [first], _greedy(6)) == want[:1]
    assert _tokens(llm, [second], _greedy(6)) == want[1:]
    assert llm.metrics()["prefix_cache_hit_tokens"] == DETERMINISTIC_CHUNK


# -- chunked prefill -------------------------------------------------------------------------------
def test_chunked_prefill_beside_decodes(tiny_folder, monkeypatch_session):
    """max_num_batched_tokens=16: prompts of 40-90 tokens are prefilled in chunks beside the
    decodes of short ones; every step stays in the budget and the outputs are those of one
    whole prefill each (greedy, float32)."""
    rng = random.Random(4)
    prompts = [_ids(rng, n) for n in (3, 5, 2)] + [_ids(rng, n) for n in (40, 65, 90, 57)] + [[1, 7]]
    params = [_greedy(n) for n in (20, 24, 18, 8, 6, 10, 7, 12)]
    want = _tokens(_llm(tiny_folder), prompts, params)
    llm = _llm(tiny_folder, max_num_batched_tokens=16)
    steps = []  # per step: (decode rows, prefill rows, rows that end a prompt part-way, tokens)
    inner = llm.runner.step

    def step(rows, counts):
        decode = sum(n == 1 and s.num_cached + 1 == len(s) for s, n in zip(rows, counts))
        partial = sum(s.num_cached + n < len(s) for s, n in zip(rows, counts))
        steps.append((decode, len(rows) - decode, partial, sum(counts)))
        return inner(rows, counts)

    llm.runner.step = step
    assert _tokens(llm, prompts, params) == want
    assert max(t for *_, t in steps) == 16
    assert any(d and p and part for d, p, part, _ in steps)  # decodes and an unfinished chunk, one step
    assert sum(part for _, _, part, _ in steps) >= sum(len(p) // 16 for p in prompts[3:7])
    assert llm.metrics()["prefill_tokens"] == sum(map(len, prompts))
    assert llm.metrics()["kv_blocks_used"] == 0


# -- preemption ------------------------------------------------------------------------------------
def _mixed_requests(n: int = 500):
    """n prompts of 1-60 tokens, a third of them sharing one of 5 prefixes; max_tokens 1-24."""
    rng = random.Random(5)
    shared = [_ids(rng, 52) for _ in range(5)]
    prompts, params = [], []
    for i in range(n):
        size = rng.randint(1, 60)
        if i % 3 == 0 and size > 8:
            prompts.append(shared[i % 5][: size - 8] + _ids(rng, 8))
        else:
            prompts.append(_ids(rng, size))
        params.append(_greedy(rng.randint(1, 24)))
    return prompts, params


@pytest.mark.parametrize("budget", [8192, 48], ids=["whole-prefill", "chunked"])
def test_small_pool_preempts_and_outputs_stay_the_same(tiny_folder, monkeypatch_session, budget):
    """500 mixed requests through 40 blocks of 16 (at most 64 running; prompts prefilled whole,
    or in steps of at most 48 tokens, so some are preempted mid-prompt): requests are preempted
    and recomputed, evicting cached blocks, yet each one finishes once with the tokens it gets
    from a pool that holds them all; the pool is empty afterwards."""
    prompts, params = _mixed_requests()
    big = _llm(tiny_folder, max_num_seqs=64)
    want = [o.token_ids for o in _run(big, prompts, params)]
    assert big.metrics()["preemptions"] == 0
    memory = big.model.block_bytes(BS) * 41
    llm = _llm(tiny_folder, max_num_seqs=64, kv_cache_memory=memory, max_num_batched_tokens=budget)
    assert llm.metrics()["kv_blocks_total"] == 40  # (41 blocks: one is the null block)
    mid_prompt = []  # preempted before its prompt was all computed
    preempt = llm.scheduler._preempt

    def spy(s):
        mid_prompt.append(s.num_cached < len(s.prompt_token_ids))
        preempt(s)

    llm.scheduler._preempt = spy
    peak = [0]
    outs = _run(llm, prompts, params, peak)
    assert all(o.finish_reason == "length" and o.error is None for o in outs)
    bad = [i for i, o in enumerate(outs) if o.token_ids != want[i]]
    assert not bad, [(i, len(prompts[i]), outs[i].token_ids, want[i]) for i in bad[:3]]
    m = llm.metrics()
    assert m["preemptions"] == len(mid_prompt) > 0 and m["evictions"] > 0 and peak == [40]
    chunked = budget < max(map(len, prompts))  # prompts longer than the budget: several steps
    assert any(mid_prompt) == chunked
    assert m["kv_blocks_used"] == 0 and m["running"] == m["waiting"] == 0
    assert 0 < m["kv_blocks_cached"] <= 40


# -- what the pool cannot hold ---------------------------------------------------------------------
def test_requests_the_pool_cannot_hold_fail_alone(tiny_folder, monkeypatch_session):
    """A pool of 8 blocks (128 positions): a longer prompt fails at once, a prompt whose output
    outgrows the pool fails when it does (keeping its tokens), a prompt past max_model_len fails
    with its own message; their neighbours finish as in a large pool."""
    big = _llm(tiny_folder)
    llm = _llm(tiny_folder, kv_cache_memory=big.model.block_bytes(BS) * 9)
    positions = llm.metrics()["kv_blocks_total"] * BS
    assert positions == 128 and llm.max_model_len == 256
    rng = random.Random(6)
    prompts = [_ids(rng, 5), _ids(rng, 130), _ids(rng, 7), _ids(rng, 100), _ids(rng, 300), _ids(rng, 20)]
    params = [_greedy(20), _greedy(4), _greedy(12), _greedy(100), _greedy(4), _greedy(9)]
    outs = _run(llm, prompts, params)
    want = _tokens(
        big, [p for i, p in enumerate(prompts) if i != 4], [sp for i, sp in enumerate(params) if i != 4]
    )
    too_long, grows, past_context = outs[1], outs[3], outs[4]
    assert too_long.finish_reason == "error" and "KV cache" in too_long.error and too_long.token_ids == []
    assert "130 KV positions" in too_long.error and "kv_cache_memory" in too_long.error
    assert grows.finish_reason == "error" and "KV cache" in grows.error and "129 KV positions" in grows.error
    # 100 prompt + 28 output tokens fill the 128 positions: the 29th token's K/V has no slot
    assert grows.token_ids == want[3][: positions + 1 - 100] and len(want[3]) == 100
    assert past_context.finish_reason == "error" and "context is 256" in past_context.error
    assert "KV cache" not in past_context.error
    for i in (0, 2, 5):
        assert outs[i].finish_reason == "length" and outs[i].error is None
        assert outs[i].token_ids == want[i - (i > 4)]
    assert llm.metrics()["kv_blocks_used"] == 0
    assert _tokens(llm, prompts[:1], params[0]) == want[:1]  # the engine goes on


# (prompt tokens, max_tokens, tokens it ends with, KV positions it fails for or None) in 128
# positions: a token's K/V is computed when the next one is sampled, so the last needs no slot
EXACT_FIT = [(127, 2, 2, None), (127, 3, 2, 129), (128, 1, 1, None), (128, 2, 1, 129), (129, 1, 0, 129)]


def test_requests_at_the_pools_edge(tiny_folder, monkeypatch_session):
    """Requests that fill the 128 positions exactly run; one position more fails, keeping the
    tokens generated (all in one batch: they preempt one another until each runs alone)."""
    big = _llm(tiny_folder)
    llm = _llm(tiny_folder, kv_cache_memory=big.model.block_bytes(BS) * 9)
    prompt = _ids(random.Random(10), 129)
    prompts = [prompt[:n] for n, *_ in EXACT_FIT]
    want = _tokens(big, prompts, _greedy(2))
    outs = _run(llm, prompts, [_greedy(m) for _, m, *_ in EXACT_FIT])
    for (n, m, kept, fails), o, w in zip(EXACT_FIT, outs, want):
        assert o.token_ids == w[:kept], (n, m)
        if fails is None:
            assert o.finish_reason == "length" and o.error is None, (n, m, o.error)
        else:
            assert o.finish_reason == "error" and f"needs {fails} KV positions" in o.error, (n, m, o.error)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(kv_cache_memory=1), "kv_cache_memory=1 holds 0 KV blocks"),
        (dict(kv_cache_memory="x"), "kv_cache_memory must be bytes"),
        (dict(kv_cache_memory=1.5), "fraction in"),
        (dict(kv_cache_memory=True), "kv_cache_memory must be bytes"),
        (dict(block_size=3), "block_size must be a power of two"),
        (dict(block_size=0), "block_size must be a power of two"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be >= 1"),
    ],
)
def test_bad_cache_settings_raise(tiny_folder, monkeypatch_session, kw, match):
    with pytest.raises(ValueError, match=match):
        _llm(tiny_folder, **kw)


# -- blocks given back -----------------------------------------------------------------------------
def test_abort_frees_the_requests_own_blocks_at_once(tiny_folder, monkeypatch_session):
    """Aborting a running request frees at once the blocks only it holds (a prefix it shares
    with a running neighbour stays held); after the rest drain no block is held, and the full
    blocks stay cached."""
    llm = _llm(tiny_folder)
    rng = random.Random(7)
    shared = _ids(rng, 48)  # 3 full blocks
    prompts = [shared + _ids(rng, 20), _ids(rng, 30), shared + _ids(rng, 25), _ids(rng, 9)]
    ids = [llm.add_request(p, _greedy(30)) for p in prompts]
    llm.step()
    llm.step()
    running = {s.request_id: s for s in llm.scheduler.running}
    assert list(running) == ids
    victim = running[ids[2]]
    table = list(victim.block_table)
    assert table[:3] == running[ids[0]].block_table[:3]  # the shared prefix: one copy
    used = llm.metrics()["kv_blocks_used"]
    llm.abort_request(ids[2])
    assert llm.metrics()["kv_blocks_used"] == used - (len(table) - 3)
    assert victim.block_table == []
    got = _drain(llm)
    assert sorted(got) == ids and got[ids[2]].finish_reason == "abort" and len(got[ids[2]].token_ids) == 2
    m = llm.metrics()
    assert m["kv_blocks_used"] == 0 and m["kv_blocks_cached"] > 0
    assert [got[i].token_ids for i in ids[:2] + ids[3:]] == _tokens(
        _llm(tiny_folder, prefix_caching=False), prompts[:2] + prompts[3:], _greedy(30)
    )


@pytest.mark.parametrize(
    ("dspark", "blocks"),
    [({"schedule": "fixed"}, None), ({"schedule": "fixed"}, 50)],
    ids=["fixed", "fixed-small-pool"],
)
def test_dspark_releases_rejected_draft_blocks(tiny_folder, monkeypatch_session, dspark, blocks):
    """DSpark verifies drafts in blocks reserved past each row's length (blocks of 4: drafts
    cross block edges; a pool of 50 blocks: rows are preempted between verify steps; the fixed
    schedule: every draft verified, whatever this machine's step times): the
    outputs equal plain decoding, after every step a row holds only the blocks of what is cached
    (the rejected drafts' blocks released), and none is held at the end."""
    prompts = [[1, 5, 9, 5, 9, 5, 9]] * 12 + [[1, 300, 301], [1, 42, 43, 44]]
    params = [
        SamplingParams(temperature=0.0 if i < 4 else 1.0, seed=i, max_tokens=40, regex=TINY_REGEX)
        if i % 3
        else SamplingParams(temperature=0.0 if i < 4 else 1.0, seed=i, max_tokens=40, json_schema=SCHEMA)
        for i in range(12)
    ] + [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, speculative=True), _greedy(10)]
    plain = _llm(tiny_folder)
    want = _tokens(plain, prompts, params)
    memory = None if blocks is None else plain.model.block_bytes(4) * (blocks + 1)
    llm = _llm(tiny_folder, dspark=dspark, block_size=4, kv_cache_memory=memory)
    held = []  # after each commit: (blocks held, blocks of the cached positions) per row
    inner = llm.scheduler.commit

    def commit(rows, ahead=False):
        inner(rows, ahead)
        held.extend((len(s.block_table), -(-s.num_cached // 4)) for s in rows if s.block_table)

    llm.scheduler.commit = commit
    assert _tokens(llm, prompts, params) == want
    st = llm.dspark.stats
    assert st.verify_steps > 0 and sum(st.accepted) > 0
    rejected = sum(n - a for (n, a), c in st.accept_hist.items() for _ in range(c) if a < n)
    assert rejected > 0 or blocks is None  # (the fixed schedule verifies every draft: some fail)
    assert held and all(h == need for h, need in held)
    m = llm.metrics()
    assert m["kv_blocks_used"] == 0 and (m["preemptions"] > 0) == (blocks is not None)


def test_progress_bar_reports_prefix_hits(tiny_folder, monkeypatch_session, capsys):
    """generate(use_tqdm=True) over 20 requests: the same outputs, and the bar shows the prefix
    cache's hit rate every 16 requests."""
    rng = random.Random(8)
    shared = _ids(rng, 40)
    prompts = [shared + _ids(rng, 1 + i % 5) for i in range(20)]
    llm = _llm(tiny_folder)
    want = _tokens(_llm(tiny_folder), prompts, _greedy(5))
    outs = llm.generate(prompts, _greedy(5), use_tqdm=True)
    assert [o.token_ids for o in outs] == want
    assert "prefix hits" in capsys.readouterr().err
