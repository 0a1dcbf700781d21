"""LLM.generate / chat behaviour on the tiny random-weight folder (fast)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deepinfer import SamplingParams


def test_batched_equals_one_by_one_greedy_and_seeded(tiny_llm):
    prompts = [[1, 5, 9], [1, 300, 301, 302, 303, 304, 305], [7], [1, 2000, 2001, 2002]]
    for sp in (
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=11, max_tokens=10, ignore_eos=True),
    ):
        batched = tiny_llm.generate(prompts, sp, use_tqdm=False)
        for p, b in zip(prompts, batched):
            assert tiny_llm.generate([p], sp, use_tqdm=False)[0].token_ids == b.token_ids


def test_requests_join_and_leave_between_steps(tiny_folder):
    """More requests than slots, different lengths: later ones join as earlier ones finish."""
    from deepinfer import LLM

    small = LLM(tiny_folder[0], dtype="float32", max_num_seqs=2)
    prompts = [[1, 10 + i, 20 + i] for i in range(5)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 9, 1, 6, 4)]
    outs = small.generate(prompts, params, use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [3, 9, 1, 6, 4]
    for p, sp, o in zip(prompts, params, outs):
        assert small.generate([p], sp, use_tqdm=False)[0].token_ids == o.token_ids


def test_stop_token_ids_and_length(tiny_llm):
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    free = tiny_llm.generate([[1, 5, 9]], sp, use_tqdm=False)[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 8
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    out = tiny_llm.generate(
        [[1, 5, 9]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_at]), use_tqdm=False
    )[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == free.token_ids[:first]


def test_stop_strings(tiny_llm):
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    free = tiny_llm.generate(["Hello"], sp, use_tqdm=False)[0]
    stop = free.text[len(free.text) // 2 :][:3]
    if not stop.strip():
        pytest.skip("random model produced whitespace")
    out = tiny_llm.generate(
        ["Hello"], SamplingParams(temperature=0, max_tokens=12, stop=stop), use_tqdm=False
    )[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == free.text[: free.text.find(stop)]
    keep = tiny_llm.generate(
        ["Hello"],
        SamplingParams(temperature=0, max_tokens=12, stop=stop, include_stop_str_in_output=True),
        use_tqdm=False,
    )[0]
    assert keep.text == free.text[: free.text.find(stop) + len(stop)]


def test_prompt_forms_and_chat(tiny_llm):
    one = tiny_llm.generate("Hi", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(one) == 1 and one[0].prompt == "Hi"
    ids = tiny_llm.generate(
        [tiny_llm.tokenizer.encode("Hi")], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False
    )
    assert ids[0].token_ids == one[0].token_ids and ids[0].prompt is None
    convs = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]
    outs = tiny_llm.chat(convs, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert len(outs) == 2 and outs[0].prompt.startswith("<|im_start|>system")
    assert outs[0].prompt.endswith("<|im_start|>assistant\n")


def test_bad_requests(tiny_llm):
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        tiny_llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    # a bad prompt fails its own request (tests/engine/test_hardening.py has the rest)
    (o,) = tiny_llm.generate([[1] * 300], use_tqdm=False)
    assert o.finish_reason == "error" and "context is 256" in o.error


def test_package_root_is_lazy():
    code = (
        "import sys, deepinfer, deepinfer.constraints; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "import os; assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE'; "
        "from deepinfer import SamplingParams; SamplingParams(); assert 'torch' not in sys.modules"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
