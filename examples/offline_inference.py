"""Offline inference with DeepInfer on the embedded SmolLM2-135M-Instruct (no network needed).

    ./build.sh demo                      # or: .venv/bin/python examples/offline_inference.py
    .venv/bin/python examples/offline_inference.py --model path/to/model.gguf --max-tokens 64
"""

from __future__ import annotations

import argparse
import time

from deepinfer import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file, HF folder or repo id (default: embedded)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=0)
    print(f"loaded {args.model or 'embedded SmolLM2-135M-Instruct'} on {llm.device} ({llm.dtype}) "
          f"in {llm.load_seconds:.1f} s")

    # 1. Chat: the model's own chat template (jinja2), greedy.
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    t = time.perf_counter()
    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)[0]
    dt = time.perf_counter() - t
    print(f"\n[chat] {chat[0]['content']}\n  -> {out.text!r}  ({out.finish_reason}, "
          f"{len(out.token_ids)} tokens, {len(out.token_ids) / dt:.1f} tok/s)")

    # 2. Batched generation: several prompts at once, seeded sampling.
    prompts = [
        "The three primary colours are",
        "def fibonacci(n):",
        "A haiku about the sea:\n",
        "JSON is a format that",
    ]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1234, max_tokens=args.max_tokens)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    print(f"\n[generate] batch of {len(prompts)}: {n} tokens in {dt:.2f} s = {n / dt:.1f} tok/s")
    for o in outs:
        print(f"  {o.prompt!r} -> {o.text!r} ({o.finish_reason})")


if __name__ == "__main__":
    main()
