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

from .engine_loop import EngineLoop, QueueFull
from .protocol import APIError, bad, messages_of, n_of, sampling_params

MAX_BODY_BYTES = 8 << 20


def create_app(loop: EngineLoop, *, model_name: str, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:  # fmt: skip
    app = FastAPI(title="DeepInfer", docs_url=None, redoc_url=None)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        return JSONResponse(bad(f"invalid request: {e.errors()[:1]}").body(), status_code=400)

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        if request.url.path.startswith("/v1/") and api_key is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                e = APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                             type="authentication_error", code="invalid_api_key")  # fmt: skip
                return JSONResponse(e.body(), status_code=401)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            e = APIError(413, f"request body of {size} bytes exceeds {max_body_bytes}", code="body_too_large")
            return JSONResponse(e.body(), status_code=413)
        return await call_next(request)

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        if len(raw) > max_body_bytes:
            raise APIError(
                413, f"request body of {len(raw)} bytes exceeds {max_body_bytes}", code="body_too_large"
            )
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

    def submit(prompt: Any, params) -> tuple[Any, asyncio.Queue]:
        if not loop.alive:
            raise APIError(503, "the engine has stopped", type="server_error")
        try:
            return loop.submit(prompt, params)
        except QueueFull as e:
            raise APIError(429, str(e), type="rate_limit_error", headers={"Retry-After": "1"}) from None

    async def collect(request: Request, rid: Any, q: asyncio.Queue):
        """The final output of one request (aborted if the client goes away meanwhile)."""
        final = None
        while True:
            try:
                item = await asyncio.wait_for(q.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    loop.abort(rid)
                continue
            if item is None:
                return final
            if isinstance(item, BaseException):
                raise APIError(500, f"the engine failed: {item}", type="server_error")
            if item.finished:
                final = item

    def params_for(i: int, params):
        if i == 0 or params.seed is None:
            return params
        from dataclasses import replace

        return replace(params, seed=params.seed + i)  # n choices: different draws, reproducible

    def failed(o) -> None:
        if o is not None and o.finish_reason == "error":
            raise bad(o.error or "the request failed")

    def usage(outs) -> dict:
        p = len(outs[0].prompt_token_ids) if outs else 0
        c = sum(len(o.token_ids) for o in outs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def run(request: Request, body: dict, prompt: Any, kind: str):
        params = sampling_params(body, max_tokens_field=("max_tokens", "max_completion_tokens"))
        n = n_of(body)
        stream = bool(body.get("stream"))
        rid0 = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        subs = [submit(prompt, params_for(i, params)) for i in range(n)]
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                stream_events(request, subs, rid0, kind, include_usage), media_type="text/event-stream"
            )
        outs = await asyncio.gather(*(collect(request, rid, q) for rid, q in subs))
        for o in outs:
            failed(o)
        obj = "chat.completion" if kind == "chat" else "text_completion"
        choices = []
        for i, o in enumerate(outs):
            reason = o.finish_reason if o.finish_reason in ("stop", "length") else "stop"
            if kind == "chat":
                choices.append({"index": i, "message": {"role": "assistant", "content": o.text},
                                "finish_reason": reason, "logprobs": None})  # fmt: skip
            else:
                choices.append({"index": i, "text": o.text, "finish_reason": reason, "logprobs": None})
        return {"id": rid0, "object": obj, "created": int(time.time()), "model": model_name,
                "choices": choices, "usage": usage(outs)}  # fmt: skip

    async def stream_events(request: Request, subs, rid0: str, kind: str, include_usage: bool):
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        now = int(time.time())

        def event(choices, **extra) -> str:
            d = {"id": rid0, "object": obj, "created": now, "model": model_name, "choices": choices}
            d.update(extra)
            return f"data: {json.dumps(d)}\n\n"

        sent = ["" for _ in subs]
        finals: list = [None] * len(subs)
        if kind == "chat":
            yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                         for i in range(len(subs))])  # fmt: skip
        queues = {i: q for i, (_, q) in enumerate(subs)}
        try:
            while queues:
                for i, q in list(queues.items()):
                    try:
                        item = await asyncio.wait_for(q.get(), timeout=0.05 if len(queues) > 1 else 0.5)
                    except TimeoutError:
                        if await request.is_disconnected():
                            raise asyncio.CancelledError from None
                        continue
                    if item is None:
                        del queues[i]
                        continue
                    if isinstance(item, BaseException):
                        err = APIError(500, f"the engine failed: {item}", type="server_error")
                        yield f"data: {json.dumps(err.body())}\n\n"
                        return
                    if item.finish_reason == "error":
                        yield f"data: {json.dumps(bad(item.error or 'the request failed').body())}\n\n"
                        del queues[i]
                        continue
                    text = item.text
                    delta, sent[i] = text[len(sent[i]) :] if text.startswith(sent[i]) else text, text
                    reason = None
                    if item.finished:
                        finals[i] = item
                        reason = item.finish_reason if item.finish_reason in ("stop", "length") else "stop"
                    if delta or reason:
                        if kind == "chat":
                            choice = {
                                "index": i,
                                "delta": {"content": delta} if delta else {},
                                "finish_reason": reason,
                            }
                        else:
                            choice = {"index": i, "text": delta, "finish_reason": reason}
                        yield event([choice])
            if include_usage:
                yield event([], usage=usage([f for f in finals if f is not None]))
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            for rid, _ in subs:
                loop.abort(rid)
            raise

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await body_of(request)
        prompt = loop.llm.chat_prompt(messages_of(body))
        return await run(request, body, prompt, "chat")

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
        return await run(request, body, prompt, "completions")

    @app.get("/v1/models")
    async def models():
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


BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def prometheus(loop: EngineLoop) -> str:
    """Prometheus text: requests by finish reason, tokens, TTFT / TPOT histograms, queue, KV."""
    st = loop.stats
    m = loop.llm.metrics()
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
    ):
        lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
    for name, xs in (("deepinfer_time_to_first_token_seconds", st.ttft),
                     ("deepinfer_time_per_output_token_seconds", st.tpot)):  # fmt: skip
        xs = list(xs)
        lines.append(f"# TYPE {name} histogram")
        for b in BUCKETS:
            lines.append(f'{name}_bucket{{le="{b}"}} {sum(x <= b for x in xs)}')
        lines += [f'{name}_bucket{{le="+Inf"}} {len(xs)}', f"{name}_sum {sum(xs)}", f"{name}_count {len(xs)}"]
    return "\n".join(lines) + "\n"
