"""The step loop's deferred matcher work (CUDA's inline masks): a constrained row's token joins
its output at once and its matcher accepts it while the next forward runs. Outputs must be
exactly those of accepting every token before the next step (the worker-thread mode), on a
batch whose rows end by their constraint, by length, by EOS and by a failed compile."""

from __future__ import annotations

import pytest

from deepinfer import SamplingParams
from deepinfer.sequence import Sequence

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["n"],
    "additionalProperties": False,
}


def _requests(speculative):
    prompts, params = [], []
    for i in range(12):
        kind = i % 6
        kw = dict(
            temperature=0.0 if i < 6 else 0.9,
            seed=100 + i,
            max_tokens=24 if i % 4 else 5,
            speculative=speculative,
        )
        if kind == 0:
            kw.update(json_schema=SCHEMA)
        elif kind == 1:
            kw.update(regex=r"[a-c]{2,6}")
        elif kind == 2:
            kw.update(choice=["yes", "no", "maybe"])
        elif kind == 3:
            kw.update(max_tokens=6)  # unconstrained
        elif kind == 4:
            kw.update(grammar='start: "(" NUM ")"\nNUM: /[0-9]{1,4}/')
        else:
            kw.update(regex=r"(x|y)+", max_tokens=7)  # ends by length
        prompts.append(f"request {i}: write something")
        params.append(SamplingParams(**kw))
    prompts.append("bad schema")
    params.append(
        SamplingParams(
            json_schema={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, speculative=speculative
        )
    )
    return prompts, params


def _run(llm, inline: bool, monkeypatch, speculative):
    calls = []
    settle = Sequence.settle

    def counted(self, token_id, tokenizer):
        calls.append(token_id)
        return settle(self, token_id, tokenizer)

    with monkeypatch.context() as mp:
        mp.setattr(Sequence, "settle", counted)
        mp.setattr(llm.masks, "inline", inline)
        prompts, params = _requests(speculative)
        outs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.token_ids, o.finish_reason, o.text, o.error) for o in outs], calls


@pytest.mark.parametrize("speculative", [False, None], ids=["plain", "dspark-default"])
def test_deferred_accept_gives_the_same_outputs(tiny_llm, monkeypatch, speculative):
    """Plain decode steps only (settled behind each next forward), and the LLM's DSpark default
    (constrained rows draft: pending rows settle before every drafting step)."""
    want, calls_off = _run(tiny_llm, False, monkeypatch, speculative)
    got, calls_on = _run(tiny_llm, True, monkeypatch, speculative)
    assert calls_off == [] and len(calls_on) > 20  # the deferred path ran
    assert got == want
    reasons = {r for _, r, _, e in want if e is None}
    assert {"stop", "length"} <= reasons
    assert want[-1][3] is not None  # the bad schema failed alone


@pytest.mark.parametrize("token,deferred", [(5, True), (-1, False)])
def test_defers_only_what_only_the_constraint_can_end(tiny_llm, token, deferred):
    seq = tiny_llm._make_sequence("hi", SamplingParams(regex="[a-z]+", max_tokens=4))
    seq.constraint = tiny_llm.structured.matcher(tiny_llm.structured.compile(seq.params))
    assert seq.defers(token) is deferred
    seq.output_token_ids.extend([7, 7, 7])
    assert not seq.defers(5)  # the fourth token is the last one allowed: length decides too
