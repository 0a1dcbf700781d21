"""Generate text that a Lark grammar accepts, then check it with lark itself.

    .venv/bin/python examples/generate_with_grammar.py --grammar grammars/sql.lark \
        --prompt "Write a SQL query that lists the names of users older than 30."
    .venv/bin/python examples/generate_with_grammar.py --grammar arithmetic --prompt "2 plus 3 is"

--grammar takes a .lark file or the name of a packaged grammar
(deepinfer.grammars.available(): arithmetic, csv, json, sql, tool_call, yaml).
Exit status: 0 when the output parses and ended on its own, 1 when it does not parse or
--max-tokens cut it, 2 for a bad grammar or bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from deepinfer import LLM, SamplingParams, grammars
from deepinfer.structured import resolve_grammar


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grammar", required=True, help="a .lark file or a packaged grammar name")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--model", default=None, help="GGUF file, HF folder or repo id (default: embedded)")
    ap.add_argument("--start", default="start", help="the grammar's start rule")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raw", action="store_true", help="use --prompt as is, without the chat template")
    args = ap.parse_args(argv)

    spec = args.grammar
    if (
        "\n" not in spec
        and ":" not in spec
        and not os.path.exists(spec)
        and spec.removesuffix(".lark") not in grammars.available()
    ):
        ap.error(
            f"--grammar {spec!r}: no such file, and not a packaged grammar "
            f"({', '.join(grammars.available())})"
        )
    try:
        text = resolve_grammar(spec)
    except ValueError as e:
        ap.error(str(e))
    import lark

    try:  # check the grammar before loading the model: errors name line and column
        parser = lark.Lark(text, start=args.start, parser="earley", lexer="dynamic_complete")
    except lark.exceptions.LarkError as e:
        ap.error(f"grammar {args.grammar!r} is not valid Lark: {e}")

    llm = LLM(args.model, seed=args.seed)
    params = SamplingParams(
        grammar=text,
        grammar_start=args.start,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    t = time.perf_counter()
    if args.raw:
        out = llm.generate([args.prompt], params, use_tqdm=False)[0]
    else:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)[0]
    dt = time.perf_counter() - t
    print(out.text)
    print(
        f"--- {len(out.token_ids)} tokens in {dt:.2f} s ({len(out.token_ids) / dt:.1f} tok/s), "
        f"finish_reason={out.finish_reason}",
        file=sys.stderr,
    )
    if out.error:
        print(f"--- engine: {out.error}", file=sys.stderr)
    try:
        parser.parse(out.text)
    except lark.exceptions.LarkError as e:
        print(f"--- does NOT parse: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    if out.finish_reason != "stop":  # a prefix that happens to parse: the model was not done
        print("--- parses, but --max-tokens cut it before the model ended it", file=sys.stderr)
        return 1
    print("--- parses", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
