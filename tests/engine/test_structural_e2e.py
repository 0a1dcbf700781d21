"""Structural tags and reasoning end to end on the embedded SmolLM2-135M-Instruct.

- A tool call inside free text: a few-shot prompt leads the model to write the trigger;
  from there the call must be valid: parsed by ``parse_tool_calls`` and each call's
  arguments checked by jsonschema, independently of the automaton.
- A forced reasoning block, then JSON: SmolLM2 has no think tokens, so the pair is written
  by hand; with a small ``max_reasoning_tokens`` the end marker is forced, and the answer
  after it is valid JSON.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.tool_calls import parse_tool_calls, tool_call_params, tool_call_schema

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 10}}, "required": ["zone"], "additionalProperties": False}}},
]  # fmt: skip
FEW_SHOT = (
    "Weather bot.\nQ: weather in Rome?\nA: Let me check. "
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}</tool_call>\n'
    "Q: weather in {city}?\nA: Let me check."
)
SETTINGS = [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.95, "seed": 11}]
ANSWER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}  # fmt: skip
THINK = "Q: Maria Lopez is 34. Think, then give her name and age as JSON.\nA:"
BUDGETS = (4, 12)


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    return LLM(seed=0, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def batch(llm):
    """One generate call for every test here: [(what, params, output)]."""
    reqs = []
    for city in ("Oslo", "Lima"):
        for s in SETTINGS:
            reqs.append(
                ("tools", FEW_SHOT.replace("{city}", city), SamplingParams(**tool_call_params(TOOLS), **s))
            )
    one = tool_call_params(TOOLS, parallel=False, then="end")
    reqs.append(("one", FEW_SHOT.replace("{city}", "Kyiv"), SamplingParams(**one, temperature=0)))
    for budget in BUDGETS:
        for s in SETTINGS:
            p = SamplingParams(
                json_schema=ANSWER, reasoning=("<think>", "</think>"), max_reasoning_tokens=budget, **s
            )
            reqs.append((f"think{budget}", THINK, p))
    bad_tags = [{"begin": "<a>", "regex": "x", "end": "</a>"}]
    reqs.append(("bad_trigger", "Hi", SamplingParams(structural_tags=bad_tags, triggers=["<b>"])))
    reqs.append(("bad_reasoning", "Hi", SamplingParams(json_schema=ANSWER, reasoning=True)))
    reqs.append(("free", "Hi", SamplingParams(temperature=0, max_tokens=4)))
    for _, _, p in reqs:
        if p.max_tokens == 16:
            p.max_tokens = 48
    outs = llm.generate([r[1] for r in reqs], [r[2] for r in reqs], use_tqdm=False)
    return [(r[0], r[2], o) for r, o in zip(reqs, outs)]


def test_tool_call_inside_free_text(batch):
    validator = jsonschema.Draft202012Validator(tool_call_schema(TOOLS))
    n_calls = 0
    for what, _, o in batch:
        if what != "tools":
            continue
        assert o.error is None, o  # (free text cut by max_tokens is free text)
        if "<tool_call>" not in o.text:
            continue  # free text only: nothing to hold to a schema
        head = o.text.split("</tool_call>")[0] + "</tool_call>"
        _, calls = parse_tool_calls(head)
        assert calls, o.text  # a segment that started is a call
        for call in calls:
            validator.validate(call)
            n_calls += 1
        assert [seg["value"] for seg in o.parsed][: len(calls)] == calls  # the engine's own reading
    assert n_calls >= 2  # the few-shot prompt does lead the model to call


def test_tool_call_at_most_one_then_end(batch):
    o = next(o for what, _, o in batch if what == "one")
    assert o.valid and o.finish_reason == "stop", o
    _, calls = parse_tool_calls(o.text)
    assert len(calls) == 1 and o.text.endswith("</tool_call>")
    jsonschema.validate(calls[0]["arguments"], WEATHER)


@pytest.mark.parametrize("budget", BUDGETS)
def test_forced_reasoning_then_json(llm, batch, budget):
    outs = [o for what, _, o in batch if what == f"think{budget}"]
    assert len(outs) == len(SETTINGS)
    for o in outs:
        assert o.valid and o.finish_reason == "stop", o
        assert o.reasoning is not None and "</think>" not in o.reasoning
        jsonschema.validate(json.loads(o.text), ANSWER)
        assert o.parsed == json.loads(o.text)
        # the block closed within the budget, or every token past it was the markers' rest
        # (the budget counts the begin marker's tokens too: it may still be open)
        ids = o.token_ids
        closed = next(k for k in range(1, len(ids) + 1) if "</think>" in llm.tokenizer.decode(ids[:k]))
        forced = llm.tokenizer.decode(ids[budget:closed]) if closed > budget else ""
        assert "<think></think>".endswith(forced), (forced, o)


def test_bad_requests_fail_alone(batch):
    outs = {what: o for what, _, o in batch}
    assert outs["bad_trigger"].finish_reason == "error"
    assert (
        "trigger '<b>' begins no tag" in outs["bad_trigger"].error
        and "#/triggers/0" in outs["bad_trigger"].error
    )
    assert outs["bad_reasoning"].finish_reason == "error"
    assert "no <think> and </think> tokens" in outs["bad_reasoning"].error
    assert outs["free"].valid and outs["free"].token_ids
