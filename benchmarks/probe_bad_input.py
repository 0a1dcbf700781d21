"""Bad input, tried as a hostile user would: every probe runs between two good requests.

    .venv/bin/python benchmarks/probe_bad_input.py [--model M] [--timeout 30] [--show]

Each probe is a request (sampling values, a prompt, a constraint or a conversation) that must
be refused: by ``SamplingParams`` when it is made (ValueError naming the field), or as that
request's own ``finish_reason="error"`` with a message. It runs as
``generate([good, probe, good])`` (``chat`` for conversations), under a time bound. Outcomes:

- **clear error**: refused, with a message;
- **crash**: ``generate``/``chat`` raised (the good requests lost their outputs too);
- **hang**: past ``--timeout`` seconds;
- **silent**: it ran as if nothing were wrong;
- **neighbours lost**: a good request beside it did not finish normally.

Prints one table per class and a total; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode import _table  # noqa: E402

BIG = 2**70


def sampling_probes() -> list[tuple[str, dict]]:
    bad = {
        "temperature": [math.nan, math.inf, -1.0, -1e-300, 1e300, "0.7", None, True],
        "top_p": [0.0, -0.1, 1.5, math.nan, math.inf, "1"],
        "top_k": [-2, BIG, 2**63, 1.5, "5", True],
        "min_p": [-0.1, 1.5, math.nan, math.inf],
        "seed": [2**63, -(2**63) - 1, BIG, 1.5, "1", True],
        "max_tokens": [0, -1, 1.5, "8", True],
        "stop": [[""], [1], "x" * 5000, ["x"] * 1000, "\ud800", [None]],
        "stop_token_ids": [[-1], [2**63], ["1"], [1.5], [True], list(range(1000)), 5],
        "ignore_eos": ["no", 1],
        "whitespace": ["tabs", None],
        "grammar_start": ["", 5],
    }
    return [(f"{k}={_short(v)}", {k: v}) for k, vs in bad.items() for v in vs]


def prompt_probes(max_len: int) -> list[tuple[str, Any]]:
    return [
        ("lone surrogate", "abc\ud800"),
        ("lone low surrogate", "\udfffabc"),
        ("empty text", ""),
        ("empty ids", []),
        ("negative id", [-1]),
        ("id past the vocabulary", [1, 10**7]),
        ("id past int64", [BIG]),
        ("float id", [1.5]),
        ("bool id", [True]),
        ("str id", ["1"]),
        ("None id", [None]),
        ("ids at the context", [1] * max_len),
        ("ids past the context", [1] * (max_len + 100)),
        ("text past the context", "word " * (max_len * 2)),
        ("30 MB text", "x" * (30 << 20)),
        ("bytes", b"abc"),
        ("int", 5),
        ("None", None),
        ("dict", {"text": "hi"}),
    ]


def _deep(n: int) -> str:
    return "[" * n + "]" * n


VALID_SLOW = {"type": "object", "patternProperties": {"^(a+)+$": {}}, "properties": {"a" * 40 + "b": {}}}


def constraint_probes() -> list[tuple[str, dict]]:
    schemas: list[tuple[str, Any]] = [
        ("properties: []", {"type": "object", "properties": []}),
        ("pattern: 5", {"type": "string", "pattern": 5}),
        ("maxLength: '3'", {"type": "string", "maxLength": "3"}),
        ("required: 'a'", {"type": "object", "required": "a"}),
        ("enum: {}", {"enum": {}}),
        ("items: 3", {"type": "array", "items": 3}),
        ("type: strin", {"type": "strin"}),
        ("minimum: NaN (text)", '{"type": "number", "minimum": NaN}'),
        ("maximum: Infinity (text)", '{"type": "number", "maximum": Infinity}'),
        ("minimum: inf", {"type": "number", "minimum": math.inf}),
        ("minimum: nan", {"type": "number", "minimum": math.nan}),
        ("surrogate key", {"type": "object", "properties": {"\ud800": {}}, "required": ["\ud800"]}),
        ("surrogate pattern", {"type": "string", "pattern": "\udc00"}),
        ("deep JSON text", _deep(100_000)),
        ("deep schema", json.loads('{"items":' * 500 + "{}" + "}" * 500)),
        (
            "5000 properties",
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}},
        ),
        ("5000 required", {"type": "object", "required": [f"p{i}" for i in range(5000)]}),
        ("huge minLength", {"type": "string", "minLength": 10**15}),
        ("huge minItems", {"type": "array", "minItems": 10**15}),
        ("unresolvable $ref", {"$ref": "#/nowhere"}),
        (
            "$ref cycle",
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        ),
        ("unsatisfiable", {"type": "integer", "minimum": 5, "maximum": 1}),
        ("not JSON text", "{nope"),
    ]
    regexes = [
        ("unclosed group", "(abc"),
        ("backreference", r"(a)\1"),
        ("lookahead", r"a(?=b)"),
        ("deep nesting", "(" * 5000 + "a" + ")" * 5000),
        ("huge repeat", "a{1000000000}"),
        ("exponential DFA", "(a|b)*a(a|b){60}"),
        ("100k chars", "a" * 100_000),
        ("bad escape", "\\"),
        ("surrogate", "\ud800"),
    ]
    grammars = [
        ("undefined rule", 'start: "a" nope'),
        ("deep nesting", "start: " + "(" * 5000 + '"a"' + ")" * 5000),
        ("no start rule", 'foo: "a"'),
        ("syntax", "start: ::"),
        ("left recursion only", "start: start"),
        ("empty", "   "),
        ("huge", "start: " + " | ".join(f'"{i}"' for i in range(100_000))),
    ]
    out = [(f"json_schema {n}", {"json_schema": s}) for n, s in schemas]
    # valid, but a backtracking matcher would stall on it: it must run, fast
    out.append(("json_schema backtracking patternProperties (valid: must run)", {"json_schema": VALID_SLOW}))
    out += [(f"regex {n}", {"regex": r}) for n, r in regexes]
    out += [(f"grammar {n}", {"grammar": g}) for n, g in grammars]
    out += [
        ("choice []", {"choice": []}),
        ("choice ['']", {"choice": [""]}),
        ("choice of ints", {"choice": [1, 2]}),
        ("choice surrogate", {"choice": ["\ud800"]}),
        ("two constraints", {"regex": "a", "choice": ["a"]}),
    ]
    return out


HOSTILE_TEMPLATES = [
    ("infinite loop", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"),
    ("string of 10 GB", "{{ 'a' * 10**10 }}"),
    (
        "doubling",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    ),
    ("huge power", "{{ 2 ** 1000000000 }}"),
    ("ljust", "{{ 'a'.ljust(10**10) }}"),
    ("center filter", "{{ 'a' | center(10**10) }}"),
    ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
    ("sandbox escape", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    ("raise_exception", "{{ raise_exception('bad role') }}"),
    ("syntax error", "{% for %}"),
]
BAD_CONVERSATIONS = [
    ("no role", [{"content": "hi"}]),
    ("not a dict", ["hi"]),
    ("a string", "hello"),
    ("surrogate content", [{"role": "user", "content": "\ud800"}]),
]


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run(llm, kind: str, item: Any, timeout: float) -> tuple[str, str]:
    """(outcome, detail) of one probe between two good requests."""
    from deepinfer import SamplingParams

    good = SamplingParams(temperature=0, max_tokens=4)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            if kind == "params":
                try:
                    p = SamplingParams(**{"temperature": 0, "max_tokens": 4, **item})
                except ValueError as e:
                    return "clear error", str(e)
                outs = llm.generate(["Hi", "Hi", "Bye"], [good, p, good], use_tqdm=False)
            elif kind == "prompt":
                outs = llm.generate(["Hi", item, "Bye"], good, use_tqdm=False)
            elif kind == "conversation":
                hi, bye = [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]
                outs = llm.chat([hi, item, bye], good, use_tqdm=False)
            else:  # template
                saved = llm.tokenizer.__dict__.pop("_template", None)
                source = llm.tokenizer.chat_template
                llm.tokenizer.chat_template = item
                try:
                    outs = llm.chat([[{"role": "user", "content": "Hi"}]], good, use_tqdm=False)
                finally:
                    llm.tokenizer.chat_template = source
                    llm.tokenizer.__dict__.pop("_template", None)
                    if saved is not None:
                        llm.tokenizer.__dict__["_template"] = saved
                o = outs[0]
                return (
                    "clear error" if o.finish_reason == "error" and o.error else "silent"
                ), o.error or o.text
        except _Timeout:
            return "hang", f"past {timeout:g} s"
        except Exception as e:
            return "crash", f"{type(e).__name__}: {e}"[:200]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    lost = [o for o in (outs[0], outs[2]) if o.finish_reason not in ("stop", "length") or o.error]
    o = outs[1]
    if lost:
        return "neighbour lost", str(lost[0].error)
    if o.finish_reason == "error" and o.error:
        return "clear error", o.error
    if kind == "params" and item.get("json_schema") is VALID_SLOW:
        return "ran (valid)", o.text
    return "silent", f"finish_reason {o.finish_reason}: {o.text!r}"[:200]


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 24 else r[:21] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: the embedded model)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a probe may take")
    ap.add_argument("--show", action="store_true", help="print every probe's outcome and message")
    args = ap.parse_args()

    from deepinfer import LLM

    llm = LLM(args.model, seed=0, max_model_len=512)
    classes = {
        "sampling values": [("params", n, kw) for n, kw in sampling_probes()],
        "prompts": [("prompt", n, p) for n, p in prompt_probes(llm.max_model_len)],
        "constraints": [("params", n, kw) for n, kw in constraint_probes()],
        "conversations": [("conversation", n, c) for n, c in BAD_CONVERSATIONS],
        "chat templates": [("template", n, t) for n, t in HOSTILE_TEMPLATES],
    }
    outcomes = ["clear error", "ran (valid)", "crash", "hang", "silent", "neighbour lost"]
    rows, total = [], dict.fromkeys(outcomes, 0)
    slowest = (0.0, "")
    for cls, probes in classes.items():
        counts = dict.fromkeys(outcomes, 0)
        for kind, name, item in probes:
            t0 = time.perf_counter()
            outcome, detail = run(llm, kind, item, args.timeout)
            dt = time.perf_counter() - t0
            slowest = max(slowest, (dt, f"{cls}: {name}"))
            counts[outcome] += 1
            if args.show or outcome not in ("clear error", "ran (valid)"):
                print(f"  [{outcome}] {cls}: {name} ({dt:.2f} s): {detail}"[:300], flush=True)
        for k in outcomes:
            total[k] += counts[k]
        rows.append([cls, str(len(probes)), *(str(counts[k]) for k in outcomes)])
    rows.append(["total", str(sum(len(p) for p in classes.values())), *(str(total[k]) for k in outcomes)])
    print()
    _table(["class", "probes", *outcomes], rows)
    print(f"\nslowest probe: {slowest[1]} ({slowest[0]:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
