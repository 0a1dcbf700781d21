"""Deterministic mode: a request's logits and tokens are bit-identical alone, inside a batch of
mixed requests, and at another batch position (prefill alone, decode in fixed tiles)."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.config import ModelConfig
from deepinfer.model_runner import ModelRunner
from deepinfer.models.llama import LlamaModel
from deepinfer.sequence import Sequence

from .conftest import TINY_VARIANTS, give_blocks, tiny_hf_model

# (prompt, sampling params): different lengths, greedy and seeded sampling with every filter
MIXED = [
    ([1, 5, 9, 300], dict(temperature=0)),
    ([7, 8], dict(temperature=0.9, seed=3)),
    ([1, 2000, 2001, 2002, 2003, 2004], dict(temperature=0.7, top_k=20, seed=4)),
    ([42] * 17, dict(temperature=1.0, top_p=0.8, seed=5)),
    ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], dict(temperature=1.2, min_p=0.05, seed=6)),
    ([11], dict(temperature=0)),
    (list(range(100, 140)), dict(temperature=0.8, top_k=50, top_p=0.9, seed=7)),
    ([9, 9, 9], dict(temperature=0.5, seed=8)),
    ([1, 2, 3, 4, 5, 6, 7, 8], dict(temperature=0)),
    ([500, 600, 700], dict(temperature=1.0, seed=9)),
    (list(range(1000, 1025)), dict(temperature=0.6, min_p=0.1, seed=10)),
    ([77, 78], dict(temperature=0)),
]


def _params(kw: dict, n: int = 10) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def _recording(llm: LLM) -> dict[tuple[int, int], torch.Tensor]:
    """Wrap the one sampling call of a step: keep every row's logits by (seed, step)."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    inner = llm.sample_fn

    def sample_fn(logits, **kw):
        seeds, steps = torch.as_tensor(kw["seed"]).tolist(), torch.as_tensor(kw["step"]).tolist()
        for row, key in zip(logits, zip(seeds, steps)):
            seen[key] = row.detach().cpu().clone()
        return inner(logits, **kw)

    llm.sample_fn = sample_fn
    return seen


@pytest.fixture(scope="module")
def det_llm(tiny_folder, monkeypatch_session):
    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0, deterministic=True)


def _generate(llm, items, **kw):
    return [
        o.token_ids
        for o in llm.generate([p for p, _ in items], [_params(k) for _, k in items], use_tqdm=False, **kw)
    ]


def test_alone_equals_batch_equals_other_position(det_llm):
    """Tokens and every step's logits: each request alone, all 12 together, the batch reversed,
    and through 5 slots (requests join and leave, so rows move between slots and tiles)."""
    items = [
        (p, dict(kw, seed=kw.get("seed", 100 + i))) for i, (p, kw) in enumerate(MIXED)
    ]  # unique seeds: keys
    seen = _recording(det_llm)
    alone = [_generate(det_llm, [it])[0] for it in items]
    logits_alone = dict(seen)
    seen.clear()
    batch = _generate(det_llm, items)
    assert batch == alone
    assert seen.keys() == logits_alone.keys()
    assert all(torch.equal(seen[k], logits_alone[k]) for k in seen)
    seen.clear()
    assert _generate(det_llm, items[::-1])[::-1] == alone
    assert all(torch.equal(seen[k], logits_alone[k]) for k in seen)
    det_llm.scheduler.max_num_seqs = 5  # requests join and leave: rows change places and tiles
    try:
        seen.clear()
        assert _generate(det_llm, items[3:] + items[:3]) == alone[3:] + alone[:3]
        assert all(torch.equal(seen[k], logits_alone[k]) for k in seen)
    finally:
        det_llm.scheduler.max_num_seqs = 64


def _runner_logits(model, prompts, steps, max_rows, deterministic=True, attention=None, seed=0, **kw):
    """Prefill then greedy decode; every step's logits [B, V] (float32, on CPU)."""
    runner = ModelRunner(model, deterministic=deterministic, attention=attention, **kw)
    sp = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=256) for i, p in enumerate(prompts)]
    give_blocks(runner, seqs, max_rows=max_rows, seed=seed)
    out = [runner.step(seqs, [len(s) for s in seqs])]
    for _ in range(steps):
        for s, t in zip(seqs, out[-1].argmax(-1).tolist()):
            s.output_token_ids.append(t)
        out.append(runner.step(seqs, [1] * len(seqs)))
    return [x.cpu() for x in out]


@pytest.mark.parametrize("attention", ["rows", "torch"])
@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_runner_logits_bitwise_across_rows_and_tiles(variant, attention):
    """Every model variant, with the CPU's per-row attention (the default) and the fixed-block
    one: a row's logits alone == as row 13 of a 16-row batch (second tile) == as row 2, beside
    neighbours of other lengths, with other blocks."""
    hf, d = tiny_hf_model(variant)
    model = LlamaModel(ModelConfig.from_hf(d), dict(hf.state_dict()), dtype=torch.float32)
    prompts = [list(range(3 + 2 * i, 3 + 2 * i + 1 + 3 * (i % 5))) for i in range(16)]
    target = [1, 5, 9, 300, 301]
    alone = _runner_logits(model, [target], 6, 1, attention=attention)
    for at in (13, 2):
        ps = list(prompts)
        ps[at] = target
        batch = _runner_logits(model, ps, 6, 16, attention=attention, seed=at)
        for a, b in zip(alone, batch):
            assert torch.equal(a[0], b[at])
    # the deterministic forward computes the same model (close to the default path)
    default = _runner_logits(model, [target], 6, 1, deterministic=False)
    for a, b in zip(alone, default):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_embedded_model_alone_equals_batch():
    llm = LLM(None, device="cpu", seed=0, deterministic=True)
    prompts = [
        "Hello!",
        "Write a haiku about the sea.",
        "1, 2, 3, 4,",
        "The capital of France is",
        "def fib(n):",
        "Q: What is 2+2?\nA:",
        "Once upon a time",
        "JSON:",
    ]
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True, temperature=t, top_p=p, seed=i)
        for i, (t, p) in enumerate(
            [(0, 1), (0.8, 0.9), (1.0, 1), (0, 1), (0.7, 0.95), (1.0, 0.5), (0.9, 1), (0, 1)]
        )
    ]
    seen = _recording(llm)
    batch = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    logits_batch = dict(seen)
    seen.clear()
    for i in (0, 3, 6):  # alone, at a different position
        assert llm.generate([prompts[i]], [params[i]], use_tqdm=False)[0].token_ids == batch[i]
    assert seen and all(torch.equal(seen[k], logits_batch[k]) for k in seen)


@pytest.mark.gpu
@pytest.mark.parametrize(("invariant", "attention"), [(True, None), (False, "torch"), (False, "triton")])
def test_cuda_alone_equals_batch_of_64(invariant, attention):
    """On CUDA (graphs, bf16): alone == in a batch of 64 mixed == another position, with the
    batch-invariant kernels (one graph bucket of 1, then of 64 or 80 rows) and with torch kernels
    over fixed tiles (either batch-invariant attention)."""
    hf, d = tiny_hf_model("llama-gqa-untied")
    model = LlamaModel(ModelConfig.from_hf(d), dict(hf.state_dict()), dtype=torch.bfloat16, device="cuda")
    prompts = [list(range(3 + i, 3 + i + 1 + (7 * i) % 23)) for i in range(64)]
    target = [1, 5, 9, 300, 301]
    kw = dict(attention=attention, invariant_kernels=invariant)
    alone = _runner_logits(model, [target], 8, 1, **kw)
    for at in (63, 37):
        ps = list(prompts)
        ps[at] = target
        batch = _runner_logits(model, ps, 8, 70, seed=at, **kw)  # graph bucket of 64 or 80 rows
        for a, b in zip(alone, batch):
            assert torch.equal(a[0], b[at])
    default = _runner_logits(model, [target], 1, 1, deterministic=False)
    # the same model as the default path: first decode step (same input), bf16 rounding apart
    torch.testing.assert_close(alone[1], default[1], atol=0.1, rtol=0.05)
