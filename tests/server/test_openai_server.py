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
           "--max-num-seqs", "16", "--seed", "0", "--max-waiting", "64"]  # fmt: skip
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


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    text = httpx.get(server + "/metrics").text
    for name in (
        "deepinfer_requests_running",
        "deepinfer_kv_blocks_total",
        "deepinfer_time_to_first_token_seconds",
    ):
        assert name in text


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
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        _chat(client, logprobs=True)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        _chat(client, temperature=7)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nothing", messages=ASK)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).models.list()
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(server + "/v1/chat/completions", content=b"{" + b" " * (9 << 20) + b"}", headers=auth)
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


def test_concurrent_clients_each_get_one_answer(server, client):
    """16 clients x 2 requests, constrained and free mixed, on loopback: each completes once."""

    def one(i: int):
        if i % 2:
            fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
            r = _chat(client, max_tokens=40, response_format=fmt)
            jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
        else:
            r = _chat(client, max_tokens=12, temperature=0.7, seed=i)
        return r.id

    with cf.ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(one, range(32)))
    assert len(set(ids)) == 32
    assert httpx.get(server + "/health").json() == {"status": "ok"}
