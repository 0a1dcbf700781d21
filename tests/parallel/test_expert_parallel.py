"""Expert parallel: EPLB placement from router statistics, and EP=2 logits equal to the
single-process mixture of experts (tokens reach their experts by all_to_all over gloo)."""

from __future__ import annotations

import torch

from deepinfer import LLM, SamplingParams
from deepinfer.loader import load_model
from deepinfer.models.llama import LlamaModel
from deepinfer.parallel.experts import eplb, imbalance, plan_experts
from deepinfer.parallel.tensor_parallel import tensor_parallel_model

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25, 26]]


def test_eplb_replicates_the_hottest_and_balances():
    load = [100.0, 10, 10, 10, 10, 10, 10, 10]  # expert 0 is hot
    held, before, after = eplb(load, ranks=2, slots=5)
    # both spare slots replicate expert 0 (100 / 2 copies still beats 10), every expert placed
    assert sorted(e for r in held for e in r) == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert all(len(r) == 5 and 0 in r for r in held)  # one copy of 0 on each rank
    assert before == imbalance([130, 40]) and after == imbalance([96 + 2 / 3, 73 + 1 / 3]) < before


def test_ep2_logits_equal_one_process(pool4, parallel_folder):
    folder = parallel_folder("qwen3_moe")
    loaded = load_model(folder)
    want = LlamaModel(loaded.config, loaded.weights).logits(PROMPTS)
    plan = plan_experts(loaded, 2)
    assert plan.after[0] <= plan.before[0] and "layer 0" in plan.report()
    model = tensor_parallel_model(folder, loaded, 2, dtype=torch.float32, device=torch.device("cpu"),
                                  max_len=None, experts=plan)  # fmt: skip
    assert model.layers[0].moe.moe.w_gate_up.shape[0] == 5  # this rank's slots, not all 8 experts
    for g, w in zip(model.logits(PROMPTS), want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # and through the engine: the same greedy tokens as one process
    kw = dict(dtype="float32", device="cpu", kv_cache_memory=1 << 20, max_num_seqs=4)
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    one = LLM(folder, **kw).generate(PROMPTS, sp, use_tqdm=False)
    ep = LLM(folder, expert_parallel_size=2, **kw).generate(PROMPTS, sp, use_tqdm=False)
    assert [o.token_ids for o in ep] == [o.token_ids for o in one]
