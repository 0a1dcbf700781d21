"""``deepinfer serve`` with the embedded model, in a subprocess on a loopback port, driven by the
real ``openai`` client: structured outputs (json_schema, json_object, parse() with pydantic,
regex and choice through extra_body), streaming, n, completions, errors in OpenAI's shape,
the API key, a client that goes away, and a bounded load of concurrent clients."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Name one large city and its country, as JSON."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = dict(os.environ, DEEPINFER_API_KEY=KEY)
    cmd = [sys.executable, "-m", "deepinfer.serve", "--port", str(port), "--max-model-len", "1024",
           "--max-num-seqs", "32", "--seed", "0", "--max-waiting", "256", "--dspark", "off",
           "--timeout-keep-alive", "600"]  # fmt: skip
    # DSpark off: whether it drafts at a step follows measured step times, and a verify forward's
    # logits differ from decode's by rounding, so under a loaded machine a near tie could make a
    # streamed greedy answer differ from the same request unstreamed (--deterministic rules that
    # out too, at the cost of prefilling one request at a time). A long keep-alive: with the
    # default 5 s, the pooled connection the client (max_retries=0) picked once closed as a request
    # went out on it, and the request failed with "Server disconnected without sending a response"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("the server did not start in 180 s")
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _chat(client, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 48)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, **kw)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], {"deterministic": False, "dspark": True}),
        (["--deterministic", "--dspark", "on"], {"deterministic": True, "dspark": True}),
        (["--dspark", "off"], {"deterministic": False, "dspark": False}),
        ([], {"async_scheduling": None}),
        (["--async-scheduling", "off"], {"async_scheduling": False}),
        (["--async-scheduling", "on"], {"async_scheduling": True}),
        (
            ["--tensor-parallel-size", "2", "--data-parallel-size", "3", "--expert-parallel-size", "4"],
            {"tensor_parallel_size": 2, "data_parallel_size": 3, "expert_parallel_size": 4},
        ),
    ],
)
def test_serve_flags_reach_the_engine(monkeypatch, argv, expected):
    import deepinfer.serve as serve

    seen = {}
    monkeypatch.setattr(serve, "serve", lambda factory, **kw: seen.update(factory.keywords))
    serve.main(["m", *argv])
    assert {k: seen[k] for k in expected} == expected


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    text = httpx.get(server + "/metrics").text
    for name in (
        "deepinfer_requests_running",
        "deepinfer_kv_blocks_total",
        "deepinfer_time_to_first_token_seconds",
        "deepinfer_constraint_compile_seconds_total",
        "deepinfer_mask_seconds_total",
        'deepinfer_engine_steps_by_kind_total{kind="decode"}',
        'deepinfer_engine_step_seconds_total{kind="prefill"}',
    ):
        assert name in text
    assert "deepinfer_host_rows_ahead 0" in text.splitlines()  # (the CPU never waits for a device)
    setup = [line for line in text.splitlines() if line.startswith("deepinfer_constraint_setup_seconds ")]
    assert len(setup) == 1 and float(setup[0].split()[1]) > 0  # built before the server said ready


def _read_response(s: socket.socket) -> bytes:
    """One whole HTTP/1.1 response from ``s``: its head, then Content-Length bytes of body (a
    response may arrive in several segments; what is left must not open the next one)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    assert len(body) == length, body
    return head + b"\r\n\r\n" + body


def test_an_idle_connection_stays_open_for_the_keep_alive_timeout(server):
    # the fixture's --timeout-keep-alive 600 outlives uvicorn's 5 s default
    port = int(server.rsplit(":", 1)[1])
    get = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for wait in (0, 6):
            time.sleep(wait)
            s.sendall(get)
            assert _read_response(s).startswith(b"HTTP/1.1 200")


def test_json_schema_response_format_is_valid_json(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    r = _chat(client, response_format=fmt)
    data = json.loads(r.choices[0].message.content)
    jsonschema.validate(data, CITY)
    assert (
        r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    )


def test_parse_with_a_pydantic_model(client):
    class City(BaseModel):
        city: str
        country: str

    r = client.chat.completions.parse(
        model=MODEL, messages=ASK, response_format=City, max_tokens=64, temperature=0
    )
    assert isinstance(r.choices[0].message.parsed, City)


def test_json_object_regex_and_choice(client):
    r = _chat(client, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = _chat(client, extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,8}, [0-9]{4}"}})
    import re

    assert re.fullmatch(r"[A-Z][a-z]{2,8}, [0-9]{4}", r.choices[0].message.content)
    r = _chat(client, extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].message.content in ("yes", "no")


def test_stream_reassembles_to_the_non_streamed_text(client):
    kw = dict(max_tokens=24, seed=7, temperature=0.8)
    whole = _chat(client, **kw).choices[0].message.content
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_n_choices_and_completions(client):
    r = _chat(client, n=2, temperature=1.0, seed=3, max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1]
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert c.object == "text_completion" and c.choices[0].text and c.usage.completion_tokens == 5


def test_errors_in_openai_shape(server, client):
    bad_schema = {"type": "object", "properties": {"a": {"type": "nosuch"}}}
    with pytest.raises(openai.BadRequestError) as e:  # a schema that does not compile: its path
        _chat(
            client,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}},
        )
    assert "/properties/a" in str(e.value)
    with pytest.raises(openai.BadRequestError, match="packaged grammar"):  # never a path on the server
        _chat(client, extra_body={"structured_outputs": {"grammar": "/etc/passwd"}})
    with pytest.raises(openai.BadRequestError, match="'top_logprobs' needs 'logprobs': true"):
        _chat(client, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="'chat_template_kwargs' must be an object"):
        _chat(client, extra_body={"chat_template_kwargs": [1]})
    with pytest.raises(openai.BadRequestError, match="temperature"):
        _chat(client, temperature=7)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nothing", messages=ASK)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(server + "/v1/chat/completions", content=b"{" + b" " * (9 << 20) + b"}", headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: the server stops reading past its limit
        yield b"{"
        for _ in range(10):
            yield b" " * (1 << 20)

    r = httpx.post(server + "/v1/chat/completions", content=chunks(), headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = httpx.post(server + "/v1/chat/completions", content=b"not json",
                   headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert _chat(client, max_tokens=4).choices[0].message.content is not None  # still serving


def test_a_client_that_goes_away_aborts_its_request(server, client):
    def aborted() -> int:
        for line in httpx.get(server + "/metrics").text.splitlines():
            if line.startswith('deepinfer_requests_total{finish_reason="abort"}'):
                return int(float(line.split()[-1]))
        return 0

    before = aborted()
    with httpx.stream("POST", server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"messages": ASK, "max_tokens": 400, "stream": True, "temperature": 0},
                      timeout=60) as r:  # fmt: skip
        for i, _ in enumerate(r.iter_lines()):
            if i > 4:
                break
    deadline = time.time() + 30
    while aborted() == before and time.time() < deadline:
        time.sleep(0.2)
    assert aborted() == before + 1
    text = httpx.get(server + "/metrics").text  # its KV blocks are back
    assert "deepinfer_requests_running 0" in text and "deepinfer_kv_blocks_used 0" in text


def _finished(server) -> dict[str, int]:
    """deepinfer_requests_total by finish reason, from /metrics."""
    out = {}
    for line in httpx.get(server + "/metrics").text.splitlines():
        if line.startswith("deepinfer_requests_total{"):
            out[line.split('"')[1]] = int(float(line.split()[-1]))
    return out


def test_load_64_clients_some_cancelled(server, client):
    """64 concurrent clients x 4 requests on loopback, constrained and free mixed, one request
    in eight streamed and dropped after its first chunks: every other request completes exactly
    once and is valid, the dropped ones are aborted, and the server is healthy and empty after."""
    before = _finished(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}

    def one(i: int):
        if i % 8 == 7:  # a client that goes away mid-stream
            with httpx.stream("POST", server + "/v1/chat/completions",
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                              json={"messages": ASK, "max_tokens": 300, "stream": True,
                                    "temperature": 0.7, "seed": i}) as r:  # fmt: skip
                for k, _ in enumerate(r.iter_lines()):
                    if k >= 3:
                        break
            return None
        if i % 2:
            r = _chat(client, max_tokens=40, response_format=fmt)
            jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
        else:
            r = _chat(client, max_tokens=6, temperature=0.7, seed=i)
            assert r.choices[0].finish_reason in ("stop", "length")
        return r.id

    def client_task(c: int):
        return [one(4 * c + j) for j in range(4)]

    with cf.ThreadPoolExecutor(64) as pool:
        ids = [x for xs in pool.map(client_task, range(64)) for x in xs]
    done = [x for x in ids if x is not None]
    assert len(done) == 224 and len(set(done)) == 224  # each answered once
    deadline = time.time() + 30
    while time.time() < deadline:
        after = _finished(server)
        if after.get("abort", 0) - before.get("abort", 0) >= 32:
            break
        time.sleep(0.2)
    completed = sum(after.get(k, 0) - before.get(k, 0) for k in ("stop", "length"))
    assert completed == 224 and after.get("abort", 0) - before.get("abort", 0) == 32
    assert after.get("error", 0) == before.get("error", 0)
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    text = httpx.get(server + "/metrics").text
    assert "deepinfer_requests_running 0" in text and "deepinfer_kv_blocks_used 0" in text


def test_logprobs_chat_completions_and_stream(client):
    r = _chat(client, logprobs=True, top_logprobs=3, max_tokens=8)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert b"".join(bytes(t.bytes) for t in lp).decode() == r.choices[0].message.content
    for t in lp:  # greedy: the chosen token is the most likely one
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert [x.logprob for x in t.top_logprobs] == sorted(
            (x.logprob for x in t.top_logprobs), reverse=True
        )
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)
    chunks = list(_chat(client, logprobs=True, max_tokens=8, stream=True))
    streamed = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in lp]
    c = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, temperature=0, logprobs=2)
    lc = c.choices[0].logprobs
    assert len(lc.tokens) == len(lc.token_logprobs) == len(lc.top_logprobs) == 4
    assert "".join(lc.tokens) == c.choices[0].text and lc.text_offset[0] == 0


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}},
                       "required": ["query"], "additionalProperties": False}}},
]  # fmt: skip
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Use a tool."}]


def _valid_calls(calls, allowed=("get_weather", "search")):
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in allowed
        jsonschema.validate(json.loads(c.function.arguments), params[c.function.name])


def test_tool_choice_required_and_named(client):
    # one call (the small model, free to call again, may repeat its call until max_tokens)
    r = _chat(client, messages=WEATHER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=80)  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
    _valid_calls(r.choices[0].message.tool_calls)
    named = {"type": "function", "function": {"name": "search"}}
    r = _chat(client, messages=WEATHER, tools=TOOLS, tool_choice=named, max_tokens=80)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    _valid_calls(calls, ("search",))
    # streamed: the same call (greedy), whole in the last chunk
    chunks = list(_chat(client, messages=WEATHER, tools=TOOLS, tool_choice=named, max_tokens=80, stream=True))
    streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_tool_choice_auto_and_a_conversation_with_tool_results(client):
    r = _chat(client, messages=WEATHER, tools=TOOLS, max_tokens=80)  # auto: text or valid calls
    m = r.choices[0].message
    if m.tool_calls:
        _valid_calls(m.tool_calls)
        assert r.choices[0].finish_reason == "tool_calls"
    else:
        assert m.content and r.choices[0].finish_reason in ("stop", "length")
    history = WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]  # fmt: skip
    r = _chat(client, messages=history, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_tool_errors(client):
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        unknown = {"type": "function", "function": {"name": "x"}}
        _chat(client, messages=WEATHER, tools=TOOLS, tool_choice=unknown)
    with pytest.raises(openai.BadRequestError, match="not both"):
        _chat(client, messages=WEATHER, tools=TOOLS, response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]"):
        _chat(client, messages=WEATHER, tools=[{"type": "function", "function": {"parameters": {}}}])


def test_reasoning_then_json(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    extra = {"reasoning": ["<think>", "</think>"], "max_reasoning_tokens": 8}
    r = _chat(client, response_format=fmt, extra_body=extra, max_tokens=64)
    m = r.choices[0].message
    jsonschema.validate(json.loads(m.content), CITY)
    assert isinstance(m.model_extra["reasoning_content"], str) and "</think>" not in m.content
    chunks = list(_chat(client, response_format=fmt, extra_body=extra, max_tokens=64, stream=True))
    got = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in got) == m.content
    blocks = [d.model_extra.get("reasoning_content") for d in got]
    assert [b for b in blocks if b] == [m.model_extra["reasoning_content"]]
