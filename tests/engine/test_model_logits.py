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


def _to(x):
    return torch.tensor(x, dtype=torch.int64)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
def test_ragged_prefill_then_decode_match_transformers(variant):
    """A ragged batch prefilled together through shuffled block tables (block size 4), then
    three decode steps, each row at its own position."""
    hf, d = tiny_hf_model(variant)
    ours = _ours(hf, d)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, d["vocab_size"], (n,), generator=g).tolist() for n in (7, 3, 12)]
    cache = ours.new_cache(16, 4)
    blocks = torch.randperm(15, generator=g).add(1).tolist()
    tables = [blocks[0:4], blocks[4:8], blocks[8:12]]  # room for 16 positions each
    batch = ForwardBatch.of_chunks(_to, tables, [0, 0, 0], prompts, 4)
    got = ours.forward(batch, cache)  # [B, V]
    seqs = [list(p) for p in prompts]
    for b, p in enumerate(seqs):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0, -1]
        torch.testing.assert_close(got[b], ref, atol=ATOL, rtol=0)
    for _ in range(3):
        nxt = got.argmax(-1).tolist()
        starts = [len(p) for p in seqs]
        for p, t in zip(seqs, nxt):
            p.append(t)
        got = ours.forward(ForwardBatch.of_chunks(_to, tables, starts, [[t] for t in nxt], 4), cache)
        for b, p in enumerate(seqs):
            with torch.no_grad():
                ref = hf(torch.tensor([p])).logits[0, -1]
            torch.testing.assert_close(got[b], ref, atol=ATOL, rtol=0)


def test_all_position_logits_match_transformers():
    hf, d = tiny_hf_model("llama-gqa-untied", seed=3)
    ours = _ours(hf, d)
    ids = torch.randint(0, d["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(0))
    got = torch.stack(ours.logits(ids.tolist()))  # [B, T, V]
    with torch.no_grad():
        ref = hf(ids).logits
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_prefill_over_a_cached_prefix_equals_one_prefill():
    """A prompt prefilled in chunks (the second and third attend to the cached blocks of the
    first) gives the logits of one whole prefill."""
    hf, d = tiny_hf_model("llama-gqa-untied", seed=4)
    ours = _ours(hf, d)
    ids = torch.randint(0, d["vocab_size"], (21,), generator=torch.Generator().manual_seed(2)).tolist()
    whole = ours.logits([ids])[0]
    cache = ours.new_cache(8, 4)
    table = [3, 1, 7, 2, 5, 6]
    parts = []
    for a, b in ((0, 8), (8, 17), (17, 21)):
        parts.append(
            ours.forward(ForwardBatch.of_chunks(_to, [table], [a], [ids[a:b]], 4, logits="all"), cache)
        )
    torch.testing.assert_close(torch.cat(parts), whole, atol=ATOL, rtol=0)


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
