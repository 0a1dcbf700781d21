"""CUDA-graph decode: the step plan (buckets, padding, tiles) on CPU; graphs == eager on CUDA."""

from __future__ import annotations

import os
import random

import pytest
import torch

from deepinfer.config import ModelConfig
from deepinfer.cuda_graphs import Tile, batch_buckets, bucket_for, kv_bucket, plan_step, tile_size
from deepinfer.kernels.decode_attention import ATTN_CHUNK
from deepinfer.model_runner import MIXED_TOKENS, ModelRunner
from deepinfer.models.llama import LlamaModel
from deepinfer.sampling_params import SamplingParams
from deepinfer.sequence import Sequence

from .conftest import TINY_VARIANTS, give_blocks, tiny_hf_model

# -- the plan: plain Python ------------------------------------------------------------------

BUCKETS = [
    (1, [1]),
    (3, [1, 2, 3]),
    (8, [1, 2, 4, 8]),
    (16, [1, 2, 4, 8, 16]),
    (40, [1, 2, 4, 8, 16, 32, 40]),
    (64, [1, 2, 4, 8, 16, 32, 48, 64]),
]


@pytest.mark.parametrize(("num_slots", "expected"), BUCKETS)
def test_batch_buckets(num_slots, expected):
    assert batch_buckets(num_slots) == expected


@pytest.mark.parametrize(("n", "bucket"), [(1, 1), (3, 4), (8, 8), (9, 16), (33, 48), (64, 64)])
def test_bucket_for(n, bucket):
    assert bucket_for(n, batch_buckets(64)) == bucket


def test_bucket_for_too_large():
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_for(65, batch_buckets(64))


@pytest.mark.parametrize(
    ("need", "max_len", "unit", "expected"),
    [
        (1, 4096, 1, 256),
        (256, 4096, 1, 256),
        (257, 4096, 1, 512),
        (3000, 4096, 1, 4096),
        (200, 240, 1, 240),
        (257, 1000, 1, 512),
        (600, 1000, 1, 1000),
        (300, 768, 256, 512),
        (600, 768, 256, 768),
    ],
)
def test_kv_bucket(need, max_len, unit, expected):
    assert kv_bucket(need, max_len, unit=unit, floor=256) == expected


def test_kv_bucket_too_long():
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        kv_bucket(300, 256)


def test_plan_pads_to_bucket_through_block_tables():
    # 3 rows in a bucket of 4; blocks of 4 positions; kv bucket 256 -> tables 64 wide
    tables = [[5, 9], [3], [8, 2, 7]]
    plan = plan_step(tables, [[50], [10], [20]], [6, 0, 9], block_size=4, max_len=1024, rows=4)
    assert plan.tiles == [Tile(4, 256)]
    x = plan.inputs
    tok, pos, slot, tab = x[:4], x[4:8], x[8:12], x[12:].reshape(4, 64)
    assert tok.tolist() == [50, 10, 20, 0] and pos.tolist() == [6, 0, 9, 0]
    # the padding row writes the null block, at its slot 3 (spread: null_slots)
    assert slot.tolist() == [9 * 4 + 2, 3 * 4 + 0, 7 * 4 + 1, 3]
    assert tab[0, :3].tolist() == [5, 9, 0] and tab[2, :3].tolist() == [8, 2, 7] and not tab[3].any()


def test_plan_verify_positions_past_the_blocks_go_to_the_null_block():
    plan = plan_step([[5, 9]], [[1, 2, 3]], [6], block_size=4, max_len=64, positions=5, rows=1)
    assert plan.tiles == [Tile(1, 64, 5)]
    x = plan.inputs
    assert x[:5].tolist() == [1, 2, 3, 0, 0] and x[5:10].tolist() == [6, 7, 8, 9, 10]
    assert x[10:15].tolist() == [38, 39, 2, 3, 0]  # positions 8.. have no block: null block slots 2, 3, 0


def test_plan_fixed_tiles():
    # tiles of 4 rows: 5 sequences -> 2 tiles; kv in whole 256-key chunks per tile
    tables = [[1]] * 4 + [[2] * 150]
    plan = plan_step(tables, [[7]] * 5, [0, 1, 2, 3, 590], block_size=4, max_len=1024, tile=4)
    assert plan.tiles == [Tile(4, 256), Tile(4, 1024)]
    assert len(plan.inputs) == tile_size(plan.tiles[0], 4) + tile_size(plan.tiles[1], 4)


def _plan_reference(tables, tokens, starts, *, block_size, max_len, positions=1, rows=None, tile=None,
                    more=(), kv_len=None):  # fmt: skip
    """plan_step's layout, one row and one position at a time (plain Python)."""
    B, P, bs = len(tables), positions, block_size
    groups = [(0, rows or B)] if tile is None else [(t0, tile) for t0 in range(0, B, tile)]
    unit = 1 if tile is None else ATTN_CHUNK
    tiles, out = [], []
    for t0, R in groups:
        real = range(t0, min(t0 + R, B))
        kv = kv_len or kv_bucket(
            max(starts[i] for i in real) + P, max_len, unit=unit, floor=256 if tile is None else unit
        )
        W = -(-kv // bs)
        tok, pos, lay = [], [], []
        for r in range(R):
            i = t0 + r
            for t in range(P):
                tok.append(tokens[i][t] if i in real and t < len(tokens[i]) else 0)
                pos.append((starts[i] if i in real else 0) + t)
        for group in (tables, *more):
            slots, tabs = [], []
            for r in range(R):
                i = t0 + r
                row = (group[i] if i in real else [])[:W]
                tabs += row + [0] * (W - len(row))
                for t, p in enumerate(pos[r * P : (r + 1) * P]):  # no block: the null block 0, spread
                    slots.append(row[p // bs] * bs + p % bs if p // bs < len(row) else (r * P + t) % bs)
            lay += slots + tabs
        tiles.append(Tile(R, kv, P))
        out += tok + pos + lay
    return tiles, out


def test_plan_matches_the_reference_on_random_steps():
    """Decode and verify steps (1 to 5 positions a row), in one bucketed tile or fixed tiles, with
    a second KV-cache group, tables shorter or longer than the tile's width, block sizes 1 to 16."""
    rng = random.Random(0)
    for _ in range(300):
        B, P, bs = rng.randint(1, 12), rng.choice([1, 1, 2, 5]), rng.choice([1, 4, 16])
        max_len = rng.choice([64, 256, 1024])
        starts = [rng.randint(0, max_len - P) for _ in range(B)]

        def table(p, P=P, bs=bs):  # a block more or fewer than positions p.. need, never empty
            return [rng.randint(1, 99) for _ in range(max(1, -(-(p + P) // bs) + rng.randint(-2, 1)))]

        tables = [table(p) for p in starts]
        more = tuple([table(p) for p in starts] for _ in range(rng.randint(0, 1)))
        tokens = [[rng.randint(1, 99) for _ in range(rng.randint(1, P))] for _ in range(B)]
        kw = dict(block_size=bs, max_len=max_len, positions=P, more=more)
        kind = rng.choice(["bucket", "tiles", "width"])
        if kind == "tiles":
            kw.update(tile=rng.choice([2, 4]), max_len=1024)
        else:
            kw["rows"] = B + rng.randint(0, 3)
            if kind == "width":
                kw["kv_len"] = max_len
        plan = plan_step(tables, tokens, starts, **kw)
        tiles, inputs = _plan_reference(tables, tokens, starts, **kw)
        assert plan.tiles == tiles and plan.inputs.tolist() == inputs, kw


# -- the fixed-shape decode, run eagerly (what a graph replays) vs the ordinary forward --------


def _greedy(runner, prompts, n, max_rows, seed=0):
    """Prefill then n greedy decode steps: (tokens per sequence, logits of each step on CPU)."""
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=4096) for i, p in enumerate(prompts)]
    give_blocks(runner, seqs, 320, block_size=16, max_rows=max_rows, seed=seed)
    logits, steps = runner.step(seqs, [len(s) for s in seqs]), []
    for _ in range(n):
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.output_token_ids.append(t)
        logits = runner.step(seqs, [1] * len(seqs))
        steps.append(logits.cpu())
    return [s.output_token_ids for s in seqs], steps


def _model(variant, device, dtype=torch.float32):
    hf, d = tiny_hf_model(variant)
    # max_len 320 > 256: decode crosses from the 256-key bucket to the 320-key (whole cache) one
    return LlamaModel(ModelConfig.from_hf(d), dict(hf.state_dict()), dtype=dtype, device=device, max_len=320)


def _prompts(batch):
    lengths = [248, 5, 17, 1, 60, 33, 2, 11][:batch]  # ragged; the first crosses 256 keys
    return [[(7 * i + 13 * j) % 3000 + 1 for j in range(n)] for i, n in enumerate(lengths)]


CASES = [(1, 1), (3, 8), (8, 8)]  # (batch, most rows)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_static_decode_equals_forward_on_cpu(variant):
    model = _model(variant, "cpu")
    for batch, rows in CASES:
        ref_tokens, ref = _greedy(ModelRunner(model), _prompts(batch), 12, rows)
        static = ModelRunner(model)
        static.static_decode = True
        tokens, got = _greedy(static, _prompts(batch), 12, rows, seed=1)
        assert tokens == ref_tokens
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_split_static_decode_equals_forward_on_cpu():
    """decode_static(attention="split") under TRITON_INTERPRET=1 (the paged kernel, a 248-key row's
    runs merged) against the eager forward (torch attention): the same greedy tokens, close logits."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernel on the CPU: needs TRITON_INTERPRET=1")
    model = _model("llama-gqa-untied", "cpu")
    ref_tokens, ref = _greedy(ModelRunner(model), _prompts(2), 3, 2)
    split = ModelRunner(model, attention="split")
    split.static_decode = True
    tokens, got = _greedy(split, _prompts(2), 3, 2, seed=1)
    assert tokens == ref_tokens
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def _mixed_steps(runner, mixed: bool):
    """One sequence prefilled, then a step where it decodes while a second prompt joins whole and
    a third feeds its first 5 tokens (no logits), then a step of all three: the logits of both
    steps. ``mixed``: the steps with prompt chunks go through ``_mixed_static`` (each prompt token
    a decode row), as CUDA graphs run them; else through ``step`` (the eager forward)."""
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = _prompts(8)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=4096)
            for i, p in enumerate([prompts[4], prompts[2], prompts[7]])]  # fmt: skip
    give_blocks(runner, seqs, 320, block_size=16, max_rows=64)

    def step(rows, counts):
        if not mixed:
            return runner.step(rows, counts)
        logits = runner._mixed_static(rows, counts)
        for s, n in zip(rows, counts):
            s.num_cached += n
        return logits

    first = runner.step(seqs[:1], [len(seqs[0])])
    seqs[0].output_token_ids.append(int(first.argmax(-1)[0]))
    out = [step(seqs, [1, len(seqs[1]), 5])]
    for s, t in zip(seqs[:2], out[0].argmax(-1).tolist()):
        s.output_token_ids.append(t)
    out.append(step(seqs, [1, 1, len(seqs[2]) - 5]))
    return [x.cpu() for x in out]


def test_mixed_step_as_decode_rows_equals_forward_on_cpu():
    """A step with prompt chunks laid out as decode rows (a token each, what the decode graphs
    replay for a short prompt joining the batch) gives the eager forward's logits."""
    model = _model("llama-gqa-untied", "cpu")
    ref = _mixed_steps(ModelRunner(model), mixed=False)
    static = ModelRunner(model)
    static.static_decode = True
    got = _mixed_steps(static, mixed=True)
    assert [x.shape[0] for x in got] == [2, 3]  # the third row samples only once its prompt is in
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_mixed_buckets_take_several_arrivals_in_few_graphs():
    """Where mixed steps replay the decode graphs, the graphs above max_rows hold 16, 32, 64, ...
    up to MIXED_TOKENS prompt tokens: a step where four 45-token prompts join 32 decodes (a
    server's arrivals between two steps) fits a graph, padded by less than 2x."""
    runner = ModelRunner(_model("llama-gqa-untied", "cpu"))
    runner.max_rows, runner.cuda_graphs = 32, True  # as on CUDA (graphs are not captured here)
    assert runner.graph_rows == 32 + MIXED_TOKENS == 288
    buckets = runner.buckets()
    assert buckets == [1, 2, 4, 8, 16, 32, 48, 64, 96, 160, 288]
    sp = SamplingParams(temperature=0, max_tokens=4)
    rows = [Sequence(i, None, [1] * (45 if i >= 32 else 3), sp, seed=0, eos_token_ids=(), max_len=4096)
            for i in range(36)]  # fmt: skip
    counts = [1] * 32 + [45] * 4
    for s in rows[:32]:
        s.num_cached = 3
        s.output_token_ids.append(5)
    assert runner._mixed_fits(rows, counts)
    assert bucket_for(sum(counts), buckets) == 288 < 2 * sum(counts)
    runner.deterministic = True  # deterministic mode keeps its own tiles: no mixed graphs
    assert not runner._mixed_fits(rows, counts) and runner.buckets() == batch_buckets(32)


# -- CUDA graphs ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "triton", "split"])
@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_graphs_equal_eager_on_cuda(variant, attention):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _model(variant, "cuda")
    for batch, rows in CASES:
        ref_tokens, ref = _greedy(ModelRunner(model, cuda_graphs=False), _prompts(batch), 32, rows)
        graphed = ModelRunner(model, cuda_graphs=True, attention=attention)
        tokens, got = _greedy(graphed, _prompts(batch), 32, rows, seed=1)
        assert tokens == ref_tokens, (variant, batch)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        # decode: the 256- and the 320-key bucket (the prompts replay a mixed-step graph above)
        assert len([t for t in graphed.graphs.graphs if t.rows <= graphed.max_rows]) == 2


@pytest.mark.gpu
def test_graph_decode_does_not_sync():
    """Once captured, a decode step queues work and returns: no host<->device synchronisation."""
    model = _model("llama-gqa-untied", "cuda", torch.bfloat16)
    runner = ModelRunner(model)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    seqs = [Sequence(i, None, [1, 2, 3 + i], sp, seed=0, eos_token_ids=(), max_len=4096) for i in range(3)]
    give_blocks(runner, seqs, max_rows=4)
    runner.step(seqs, [3, 3, 3])
    for s in seqs:
        s.output_token_ids.append(5)
    runner.step(seqs, [1, 1, 1])  # captures
    torch.cuda.synchronize()
    for s in seqs:
        s.output_token_ids.append(6)
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.step(seqs, [1, 1, 1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (3, model.config.vocab_size) and torch.isfinite(logits).all()


def test_verify_forward_reads_a_rows_keys_once_for_all_its_positions():
    """Where decode runs the paged Triton attention, the fixed-shape verify forward (what the CUDA
    graphs replay) runs the query-tiled kernel: one tile a row for its T positions, so each key
    block is read once a row (the per-position kernel reads a row's keys T times, the cost that
    grew with the width at a large batch). Under TRITON_INTERPRET=1: only that kernel runs, and
    the logits are the eager forward's (torch attention) on every real row and position."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernel on the CPU: needs TRITON_INTERPRET=1")
    from deepinfer.models import llama

    model = _model("llama-gqa-untied", "cpu")
    runner = ModelRunner(model, attention="triton")
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=4096)
            for i, p in enumerate(_prompts(3))]  # fmt: skip
    give_blocks(runner, seqs, 272, block_size=16, max_rows=4)
    runner.step(seqs, [len(s) for s in seqs])
    for s in seqs:
        s.output_token_ids.append(11)  # sampled, not cached yet
    drafts = [[5, 6], [], [7, 8]]  # the 248-token row's keys cross several 64-key blocks
    eager = runner.verify_eager(seqs, drafts, 3)  # CPU: torch's attention
    calls = {"prefill": 0, "per-position": 0}
    tiled, per_position = llama.paged_prefill_triton, llama.paged_attention_triton

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)

        return wrapped

    llama.paged_prefill_triton = count("prefill", tiled)
    llama.paged_attention_triton = count("per-position", per_position)
    try:
        fixed = runner.verify_static(seqs, drafts, 3)
    finally:
        llama.paged_prefill_triton, llama.paged_attention_triton = tiled, per_position
    assert calls == {"prefill": model.config.num_layers, "per-position": 0}
    for b, d in enumerate(drafts):  # the real positions (a row's padding positions are garbage)
        torch.testing.assert_close(fixed[b, : len(d) + 1], eager[b, : len(d) + 1], atol=1e-4, rtol=0)


def test_warm_up_timing_writes_only_the_null_block_spread_over_its_slots():
    """StepGraphs.time (the warm-up timing that seeds DSpark's cost model) runs every row as
    padding: all K/V writes go to the null block, to its slots in turn (not all onto slot 0),
    and no other block is touched."""
    from deepinfer.cuda_graphs import StepGraphs

    model = _model("llama-gqa-untied", "cpu")
    cache = model.new_cache(4, 16)
    mark = 1234.5  # (finite: the padding rows attend over the null block)
    for t in (cache.k, cache.v):
        t.fill_(mark)
    graphs = StepGraphs(model, cache, max_rows=4, capture=False)
    graphs.time(Tile(4, 64, 3), reps=1)  # 4 rows x 3 positions: 12 writes a layer
    for t in (cache.k, cache.v):
        written = (t != mark).flatten(3).any(-1)  # [layers, blocks, slots]
        assert written[:, 0, :12].all()  # null block slots 0..11, one write each
        assert not written[:, 0, 12:].any() and not written[:, 1:].any()
