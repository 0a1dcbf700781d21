"""Serving overhead: the same requests through ``deepinfer serve`` (HTTP, streamed) and through
the offline engine core, at concurrency 1, 8 and 32, in one run. Prints a table, asserts nothing.

Requests: chat prompts, half with a JSON-Schema ``response_format``, greedy, ``max_tokens``
fixed. HTTP: a server subprocess (``--max-num-seqs`` = the concurrency), c client threads each
streaming its requests in turn. Offline: an ``LLM`` with ``max_num_seqs`` = c in this process,
the same requests through ``add_request`` / ``step``, c in flight at a time. Per row: output tokens/s, time to
first token (mean) and time per output token (mean), and HTTP / offline.

CPU, the embedded model:
    .venv/bin/python benchmarks/bench_serve.py [--requests 32] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_decode import _table  # noqa: E402

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


def http_run(base: str, bodies: list[dict], c: int, max_tokens: int) -> dict:
    import httpx

    def one(body: dict):
        t0 = time.perf_counter()
        first, n = None, 0
        with httpx.Client(timeout=600) as cl, cl.stream(
            "POST", base + "/v1/chat/completions",
            json=dict(body, stream=True, temperature=0, max_tokens=max_tokens,
                      stream_options={"include_usage": True}),
        ) as r:  # fmt: skip
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    n = d["usage"]["completion_tokens"]
                elif first is None and any(ch.get("delta", {}).get("content") for ch in d["choices"]):
                    first = time.perf_counter()
        end = time.perf_counter()
        return first - t0 if first else end - t0, (end - first) / max(n - 1, 1) if first else 0.0, n

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as pool:
        res = list(pool.map(one, bodies))
    wall = time.perf_counter() - t
    return {"tok_s": sum(r[2] for r in res) / wall, "ttft": statistics.mean(r[0] for r in res),
            "tpot": statistics.mean(r[1] for r in res)}  # fmt: skip


def offline_run(llm, bodies: list[dict], max_tokens: int, c: int) -> dict:
    """The same requests through the engine core, c in flight at a time (as c clients would)."""
    from deepinfer import SamplingParams

    def add(b: dict) -> None:
        kw = {}
        if "response_format" in b:
            kw["json_schema"] = b["response_format"]["json_schema"]["schema"]
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
        t = time.perf_counter()
        arrival[llm.add_request(llm.chat_prompt(b["messages"]), sp, stream=True)] = t

    t0 = time.perf_counter()
    arrival, first, last, done = {}, {}, {}, {}
    todo = list(bodies)
    for _ in range(min(c, len(todo))):
        add(todo.pop(0))
    while llm.has_unfinished_requests():
        for o in llm.step():
            now = time.perf_counter()
            if o.token_ids:
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
            if o.finished:
                done[o.request_id] = len(o.token_ids)
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
    args = ap.parse_args()
    import httpx

    from deepinfer import LLM

    bodies = requests(args.requests)
    rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        port = _port()
        cmd = [
            sys.executable,
            "-m",
            "deepinfer.serve",
            "--port",
            str(port),
            "--max-num-seqs",
            str(c),
            "--seed",
            "0",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            http_run(base, bodies[:2], 2, 4)  # warm-up: the constraint compiled
            h = http_run(base, bodies, c, args.max_tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        llm = LLM(seed=0, max_num_seqs=c)
        offline_run(llm, bodies[:2], 4, 2)
        o = offline_run(llm, bodies, args.max_tokens, c)
        del llm
        ratio, diff = h["tok_s"] / o["tok_s"], (h["ttft"] - o["ttft"]) * 1e3
        ms = [f"{h['ttft'] * 1e3:.0f}", f"{o['ttft'] * 1e3:.0f}", f"{diff:+.0f}"]
        ms += [f"{h['tpot'] * 1e3:.1f}", f"{o['tpot'] * 1e3:.1f}"]
        rows.append([c, f"{h['tok_s']:.1f}", f"{o['tok_s']:.1f}", f"{ratio:.2f}x", *ms])
        print("  measured", rows[-1], flush=True)
    what = "chat requests (half JSON-Schema constrained), greedy"
    print(f"\n{args.requests} {what}, max_tokens {args.max_tokens}")
    _table(["concurrency", "HTTP tok/s", "offline tok/s", "HTTP / offline", "HTTP TTFT ms", "offline TTFT ms",
            "TTFT diff ms", "HTTP TPOT ms", "offline TPOT ms"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
