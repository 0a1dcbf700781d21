"""OpenAI request bodies -> (prompt, SamplingParams); errors in OpenAI's shape.

Fields follow OpenAI's semantics; what OpenAI lacks is named as vLLM names it, so existing
clients work: ``structured_outputs`` ({"json" | "regex" | "choice" | "grammar"}), the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, ``top_k``,
``min_p``. Over HTTP a grammar is grammar text or the name of a packaged grammar, never a path
on the server.
"""

from __future__ import annotations

from typing import Any

from ..sampling_params import MAX_LOGPROBS, SamplingParams

MAX_N = 16


class APIError(Exception):
    """An error returned as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


UNSUPPORTED = {  # fields this server refuses rather than ignore (the answer would be wrong)
    "logit_bias": "logit_bias is not supported",
}


def _number(body: dict, name: str, default, lo, hi, kind=(int, float)):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, kind) or not lo <= v <= hi:
        raise bad(f"'{name}' must be a number in [{lo}, {hi}], got {v!r}", name)
    return v


def _grammar(spec: Any, param: str) -> str:
    from .. import grammars

    if not isinstance(spec, str) or not spec.strip():
        raise bad(f"'{param}' must be grammar text or the name of a packaged grammar", param)
    names = set(grammars.available())
    if spec.removesuffix(".lark") in names:
        return spec.removesuffix(".lark")
    if ":" not in spec:  # grammar text always has a rule "name: ..."; a path on the server never
        raise bad(
            f"'{param}' is neither grammar text nor a packaged grammar ({', '.join(sorted(names))})", param
        )
    return spec


def constraint(body: dict) -> dict:
    """The SamplingParams constraint fields of a request (at most one constraint)."""
    found: dict[str, Any] = {}

    def put(kind: str, value: Any, param: str) -> None:
        if found:
            raise bad(f"give one constraint, got {sorted(found)[0]!r} and {param!r}", param)
        found[kind] = (value, param)

    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise bad(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format"
            )
        if rf["type"] == "json_object":
            put("json_schema", {"type": "object"}, "response_format")
        elif rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise bad("'response_format.json_schema.schema' must be a JSON Schema object",
                          "response_format.json_schema")  # fmt: skip
            put("json_schema", js.get("schema", {}), "response_format")
            if js.get("strict"):
                found["strict"] = (True, "response_format")
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict) or len(so) != 1:
            raise bad(
                "'structured_outputs' takes one of 'json', 'regex', 'choice', 'grammar'", "structured_outputs"
            )
        ((k, v),) = so.items()
        if k not in ("json", "regex", "choice", "grammar"):
            raise bad(f"'structured_outputs.{k}' is not supported", "structured_outputs")
        put({"json": "json_schema"}.get(k, k), v, f"structured_outputs.{k}")
    for k in ("json", "regex", "choice", "grammar"):
        v = body.get(f"guided_{k}")
        if v is not None:
            put({"json": "json_schema"}.get(k, k), v, f"guided_{k}")
    out = {}
    for kind, (value, param) in found.items():
        if kind == "grammar":
            value = _grammar(value, param)
        if kind == "json_schema" and isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except ValueError as e:
                raise bad(f"'{param}' is not valid JSON: {e}", param) from None
        if kind == "choice" and (not isinstance(value, list) or not all(isinstance(c, str) for c in value)):
            raise bad(f"'{param}' must be a list of strings", param)
        if kind == "regex" and not isinstance(value, str):
            raise bad(f"'{param}' must be a string", param)
        out[kind] = value
    return out


def logprobs_of(body: dict, kind: str) -> int | None:
    """SamplingParams.logprobs: chat's ``logprobs`` (bool) + ``top_logprobs`` (0-20), or
    completions' ``logprobs`` (the number of alternatives, 0-20)."""
    if kind == "chat":
        on = body.get("logprobs")
        if on is not None and not isinstance(on, bool):
            raise bad("'logprobs' must be a boolean", "logprobs")
        top = _number(body, "top_logprobs", None, 0, MAX_LOGPROBS, int)
        if top is not None and not on:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return (top or 0) if on else None
    return _number(body, "logprobs", None, 0, MAX_LOGPROBS, int)


def sampling_params(
    body: dict,
    *,
    max_tokens_field: tuple[str, ...] = ("max_tokens",),
    kind: str = "chat",
    tools: dict | None = None,
) -> SamplingParams:
    """SamplingParams from an OpenAI body (chat or completions); ``tools``: the fields that
    enforce tool calls (server/tools.py). Raises APIError(400)."""
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, False, [], 0):
            raise bad(why, name)
    max_tokens = None
    for name in max_tokens_field:
        if body.get(name) is not None:
            max_tokens = _number(body, name, None, 1, 1 << 24, int)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad("'stop' must be a string or a list of strings", "stop")
    kw = dict(
        max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, 0, 2)),
        top_p=float(_number(body, "top_p", 1.0, 0, 1)),
        top_k=int(_number(body, "top_k", 0, -1, 1 << 30, int)),
        min_p=float(_number(body, "min_p", 0.0, 0, 1)),
        seed=body.get("seed"),
        stop=stop or None,
        logprobs=logprobs_of(body, kind),
    )
    if kw["top_p"] == 0:
        kw["top_p"] = 1e-8
    r = body.get("reasoning")
    if r is not None:
        pair = isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
        if not (isinstance(r, bool) or pair):
            raise bad("'reasoning' must be a boolean or a [begin, end] pair of strings", "reasoning")
        kw["reasoning"] = tuple(r) if isinstance(r, list) else (r or None)
        kw["max_reasoning_tokens"] = _number(body, "max_reasoning_tokens", None, 0, 1 << 24, int)
    given = constraint(body)
    if tools and given:
        raise bad("give 'tools' or a structured output ('response_format', 'structured_outputs'), not both",
                  "tools")  # fmt: skip
    kw.update(given)
    kw.update(tools or {})
    try:
        return SamplingParams(**kw)
    except (ValueError, TypeError) as e:
        raise bad(str(e)) from None


def n_of(body: dict) -> int:
    return int(_number(body, "n", 1, 1, MAX_N, int))


def messages_of(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined
            texts = []
            for j, part in enumerate(content):
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise bad(f"messages[{i}].content[{j}]: only text parts are supported", f"messages[{i}]")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}]")
        msg = {"role": m["role"], "content": content or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _calls(m["tool_calls"], f"messages[{i}].tool_calls")
        if m["role"] == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
        out.append(msg)
    return out


def _calls(calls: Any, where: str) -> list[dict]:
    """An assistant message's ``tool_calls`` (history), checked: each a function call whose
    arguments are a JSON string."""
    if not isinstance(calls, list):
        raise bad(f"{where} must be a list", where)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", "{}"), str)
        ):
            raise bad(f"{where}[{j}] must be {{'function': {{'name': str, 'arguments': str}}}}", where)
        out.append({"id": c.get("id"), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn.get("arguments", "{}")}})  # fmt: skip
    return out
