"""Tensor parallel on the CPU (gloo, 127.0.0.1): shards of 2 and 4 ranks give TP=1's logits and
greedy text, deterministic mode stays batch-invariant, and a dead worker is an error, not a hang."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.loader import load_model
from deepinfer.models.llama import LlamaModel
from deepinfer.parallel.tensor_parallel import tensor_parallel_model
from deepinfer.parallel.workers import WorkerFailed

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25]]


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "phi3", "qwen2"])
def test_logits_equal_one_rank(pool4, parallel_folder, family):
    folder = parallel_folder(family)
    loaded = load_model(folder)
    want = LlamaModel(loaded.config, loaded.weights).logits(PROMPTS)
    for n in (2, 4):
        model = tensor_parallel_model(folder, loaded, n, dtype=torch.float32, device=torch.device("cpu"),
                                      max_len=None)  # fmt: skip
        assert model.lm_head.shape[1] == -(-loaded.config.vocab_size // n)  # a vocabulary shard
        got = model.logits(PROMPTS)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_refuses_heads_that_do_not_divide(parallel_folder):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide num_attention_heads=8"):
        LLM(parallel_folder("llama"), tensor_parallel_size=3, dtype="float32", device="cpu")


def _llm(folder, **kw):
    return LLM(folder, dtype="float32", device="cpu", kv_cache_memory=1 << 20, max_num_seqs=8, **kw)


def test_generate_equals_one_rank_and_batch_invariant(pool4, parallel_folder):
    folder = parallel_folder("llama")
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    regex = SamplingParams(temperature=0.0, max_tokens=6, regex=r"(t1[0-9] )+")  # DSpark's verify forward
    one = _llm(folder).generate(PROMPTS + PROMPTS[:1], [greedy] * 3 + [regex], use_tqdm=False)
    tp = _llm(folder, tensor_parallel_size=2)
    two = tp.generate(PROMPTS + PROMPTS[:1], [greedy] * 3 + [regex], use_tqdm=False)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert [o.text for o in two] == [o.text for o in one]

    # deterministic mode at TP=2: a request's logprobs are the same bits alone and in a batch
    det = _llm(folder, tensor_parallel_size=2, deterministic=True)
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2)
    alone = det.generate([PROMPTS[0]], sp, use_tqdm=False)[0]
    batched = det.generate(PROMPTS[1:] + [PROMPTS[0]], sp, use_tqdm=False)[-1]
    assert alone.token_ids == batched.token_ids
    assert [(x.logprob, x.top) for x in alone.logprobs] == [(x.logprob, x.top) for x in batched.logprobs]

    # a worker that dies is an error naming it, not a hang (last: it ends the shared pool)
    # (other ranks it takes down with it may be named too)
    os.kill(pool4.procs[0].pid, signal.SIGKILL)
    with pytest.raises(WorkerFailed, match=r"rank 1 \(pid \d+, exit code -9\)[^\n]* died"):
        tp.generate(PROMPTS, greedy, use_tqdm=False)
