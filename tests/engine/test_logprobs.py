"""SamplingParams.logprobs: each generated token's log-probability under the model, and the
most likely alternatives at its position, checked against the model's own logits."""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer import SamplingParams


def _expected(llm, out):
    """log_softmax of the model's logits at each generated position (one forward over all)."""
    ids = out.prompt_token_ids + out.token_ids
    (logits,) = llm.model.logits([ids])
    n = len(out.prompt_token_ids)
    return torch.log_softmax(logits[n - 1 : n - 1 + len(out.token_ids)].float(), dim=-1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_models(tiny_llm, temperature):
    params = SamplingParams(max_tokens=6, temperature=temperature, seed=3, logprobs=4, ignore_eos=True)
    (out,) = tiny_llm.generate(["Hello there", "a b c"], params, use_tqdm=False)[:1]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 6
    want = _expected(tiny_llm, out)
    for i, (entry, tok) in enumerate(zip(out.logprobs, out.token_ids)):
        assert entry.token_id == tok
        assert math.isclose(entry.logprob, want[i, tok].item(), abs_tol=1e-4)
        assert len(entry.top) == 4
        ids = [t for t, _ in entry.top]
        vals = [v for _, v in entry.top]
        assert vals == sorted(vals, reverse=True)
        top = want[i].topk(4)
        assert torch.allclose(torch.tensor(vals), top.values, atol=1e-4)
        assert set(ids) == set(top.indices.tolist()) or vals[-1] == pytest.approx(vals[-2])
        if temperature == 0:
            assert entry.logprob == pytest.approx(vals[0], abs=1e-5)  # greedy: the most likely


def test_logprobs_off_by_default_and_zero_alternatives(tiny_llm):
    off, zero = tiny_llm.generate(
        ["x y", "x y"],
        [SamplingParams(max_tokens=3, seed=1), SamplingParams(max_tokens=3, seed=1, logprobs=0)],
        use_tqdm=False,
    )
    assert off.logprobs is None
    assert off.token_ids == zero.token_ids  # asking for logprobs does not change the tokens
    assert [e.top for e in zero.logprobs] == [[]] * len(zero.token_ids)


def test_logprobs_of_a_constrained_request_are_unmasked(tiny_llm):
    """Under a constraint the tokens obey it; their logprobs are still the model's (as vLLM's
    default raw logprobs)."""
    params = SamplingParams(max_tokens=4, temperature=0, regex="[0-9]{4}", logprobs=2)
    (out,) = tiny_llm.generate(["digits:"], params, use_tqdm=False)
    assert out.text.isdigit() and len(out.logprobs) == len(out.token_ids)
    want = _expected(tiny_llm, out)
    for i, e in enumerate(out.logprobs):
        assert math.isclose(e.logprob, want[i, e.token_id].item(), abs_tol=1e-4)


def test_streamed_partials_carry_their_tokens_logprobs(tiny_llm):
    rid = tiny_llm.add_request("one two", SamplingParams(max_tokens=5, logprobs=1, seed=0), stream=True)
    seen = []
    while tiny_llm.has_unfinished_requests():
        for o in tiny_llm.step():
            assert o.request_id == rid and len(o.logprobs) == len(o.token_ids)
            seen.append(o)
    assert seen[-1].finished and seen[-1].logprobs[: len(seen[0].logprobs)] == seen[0].logprobs


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True, "3"])
def test_bad_logprobs_are_refused(bad):
    with pytest.raises(ValueError, match=r"SamplingParams.logprobs must be an int in \[0, 20\]"):
        SamplingParams(logprobs=bad)
