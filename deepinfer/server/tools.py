"""OpenAI tool calling over ``deepinfer.tool_calls``: ``tools``, ``tool_choice`` and
``parallel_tool_calls`` -> the prompt and the constraint; the generated text -> ``tool_calls``.

The call format is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen).
A chat template that renders tools itself (it reads ``tools``) gets them as OpenAI sends them;
for one that does not (SmolLM2's), the tools are described in a system message, assistant
``tool_calls`` in the history are written in the call format and ``tool`` messages become
``<tool_response>`` blocks of a user turn.

- ``"none"``: no tools in the prompt, no calls;
- ``"auto"``: text, in which every call that starts is enforced (a structural tag);
- ``"required"``: calls only, at least one; a named function: exactly one call of it (a
  grammar of calls, each call's JSON under its schema).
With ``parallel_tool_calls: false`` at most one call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from .protocol import bad

SYSTEM = (
    "You can call functions to answer. Their signatures, as JSON, are inside <tools></tools>:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call one, write a JSON object with the function's name and its arguments inside "
    "<tool_call></tool_call> tags:\n"
    '<tool_call>{{"name": <function name>, "arguments": <arguments as a JSON object>}}</tool_call>'
)


@dataclass
class ToolRequest:
    tools: list[dict]  # as sent (validated)
    choice: str  # "auto", "required" or "named"
    parallel: bool
    allowed: list[dict]  # the tools a call may name (the named one, or all)


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tool settings, or None when it calls no tools (none given, or "none")."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad("'functions' and 'function_call' are deprecated: use 'tools' and 'tool_choice'",
                  "functions")  # fmt: skip
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise bad("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise bad("'tools' must be a non-empty list of functions", "tools")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}].function.name must be a non-empty string", f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters must be a JSON Schema object",
                      f"tools[{i}].function.parameters")  # fmt: skip
        names.append(fn["name"])
    if choice is None or choice == "auto":
        return ToolRequest(tools, "auto", parallel, tools)
    if choice == "none":
        return None
    if choice == "required":
        return ToolRequest(tools, "required", parallel, tools)
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and choice.get("type") == "function":
        name = fn.get("name")
        if name not in names:
            raise bad(f"'tool_choice' names the function {name!r}, not in 'tools' ({', '.join(names)})",
                      "tool_choice")  # fmt: skip
        return ToolRequest(tools, "named", False, [tools[names.index(name)]])
    raise bad("'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
              "{'name': ...}}", "tool_choice")  # fmt: skip


def sampling_fields(req: ToolRequest) -> dict[str, Any]:
    """The SamplingParams fields that enforce the calls: for "auto" structural tags (text,
    in which a call that starts is enforced); otherwise a grammar of calls only. 400 naming
    the tool whose schema is at fault."""
    from ..tool_calls import tool_call_grammar, tool_call_params

    try:
        if req.choice == "auto":
            return tool_call_params(req.allowed, parallel=req.parallel)
        return {"grammar": tool_call_grammar(req.allowed, parallel=req.parallel)}
    except ValueError as e:
        raise bad(str(e), "tools") from None


def template_renders_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def prompt_messages(messages: list[dict], req: ToolRequest | None, native: bool) -> tuple[list[dict], dict]:
    """(messages, chat_template kwargs) for the chat template: ``native`` templates get
    ``tools`` and the history as is; others a system message and calls written as text."""
    if native:
        return messages, ({"tools": req.tools} if req is not None else {})
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "".join(
                f'<tool_call>{{"name": {json.dumps(c["function"]["name"])}, '
                f'"arguments": {c["function"].get("arguments") or "{}"}}}</tool_call>'
                for c in m["tool_calls"]
            )
            out.append({"role": "assistant", "content": (m.get("content") or "") + calls})
        elif m["role"] == "tool":
            response = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            out.append({"role": "user", "content": response})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if req is not None:
        described = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in req.allowed)
        system = SYSTEM.format(tools=described)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, {}


def tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI ``tool_calls``) of a finished output: the text around the calls (None
    when empty) and each call with a fresh id and its arguments as a JSON string."""
    from ..tool_calls import parse_tool_calls

    try:
        content, calls = parse_tool_calls(text)
    except ValueError:  # a call cut short (max_tokens): the text stays content
        return text, []
    out = [
        {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
         "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
        for c in calls
    ]  # fmt: skip
    return content or None, out


def visible_text(text: str) -> str:
    """The part of a streamed text that is surely content: up to the first call, and short of
    a possible call tag at its end."""
    from ..tool_calls import BEGIN

    k = text.find(BEGIN)
    if k >= 0:
        return text[:k]
    for n in range(min(len(BEGIN) - 1, len(text)), 0, -1):
        if text.endswith(BEGIN[:n]):
            return text[:-n]
    return text
