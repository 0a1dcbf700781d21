"""The engine on CUDA (skipped without a GPU): same maths as on the CPU."""

from __future__ import annotations

import pytest
import torch

from deepinfer.config import ModelConfig
from deepinfer.kernels import sample
from deepinfer.model_runner import ModelRunner
from deepinfer.models.llama import LlamaModel
from deepinfer.sampling_params import SamplingParams
from deepinfer.sequence import Sequence

from .conftest import TINY_VARIANTS, give_blocks, tiny_hf_model

pytestmark = pytest.mark.gpu


def _greedy(model: LlamaModel, prompts: list[list[int]], n: int) -> list[list[int]]:
    runner = ModelRunner(model)
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    seqs = [Sequence(i, None, p, sp, seed=0, eos_token_ids=(), max_len=256) for i, p in enumerate(prompts)]
    give_blocks(runner, seqs)
    logits = runner.step(seqs, [len(s) for s in seqs])
    for _ in range(n):
        for s, t in zip(seqs, logits.argmax(-1).tolist()):
            s.output_token_ids.append(t)
        logits = runner.step(seqs, [1] * len(seqs))
    return [s.output_token_ids for s in seqs]


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_cuda_float32_matches_cpu_and_transformers(variant):
    torch.backends.cuda.matmul.allow_tf32 = False
    hf, d = tiny_hf_model(variant)
    cfg, sd = ModelConfig.from_hf(d), dict(hf.state_dict())
    prompts = [[1, 5, 9, 300], [7, 8], [1, 2000, 2001, 2002, 2003, 2004]]
    cpu = _greedy(LlamaModel(cfg, sd, dtype=torch.float32, device="cpu"), prompts, 8)
    gpu = _greedy(LlamaModel(cfg, sd, dtype=torch.float32, device="cuda"), prompts, 8)
    assert gpu == cpu
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompts[0]]),
            attention_mask=torch.ones(1, 4, dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, 4:].tolist()
    assert gpu[0] == ref


def test_cuda_bfloat16_runs_and_agrees_mostly():
    hf, d = tiny_hf_model("llama-gqa-untied")
    cfg, sd = ModelConfig.from_hf(d), dict(hf.state_dict())
    prompts = [[1, 5, 9, 300], [7, 8]]
    cpu = _greedy(LlamaModel(cfg, sd, dtype=torch.float32, device="cpu"), prompts, 4)
    gpu = _greedy(LlamaModel(cfg, sd, dtype=torch.bfloat16, device="cuda"), prompts, 4)
    assert sum(a == b for x, y in zip(cpu, gpu) for a, b in zip(x, y)) >= 6


def test_engine_sampler_on_cuda_equals_cpu():
    """The engine's sampler (the fused kernel on CUDA, its torch reference on the CPU)."""
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(0))
    kw = dict(
        temperature=torch.full((4,), 0.8),
        top_k=torch.tensor([0, 5, 0, 50]),
        top_p=torch.tensor([1.0, 1.0, 0.9, 0.5]),
        min_p=torch.tensor([0.0, 0.0, 0.05, 0.0]),
        seed=torch.arange(4),
        step=torch.full((4,), 3),
    )
    assert torch.equal(sample(logits.cuda(), **kw).tokens.cpu(), sample(logits, **kw).tokens)
