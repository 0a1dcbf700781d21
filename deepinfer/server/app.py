"""The FastAPI app of ``deepinfer serve``: OpenAI's chat completions, completions and models
endpoints, /health and /metrics, over one ``EngineLoop``.

Handlers parse and check a request (protocol.py), submit it to the engine loop, and await its
outputs; they never run model code. A request that fails (a constraint that does not compile,
a prompt too long) answers 400 alone; a client that disconnects aborts its request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from . import tools as tool_use
from .engine_loop import EngineLoop, QueueFull
from .logprobs import TokenTexts, chat_logprobs, completion_logprobs
from .protocol import APIError, bad, messages_of, n_of, sampling_params

MAX_BODY_BYTES = 8 << 20


def create_app(loop: EngineLoop, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:  # fmt: skip
    app = FastAPI(title="DeepInfer", docs_url=None, redoc_url=None)
    created = int(time.time())
    texts = TokenTexts(loop.info["token_bytes"])

    def logprobs_obj(kind: str, entries, offset: int = 0) -> dict | None:
        if entries is None:
            return None
        if kind == "chat":
            return chat_logprobs(entries, texts)
        return completion_logprobs(entries, texts, offset)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        return JSONResponse(bad(f"invalid request: {e.errors()[:1]}").body(), status_code=400)

    def authorize(request: Request) -> None:
        """401 unless the request carries the API key (when the server has one)."""
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                               type="authentication_error", code="invalid_api_key")  # fmt: skip

    async def body_of(request: Request) -> dict:
        authorize(request)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            raise APIError(
                413, f"request body of {size} bytes exceeds {max_body_bytes}", code="body_too_large"
            )
        parts, got = [], 0
        async for part in request.stream():  # read at most max_body_bytes + 1 (chunked bodies too)
            got += len(part)
            if got > max_body_bytes:
                raise APIError(413, f"request body exceeds {max_body_bytes} bytes", code="body_too_large")
            parts.append(part)
        raw = b"".join(parts)
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise bad(f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise bad("the body must be a JSON object")
        model = body.get("model")
        if model not in (None, model_name):
            raise APIError(404, f"the model {model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")  # fmt: skip
        return body

    def submit(payload: tuple, params, n: int, stream: bool) -> tuple[list, asyncio.Queue]:
        """The n choices of one HTTP request, queued; their outputs arrive on one queue."""
        if not loop.alive:
            raise APIError(503, "the engine has stopped", type="server_error")
        q: asyncio.Queue = asyncio.Queue()
        rids: list = []
        try:
            for i in range(n):
                rids.append(loop.submit(payload, params_for(i, params), q, stream=stream))
        except QueueFull as e:
            for rid in rids:
                loop.abort(rid)
            raise APIError(429, str(e), type="rate_limit_error", headers={"Retry-After": "1"}) from None
        return rids, q

    async def outputs(request: Request, q: asyncio.Queue):
        """The outputs on ``q`` as they come, in batches: all that are queued when the handler
        runs (a slow client gets fewer, larger chunks). Every second without one, the client is
        checked: gone, its requests are aborted (CancelledError)."""
        while True:
            if q.empty():
                try:
                    item = await asyncio.wait_for(q.get(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        raise asyncio.CancelledError from None
                    continue
                items = [item]
            else:
                items = []
            while not q.empty():
                items.append(q.get_nowait())
            for item in items:
                if isinstance(item, BaseException):
                    raise APIError(500, f"the engine failed: {item}", type="server_error")
            yield items

    async def collect(request: Request, rids: list, q: asyncio.Queue) -> list:
        """The final output of each request (aborted if the client goes away meanwhile)."""
        index = {rid: i for i, rid in enumerate(rids)}
        finals: list = [None] * len(rids)
        left = len(rids)
        try:
            async for items in outputs(request, q):
                for o in items:
                    finals[index[o.request_id]] = o
                    left -= 1
                if not left:
                    return finals
        except asyncio.CancelledError:
            for rid in rids:
                loop.abort(rid)
            raise
        return finals

    def params_for(i: int, params):
        if i == 0 or params.seed is None:
            return params
        from dataclasses import replace

        return replace(params, seed=params.seed + i)  # n choices: different draws, reproducible

    def failed(o) -> None:
        if o is not None and o.finish_reason == "error":
            raise bad(o.error or "the request failed")

    def usage(outs) -> dict:
        p = outs[0].prompt_tokens if outs else 0
        c = sum(o.num_tokens for o in outs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def finish_reason(o, calls=()) -> str:
        if calls:
            return "tool_calls"
        return o.finish_reason if o.finish_reason in ("stop", "length") else "stop"

    async def run(request: Request, body: dict, payload: tuple, kind: str, treq=None):
        fields = tool_use.sampling_fields(treq) if treq is not None else None
        params = sampling_params(body, max_tokens_field=("max_tokens", "max_completion_tokens"), kind=kind,
                                 tools=fields)  # fmt: skip
        n = n_of(body)
        stream = bool(body.get("stream"))
        rid0 = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        rids, q = submit(payload, params, n, stream)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                stream_events(request, rids, q, rid0, kind, include_usage, treq is not None),
                media_type="text/event-stream",
            )
        outs = await collect(request, rids, q)
        for o in outs:
            failed(o)
        obj = "chat.completion" if kind == "chat" else "text_completion"
        choices = []
        for i, o in enumerate(outs):
            content, calls = tool_use.tool_calls(o.text) if treq is not None else (o.text, [])
            lp = logprobs_obj(kind, o.logprobs)
            c = {"index": i, "finish_reason": finish_reason(o, calls), "logprobs": lp}
            if kind == "chat":
                c["message"] = {"role": "assistant", "content": content}
                if o.reasoning is not None:
                    c["message"]["reasoning_content"] = o.reasoning
                if calls:
                    c["message"]["tool_calls"] = calls
            else:
                c["text"] = o.text
            choices.append(c)
        return {"id": rid0, "object": obj, "created": int(time.time()), "model": model_name,
                "choices": choices, "usage": usage(outs)}  # fmt: skip

    async def stream_events(request: Request, rids: list, q, rid0: str, kind: str, include_usage: bool,
                            tools: bool = False):  # fmt: skip
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        now = int(time.time())
        head = f'{{"id": "{rid0}", "object": "{obj}", "created": {now}, "model": {json.dumps(model_name)}, '

        def event(choices, **extra) -> str:
            tail = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items())
            return f'data: {head}"choices": {json.dumps(choices)}{tail}}}\n\n'

        index = {rid: i for i, rid in enumerate(rids)}
        sent = ["" for _ in rids]
        sent_lp = [0] * len(rids)  # logprob entries sent, per choice
        finals: list = [None] * len(rids)
        left = len(rids)
        chunk: list[str] = []
        if kind == "chat":
            yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                         for i in range(len(rids))])  # fmt: skip
        try:
            async for items in outputs(request, q):
                chunk: list[str] = []  # this batch's events, sent in one write
                latest: dict[int, Any] = {}  # per choice, its newest output (each holds all text so far)
                for o in items:
                    i = index[o.request_id]
                    if latest.get(i) is None or not latest[i].finished:
                        latest[i] = o
                for i, item in latest.items():
                    if item.finished:
                        left -= 1
                        finals[i] = item
                    if item.finish_reason == "error":
                        err = bad(item.error or "the request failed").body()
                        chunk.append(f"data: {json.dumps(err)}\n\n")
                        continue
                    calls: list = []
                    if not tools:
                        text = item.text
                    elif item.finished:  # the calls, whole, in the last chunk
                        text, calls = tool_use.tool_calls(item.text)
                        text = text or ""
                    else:  # content only up to a call
                        text = tool_use.visible_text(item.text)
                    delta, sent[i] = text[len(sent[i]) :] if text.startswith(sent[i]) else text, text
                    reason = finish_reason(item, calls) if item.finished else None
                    lp = None
                    if item.logprobs is not None and len(item.logprobs) > sent_lp[i]:
                        lp = logprobs_obj(kind, item.logprobs[sent_lp[i] :], len(text) - len(delta))
                        sent_lp[i] = len(item.logprobs)
                    if delta or reason or lp or item.reasoning is not None:
                        if kind == "chat":
                            choice = {"index": i, "delta": {"content": delta} if delta else {},
                                      "finish_reason": reason}  # fmt: skip
                            if item.reasoning is not None:
                                choice["delta"]["reasoning_content"] = item.reasoning
                            if calls:
                                choice["delta"]["tool_calls"] = [dict(c, index=k)
                                                                 for k, c in enumerate(calls)]  # fmt: skip
                        else:
                            choice = {"index": i, "text": delta, "finish_reason": reason}
                        if lp is not None:
                            choice["logprobs"] = lp
                        chunk.append(event([choice]))
                if not left:
                    break
                if chunk:
                    yield "".join(chunk)
            # the last events, the usage and [DONE] in one write
            if include_usage:
                chunk.append(event([], usage=usage([f for f in finals if f is not None])))
            chunk.append("data: [DONE]\n\n")
            yield "".join(chunk)
        except APIError as err:
            yield f"data: {json.dumps(err.body())}\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            for rid in rids:
                loop.abort(rid)
            raise

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await body_of(request)
        treq = tool_use.tool_request(body)
        native = tool_use.template_renders_tools(loop.info.get("chat_template"))
        msgs, kw = tool_use.prompt_messages(messages_of(body), treq, native)
        extra = body.get("chat_template_kwargs")
        if extra is not None:
            if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
                raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs")
            kw = {**extra, **kw}
        return await run(request, body, ("chat", msgs, kw), "chat", treq)  # rendered by the engine

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not (
            isinstance(prompt, str)
            or (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            )
        ):
            raise bad("'prompt' must be a string or a list of token ids", "prompt")  # fmt: skip
        return await run(request, body, ("prompt", prompt), "completions")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "deepinfer"}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if not loop.alive:
            return JSONResponse({"status": "error", "error": str(loop.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus(loop), media_type="text/plain; version=0.0.4")

    return app


METRICS = ("running", "waiting", "kv_blocks_total", "kv_blocks_used", "prefix_cache_hit_tokens",
           "prefill_tokens", "preemptions", "constraints_compiled", "constraint_compile_seconds",
           "constraint_setup_seconds", "mask_seconds", "mask_wait_seconds", "decode_steps_ahead",
           "decode_steps_ahead_taken", "host_rows_ahead")  # fmt: skip
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def prometheus(loop: EngineLoop) -> str:
    """Prometheus text: requests by finish reason, tokens, TTFT / TPOT histograms, queue, KV,
    constraint compile and mask time, engine steps and their seconds by kind."""
    st = loop.stats
    m = dict.fromkeys(METRICS, 0)
    m.update(loop.engine_metrics)  # the engine's, as of its latest step
    lines = ["# TYPE deepinfer_requests_total counter"]
    for reason, n in sorted(st.requests.items()):
        lines.append(f'deepinfer_requests_total{{finish_reason="{reason}"}} {n}')
    for name, value, kind in (
        ("deepinfer_prompt_tokens_total", st.prompt_tokens, "counter"),
        ("deepinfer_generation_tokens_total", st.generated_tokens, "counter"),
        ("deepinfer_requests_running", m["running"], "gauge"),
        ("deepinfer_requests_waiting", m["waiting"], "gauge"),
        ("deepinfer_kv_blocks_total", m["kv_blocks_total"], "gauge"),
        ("deepinfer_kv_blocks_used", m["kv_blocks_used"], "gauge"),
        ("deepinfer_prefix_cache_hit_tokens_total", m["prefix_cache_hit_tokens"], "counter"),
        ("deepinfer_prefill_tokens_total", m["prefill_tokens"], "counter"),
        ("deepinfer_preemptions_total", m["preemptions"], "counter"),
        ("deepinfer_engine_steps_total", st.steps, "counter"),
        ("deepinfer_constraints_compiled_total", m["constraints_compiled"], "counter"),
        ("deepinfer_constraint_compile_seconds_total", m["constraint_compile_seconds"], "counter"),
        ("deepinfer_constraint_setup_seconds", m["constraint_setup_seconds"], "gauge"),
        ("deepinfer_mask_seconds_total", m["mask_seconds"], "counter"),
        ("deepinfer_mask_wait_seconds_total", m["mask_wait_seconds"], "counter"),
        ("deepinfer_decode_steps_ahead_total", m["decode_steps_ahead"], "counter"),
        ("deepinfer_decode_steps_ahead_taken_total", m["decode_steps_ahead_taken"], "counter"),
        ("deepinfer_host_rows_ahead", int(m["host_rows_ahead"]), "gauge"),
    ):
        lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
    for name, key in (("deepinfer_engine_steps_by_kind_total", "_steps"),
                      ("deepinfer_engine_step_seconds_total", "_step_seconds")):  # fmt: skip
        lines.append(f"# TYPE {name} counter")
        kinds = [k[: -len("_step_seconds")] for k in m if k.endswith("_step_seconds")]
        lines += [f'{name}{{kind="{k}"}} {m[k + key]}' for k in kinds]
    for name, xs in (("deepinfer_time_to_first_token_seconds", st.ttft),
                     ("deepinfer_time_per_output_token_seconds", st.tpot)):  # fmt: skip
        xs = list(xs)
        lines.append(f"# TYPE {name} histogram")
        for b in BUCKETS:
            lines.append(f'{name}_bucket{{le="{b}"}} {sum(x <= b for x in xs)}')
        lines += [f'{name}_bucket{{le="+Inf"}} {len(xs)}', f"{name}_sum {sum(xs)}", f"{name}_count {len(xs)}"]
    return "\n".join(lines) + "\n"
