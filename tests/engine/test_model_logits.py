"""Our Llama-family forward vs transformers on tiny random-weight configs (float32)."""

from __future__ import annotations

import pytest
import torch

from deepinfer.config import ModelConfig
from deepinfer.models.llama import ForwardBatch, LlamaModel

from .conftest import TINY_VARIANTS, tiny_hf_model

ATOL = 2e-5


def _ours(hf_model, d):
    return LlamaModel(ModelConfig.from_hf(d), dict(hf_model.state_dict()), dtype=torch.float32)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_ragged_prefill_then_decode_match_transformers(variant):
    hf, d = tiny_hf_model(variant)
    ours = _ours(hf, d)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, d["vocab_size"], (n,), generator=g).tolist() for n in (7, 3, 12)]
    B, T = len(prompts), max(map(len, prompts))
    cache = ours.new_cache(B, 64)
    tokens = torch.tensor([p + [0] * (T - len(p)) for p in prompts])
    batch = ForwardBatch(
        tokens=tokens,
        positions=torch.arange(T).expand(B, T),
        slots=torch.tensor([2, 0, 1]),  # not contiguous: exercises the gather path
        kv_len=T,
        logits_index=torch.tensor([len(p) - 1 for p in prompts]),
    )
    cache = ours.new_cache(3, 64)
    got = ours.forward(batch, cache)  # [B, V]
    seqs = [list(p) for p in prompts]
    for b, p in enumerate(seqs):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1]
        torch.testing.assert_close(got[b], ref, atol=ATOL, rtol=0)
    # three decode steps with the cache, each row at its own position
    for _ in range(3):
        nxt = got.argmax(-1).tolist()
        for p, t in zip(seqs, nxt):
            p.append(t)
        pos = torch.tensor([[len(p) - 1] for p in seqs])
        batch = ForwardBatch(
            tokens=torch.tensor([[t] for t in nxt]),
            positions=pos,
            slots=torch.tensor([2, 0, 1]),
            kv_len=int(pos.max()) + 1,
        )
        got = ours.forward(batch, cache)[:, -1]
        for b, p in enumerate(seqs):
            with torch.no_grad():
                ref = hf(torch.tensor([p])).logits[0, -1]
            torch.testing.assert_close(got[b], ref, atol=ATOL, rtol=0)


def test_all_position_logits_match_transformers():
    hf, d = tiny_hf_model("llama-gqa-untied", seed=3)
    ours = _ours(hf, d)
    ids = torch.randint(0, d["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(0))
    batch = ForwardBatch(
        tokens=ids, positions=torch.arange(10).expand(2, 10), slots=torch.arange(2), kv_len=10, slot_start=0
    )
    got = ours.forward(batch, ours.new_cache(2, 16))  # [B, T, V]
    with torch.no_grad():
        ref = hf(ids).logits
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_greedy_generation_matches_transformers(tiny_folder, tiny_llm):
    from deepinfer import SamplingParams

    _, hf = tiny_folder
    prompt = [1, 400, 2000, 33, 34]
    with torch.no_grad():
        x = torch.tensor([prompt])
        ref = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    out = tiny_llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )[0]
    assert out.token_ids == ref
    assert out.finish_reason == "length"
