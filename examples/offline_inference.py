"""Offline inference with DeepInfer on the embedded SmolLM2-135M-Instruct (no network needed).

    ./build.sh demo                      # or: .venv/bin/python examples/offline_inference.py
    .venv/bin/python examples/offline_inference.py --model path/to/model.gguf --max-tokens 64

Unconstrained chat and a sampled batch, then structured generation: JSON through a pydantic
model, a regex, a grammar file, a choice, and a batch that mixes constrained and
unconstrained requests in one generate call.
"""

from __future__ import annotations

import argparse
import os
import time

from pydantic import BaseModel, Field

from deepinfer import LLM, RequestOutput, SamplingParams

GRAMMARS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "grammars")


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    founded: int = Field(ge=-3000, le=2100, description="year")


def _report(label: str, outs: list[RequestOutput], seconds: float) -> None:
    n = sum(len(o.token_ids) for o in outs)
    print(f"\n[{label}] {len(outs)} request(s), {n} token(s) in {seconds:.2f} s = {n / seconds:.1f} tok/s")


def _show(o: RequestOutput, what: str = "") -> None:
    valid = "" if o.error is None and what == "free" else f", valid={o.valid}"
    print(
        f"  {what + ': ' if what else ''}{o.text!r}  ({o.finish_reason}{valid}"
        + (f", error={o.error!r}" if o.error else "")
        + ")"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file, HF folder or repo id (default: embedded)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=32, help="for the unconstrained requests")
    args = ap.parse_args()

    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=0)
    print(
        f"loaded {args.model or 'embedded SmolLM2-135M-Instruct'} on {llm.device} ({llm.dtype}) "
        f"in {llm.load_seconds:.1f} s"
    )

    # 1. Chat: the model's own chat template (jinja2), greedy.
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    t = time.perf_counter()
    outs = llm.chat(chat, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
    _report("chat", outs, time.perf_counter() - t)
    print(f"  {chat[0]['content']!r} -> {outs[0].text!r} ({outs[0].finish_reason})")

    # 2. Batched generation: several prompts at once, seeded sampling.
    prompts = ["The three primary colours are", "def fibonacci(n):", "A haiku about the sea:\n"]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1234, max_tokens=args.max_tokens)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _report("generate", outs, time.perf_counter() - t)
    for o in outs:
        print(f"  {o.prompt!r} -> {o.text!r} ({o.finish_reason})")

    # Constrained requests from here on. A constraint is compiled on its first use (then
    # cached), and the times below include that.
    # 3. JSON through a pydantic model: .parsed is a City instance, validated with jsonschema.
    ask = [
        {"role": "system", "content": "You reply with a JSON object only."},
        {"role": "user", "content": "Describe Paris as JSON with name, country and the year it was founded."},
    ]
    t = time.perf_counter()
    # strict=True: no properties beyond the model's (pydantic allows extra ones by default,
    # and a small model may then keep inventing keys until max_tokens).
    outs = llm.chat(
        ask, SamplingParams(json_schema=City, strict=True, temperature=0, max_tokens=64), use_tqdm=False
    )
    _report("json_schema=City", outs, time.perf_counter() - t)
    _show(outs[0])
    print(f"  .parsed = {outs[0].parsed!r}")

    # 4. A regex: an ISO date ([0-9], not \d: as in Python's re, \d is any Unicode digit).
    ask = [{"role": "user", "content": "On what date did the Apollo 11 crew land on the Moon?"}]
    t = time.perf_counter()
    outs = llm.chat(
        ask,
        SamplingParams(
            regex=r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", temperature=0, max_tokens=16
        ),
        use_tqdm=False,
    )
    _report("regex=ISO date", outs, time.perf_counter() - t)
    _show(outs[0])

    # 5. A grammar file: the SELECT subset of SQL in grammars/sql.lark (ends at ';').
    ask = [{"role": "user", "content": "Write a SQL query: names of users older than 30, oldest first."}]
    t = time.perf_counter()
    outs = llm.chat(
        ask,
        SamplingParams(grammar=os.path.join(GRAMMARS, "sql.lark"), temperature=0, max_tokens=48),
        use_tqdm=False,
    )
    _report("grammar=grammars/sql.lark", outs, time.perf_counter() - t)
    _show(outs[0])

    # 6. A choice: exactly one of the strings.
    ask = [{"role": "user", "content": "Is this review positive or negative? 'The food was cold and late.'"}]
    t = time.perf_counter()
    outs = llm.chat(
        ask,
        SamplingParams(choice=["positive", "negative", "neutral"], temperature=0, max_tokens=8),
        use_tqdm=False,
    )
    _report("choice", outs, time.perf_counter() - t)
    _show(outs[0])

    # 7. A mixed batch: constrained and unconstrained requests decode together in one call;
    #    only the constrained rows pay for a bitmask.
    def user(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    batch = [
        (user("Name a colour."), SamplingParams(temperature=0, max_tokens=16), "free"),
        (
            user("A phone number for the office?"),
            SamplingParams(regex=r"\+1-[0-9]{3}-[0-9]{3}-[0-9]{4}", temperature=0.8, seed=7, max_tokens=24),
            "regex",
        ),
        (
            user("Give a city as JSON."),
            SamplingParams(json_schema=City, strict=True, temperature=0.8, seed=7, max_tokens=64),
            "json",
        ),
        (
            user("Compute something."),
            SamplingParams(grammar="arithmetic", temperature=0, max_tokens=8),
            "grammar (cut)",
        ),
        (
            user("Yes or no: is water wet?"),
            SamplingParams(choice=["yes", "no"], temperature=0, max_tokens=4),
            "choice",
        ),
    ]
    t = time.perf_counter()
    outs = llm.chat([b[0] for b in batch], [b[1] for b in batch], use_tqdm=False)
    _report("mixed batch", outs, time.perf_counter() - t)
    for o, (_, _, what) in zip(outs, batch):
        _show(o, what)
    print(
        "  (arithmetic expressions can go on forever and 8 tokens cut this one: finish_reason='length',"
        " never reported valid)"
    )
    print(f"\ndemo done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
