"""Tool calls inside free text: OpenAI ``tools`` -> structural tags, and calls back out.

For ``tool_choice: "auto"`` the model writes text, and now and then a call
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes / Qwen format that
SmolLM2's and Qwen's chat templates use). :func:`tool_call_params` gives the
``SamplingParams`` fields that make every call valid: once the trigger is written, the call
must be one of the tools with arguments valid under its ``parameters`` schema.
:func:`parse_tool_calls` takes the calls out of the generated text.

>>> kw = tool_call_params(tools)                              # doctest: +SKIP
>>> out = llm.chat(messages, SamplingParams(**kw, max_tokens=256))[0]  # doctest: +SKIP
>>> content, calls = parse_tool_calls(out.text)               # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any

BEGIN, END = "<tool_call>", "</tool_call>"


def tool_call_schema(tools: list[dict]) -> dict:
    """The JSON Schema of one call of one of ``tools`` (OpenAI's ``[{"type": "function",
    "function": {"name", "parameters"}}]``): ``{"name": <const>, "arguments": <parameters>}``,
    an ``anyOf`` over the tools (disjoint by the name). A tool without ``parameters`` takes
    any object. Raises ValueError naming the tool at fault (``tools[1].function.name``)."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list of {'type': 'function', 'function': {...}}")
    branches = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ValueError(f"{where} must be {{'type': 'function', 'function': {{...}}}}, got {tool!r:.80}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ValueError(f"{where}.function must be an object with a name")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.function.name must be a non-empty string, got {name!r:.80}")
        if name in seen:
            raise ValueError(f"{where}.function.name {name!r} is given twice")
        seen.add(name)
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object"}
        if not isinstance(params, (dict, bool)):
            raise ValueError(f"{where}.function.parameters must be a JSON Schema object")
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def tool_call_params(
    tools: list[dict],
    *,
    parallel: bool = True,
    required: bool = False,
    begin: str = BEGIN,
    end: str = END,
    then: str = "text",
) -> dict[str, Any]:
    """``SamplingParams`` keywords for free text with calls of ``tools``: ``structural_tags``
    (one tag, its content :func:`tool_call_schema`), ``triggers`` (``begin``) and the number
    of calls: any (``parallel``) or at most one, at least one if ``required``
    (``tool_choice: "required"``). ``then="end"``: the output ends after a call."""
    tag = {"begin": begin, "json_schema": tool_call_schema(tools), "end": end, "then": then}
    return {
        "structural_tags": [tag],
        "triggers": [begin],
        "min_segments": 1 if required else 0,
        "max_segments": None if parallel else 1,
    }


def tool_call_grammar(tools: list[dict], *, parallel: bool = True, begin: str = BEGIN, end: str = END) -> str:
    """A Lark grammar whose language is calls only (``tool_choice: "required"`` or a named
    function): one call of ``tools`` in ``begin ... end`` tags, or with ``parallel`` one or
    more, a line break between them. Its JSON is :func:`tool_call_schema` (``%json``)."""
    schema = json.dumps(tool_call_schema(tools), ensure_ascii=False)
    calls = 'call ("\\n" call)*' if parallel else "call"
    return (
        f"start: {calls}\n"
        f'call: {json.dumps(begin)} "\\n"? arguments "\\n"? {json.dumps(end)}\n'
        f"arguments: %json {schema}\n"
    )


def parse_tool_calls(text: str, *, begin: str = BEGIN, end: str = END) -> tuple[str, list[dict]]:
    """(content, calls) of a generated text: the text with every ``begin ... end`` segment
    taken out (stripped), and each segment's call as ``{"name": str, "arguments": dict}``, in
    order. A segment starts where ``begin`` first occurs in the text; its JSON is read to its
    end, then ``end`` must follow (whitespace allowed). Raises ValueError naming the character
    offset of a segment that is not a call (an unconstrained output, or one cut short)."""
    calls: list[dict] = []
    parts: list[str] = []
    decoder = json.JSONDecoder()
    at = 0
    while True:
        k = text.find(begin, at)
        if k < 0:
            parts.append(text[at:])
            break
        parts.append(text[at:k])
        j = _skip_ws(text, k + len(begin))
        try:
            value, j = decoder.raw_decode(text, j)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call at offset {k}: not JSON ({e.msg} at offset {e.pos})") from None
        j = _skip_ws(text, j)
        if not text.startswith(end, j):
            raise ValueError(f"tool call at offset {k}: {end!r} expected at offset {j}")
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or "arguments" not in value:
            raise ValueError(f"tool call at offset {k}: not {{'name': str, 'arguments': ...}}: {value!r:.80}")
        calls.append({"name": value["name"], "arguments": value["arguments"]})
        at = j + len(end)
    return "".join(parts).strip(), calls


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
