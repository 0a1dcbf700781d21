"""deepinfer.tool_calls: OpenAI tools -> the schema of one call; calls parsed out of text;
segments of a finished output judged on their own (jsonschema, re, membership)."""

from __future__ import annotations

import jsonschema
import pytest

from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import check_segments, judge
from deepinfer.tool_calls import parse_tool_calls, tool_call_params, tool_call_schema

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "now"}},
]


def test_schema_of_one_call():
    v = jsonschema.Draft202012Validator(tool_call_schema(TOOLS))
    assert v.is_valid({"name": "add", "arguments": {"a": 1, "b": 2}})
    assert v.is_valid({"name": "now", "arguments": {}})
    assert not v.is_valid({"name": "add", "arguments": {"a": 1}})
    assert not v.is_valid({"name": "sub", "arguments": {"a": 1, "b": 2}})
    assert not v.is_valid({"name": "now", "arguments": {}, "extra": 1})
    assert tool_call_schema(TOOLS[:1])["properties"]["name"] == {"const": "add"}  # one tool: no anyOf


@pytest.mark.parametrize(
    "tools,pattern",
    [
        ([], r"non-empty list"),
        ([{"type": "function", "function": {"name": ""}}], r"tools\[0\]\.function\.name"),
        ([TOOLS[0], TOOLS[0]], r"tools\[1\]\.function\.name 'add' is given twice"),
        ([{"type": "retrieval"}], r"tools\[0\] must be"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": 3}}],
            r"tools\[0\]\.function\.parameters",
        ),
    ],
)
def test_bad_tools(tools, pattern):
    with pytest.raises(ValueError, match=pattern):
        tool_call_schema(tools)


def test_params_build_sampling_params():
    p = SamplingParams(**tool_call_params(TOOLS, parallel=False, required=True))
    assert p.constraint_kind == "structural_tags" and p.max_segments == 1 and p.min_segments == 1
    assert p.triggers == ["<tool_call>"]


def test_parse_tool_calls():
    text = (
        'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> and '
        '<tool_call>\n{"name":"now","arguments":{}}\n</tool_call> done.'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me add.  and  done."
    assert calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]
    assert parse_tool_calls("no calls") == ("no calls", [])
    with pytest.raises(ValueError, match="tool call at offset 2: not JSON"):
        parse_tool_calls("a <tool_call>{oops</tool_call>")
    with pytest.raises(ValueError, match="'</tool_call>' expected"):
        parse_tool_calls('a <tool_call>{"name": "now", "arguments": {}} x')


def test_judge_segments_and_length():
    kw = tool_call_params(TOOLS)
    good = 'hi <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> ok'
    segs, err = check_segments(good, kw["structural_tags"], kw["triggers"])
    assert err is None and segs[0]["value"]["arguments"] == {"a": 1, "b": 2}
    p = SamplingParams(**kw)
    assert judge(p, good, "stop") == (segs, None)
    assert judge(p, good + " and so", "length")[1] is None  # cut in the free text: valid
    assert "max_tokens" in judge(p, 'hi <tool_call>{"name": "add"', "length")[1]  # cut in a segment
    bad = 'hi <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    assert judge(p, bad, "stop")[1] == "the segment at offset 3 does not match its tag"


@pytest.mark.parametrize(
    "kw,pattern",
    [
        ({"structural_tags": []}, r"structural_tags must be a non-empty list"),
        (
            {"structural_tags": [{"begin": "<a>", "end": "</a>"}], "json_schema": {}},
            r"at most one constraint",
        ),
        ({"triggers": ["<a>"]}, r"triggers needs structural_tags"),
        ({"structural_tags": [{"begin": "<a>", "end": "</a>"}], "triggers": [""]}, r"triggers must be"),
        ({"structural_tags": [{"begin": "<a>", "end": "</a>"}], "max_segments": 0}, r"max_segments"),
        ({"reasoning": ("<t>", "")}, r"reasoning must be True, or a \(begin, end\) pair"),
        ({"reasoning": "yes"}, r"reasoning must be"),
        ({"max_reasoning_tokens": 5}, r"max_reasoning_tokens needs reasoning"),
        ({"reasoning": True, "max_reasoning_tokens": -1}, r"max_reasoning_tokens must be"),
    ],
)
def test_sampling_params_fields(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**kw)


def test_sampling_params_kinds():
    assert SamplingParams(reasoning=True).constraint_kind == "reasoning"
    p = SamplingParams(regex="[0-9]", reasoning=["<t>", "</t>"], max_reasoning_tokens=3)
    assert p.constraint_kind == "regex" and p.reasoning == ("<t>", "</t>")
    assert SamplingParams(reasoning=False).reasoning is None
