"""CUDA-graph decode: the step plan (buckets, padding, tiles) on CPU; graphs == eager on CUDA."""

from __future__ import annotations

import pytest
import torch

from deepinfer.config import ModelConfig
from deepinfer.cuda_graphs import Tile, batch_buckets, bucket_for, kv_bucket, plan_decode
from deepinfer.model_runner import ModelRunner
from deepinfer.models.llama import LlamaModel
from deepinfer.sampling_params import SamplingParams
from deepinfer.scheduler import compaction_moves
from deepinfer.sequence import Sequence

from .conftest import TINY_VARIANTS, tiny_hf_model

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


def test_plan_pads_to_bucket_slot_major():
    # slots 5, 0, 2 decoded (call order), 8 slots: rows = slots 0..7 (bucket 8 > max slot 5)
    plan = plan_decode([5, 0, 2], [50, 10, 20], [7, 300, 3], num_slots=8, scratch_slot=8, max_len=1024)
    assert plan.tiles == [Tile(0, 8, 512)]
    tok, pos, write = plan.inputs[:8], plan.inputs[8:16], plan.inputs[16:]
    assert tok == [10, 0, 20, 0, 0, 50, 0, 0]
    assert pos == [300, 0, 3, 0, 0, 7, 0, 0]
    assert write == [0, 8, 2, 8, 8, 5, 8, 8]  # padding rows write the scratch slot
    assert plan.order == [5, 0, 2]


def test_plan_fixed_tiles():
    # tiles of 4 slots: slots 1 and 9 -> tiles [0, 4) and [8, 12); kv in whole 256-key chunks
    plan = plan_decode([9, 1], [90, 10], [600, 4], num_slots=10, scratch_slot=12, max_len=1024, tile=4)
    assert plan.tiles == [Tile(0, 4, 256), Tile(8, 4, 1024)]
    assert plan.inputs[:12] == [0, 10, 0, 0] + [0, 4, 0, 0] + [12, 1, 12, 12]
    assert plan.inputs[12:] == [0, 90, 0, 0] + [0, 600, 0, 0] + [12, 9, 12, 12]
    assert plan.order == [5, 1]


def test_plan_rejects_shared_slot():
    with pytest.raises(ValueError, match="share a KV slot"):
        plan_decode([1, 1], [5, 6], [3, 3], num_slots=4, scratch_slot=4, max_len=64)


# -- the fixed-shape decode, run eagerly (what a graph replays) vs the ordinary forward --------


def _greedy(runner, prompts, slots, n, num_slots, max_len):
    """Prefill then n greedy decode steps: (tokens per sequence, logits of each step on CPU)."""
    runner.ensure_cache(num_slots, max_len)
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=4096) for i, p in enumerate(prompts)]
    for s, slot in zip(seqs, slots):
        s.slot = slot
    logits, steps = runner.prefill(seqs), []
    for _ in range(n):
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.output_token_ids.append(t)
        logits = runner.decode(seqs)
        steps.append(logits.cpu())
    return [s.output_token_ids for s in seqs], steps


def _model(variant, device, dtype=torch.float32):
    hf, d = tiny_hf_model(variant)
    # max_len 320 > 256: decode crosses from the 256-key bucket to the 320-key (whole cache) one
    return LlamaModel(ModelConfig.from_hf(d), dict(hf.state_dict()), dtype=dtype, device=device, max_len=320)


def _prompts(batch):
    lengths = [248, 5, 17, 1, 60, 33, 2, 11][:batch]  # ragged; the first crosses 256 keys
    return [[(7 * i + 13 * j) % 3000 + 1 for j in range(n)] for i, n in enumerate(lengths)]


CASES = [(1, [0], 1), (3, [0, 2, 5], 8), (8, [7, 6, 5, 4, 3, 2, 1, 0], 8)]  # (batch, slots, cache slots)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_static_decode_equals_forward_on_cpu(variant):
    model = _model(variant, "cpu")
    for batch, slots, num_slots in CASES:
        ref_tokens, ref = _greedy(ModelRunner(model), _prompts(batch), slots, 12, num_slots, 320)
        static = ModelRunner(model)
        static.static_decode = True
        tokens, got = _greedy(static, _prompts(batch), slots, 12, num_slots, 320)
        assert tokens == ref_tokens
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_compact_moves_rows_and_their_kv_to_the_lowest_slots():
    """Rows left in high slots move, KV and all, into the free slots below len(running): decoding
    then continues as if they had not moved (the graph-shaped path, run eagerly on the CPU)."""
    model = _model("llama-gqa-untied", "cpu")

    def run(compact: bool):
        runner = ModelRunner(model)
        runner.static_decode = True
        runner.ensure_cache(8, 320)
        sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
        seqs = [
            Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=4096)
            for i, p in enumerate(_prompts(8))
        ]
        for s, slot in zip(seqs, [7, 6, 5, 4, 3, 2, 1, 0]):
            s.slot = slot
        logits = runner.prefill(seqs)
        out = {}
        for step in range(12):
            for s, t in zip(seqs, logits.argmax(-1).tolist()):
                s.output_token_ids.append(t)
            if step == 4:  # all but three rows finish
                free = [s.slot for s in seqs if s.slot not in (7, 5, 2)]
                seqs = [s for s in seqs if s.slot in (7, 5, 2)]
                if compact:  # the scheduler decides the moves, the runner copies the KV entries
                    seqs.sort(key=lambda s: s.slot)
                    moves = compaction_moves(seqs, free, batch_buckets(8))
                    assert [(src, dst) for _, src, dst in moves] == [(5, 0), (7, 1)]
                    runner.move_slots(moves)
                    for s, src, dst in moves:
                        s.slot = dst
                        free[free.index(dst)] = src
                    assert sorted(s.slot for s in seqs) == [0, 1, 2] and sorted(free) == [3, 4, 5, 6, 7]
                    assert compaction_moves(sorted(seqs, key=lambda s: s.slot), free, batch_buckets(8)) == []
            logits = runner.decode(seqs)
            for s, row in zip(seqs, logits):
                out.setdefault(s.request_id, []).append(row)
        return {s.request_id: (s.output_token_ids, torch.stack(out[s.request_id])) for s in seqs}

    moved, stayed = run(True), run(False)
    assert moved.keys() == stayed.keys() and len(moved) == 3
    for k in moved:
        assert moved[k][0] == stayed[k][0]
        torch.testing.assert_close(moved[k][1], stayed[k][1], atol=1e-4, rtol=0)


# -- CUDA graphs ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "triton"])
@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_graphs_equal_eager_on_cuda(variant, attention):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _model(variant, "cuda")
    for batch, slots, num_slots in CASES:
        ref_tokens, ref = _greedy(
            ModelRunner(model, cuda_graphs=False), _prompts(batch), slots, 32, num_slots, 320
        )
        graphed = ModelRunner(model, cuda_graphs=True, attention=attention)
        tokens, got = _greedy(graphed, _prompts(batch), slots, 32, num_slots, 320)
        assert tokens == ref_tokens, (variant, batch)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        assert len(graphed.graphs.graphs) == 2  # the 256- and the 320-key bucket


@pytest.mark.gpu
def test_graph_decode_does_not_sync():
    """Once captured, a decode step queues work and returns: no host<->device synchronisation."""
    model = _model("llama-gqa-untied", "cuda", torch.bfloat16)
    runner = ModelRunner(model)
    runner.ensure_cache(4, 64)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    seqs = [Sequence(i, None, [1, 2, 3 + i], sp, seed=0, eos_token_ids=(), max_len=4096) for i in range(3)]
    for i, s in enumerate(seqs):
        s.slot = i
    runner.prefill(seqs)
    for s in seqs:
        s.output_token_ids.append(5)
    runner.decode(seqs)  # captures
    torch.cuda.synchronize()
    for s in seqs:
        s.output_token_ids.append(6)
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.decode(seqs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (3, model.config.vocab_size) and torch.isfinite(logits).all()
