"""The kernels' ahead-of-time build: ``python -m deepinfer.constraints.native_build
[--if-missing] [FOLDER]`` (default folder: :func:`.native.cache_dir`; ``--if-missing``: only
when this source has no build there yet). :func:`run` is the workload :func:`.native.build`
runs under numba's JIT to learn the argument types of every kernel: constraints of each
kind over a small byte-level vocabulary, walked at random so that every kind of cold row is
built (JSON strings and their shared rows, counted
repetitions near and far from their bounds, pushdown boundaries, the key-order and
uniqueItems checks, special tokens). Argument types do not depend on the vocabulary's size."""

from __future__ import annotations

import os
import random
import sys

from . import arg_codes, native


def workload_vocab():
    from .vocab import Vocabulary

    pieces: list[bytes | None] = [None, None]  # 0: a special token, 1: EOS
    pieces += [bytes([b]) for b in range(256)]
    words = ['{"', '":', '",', '"}', "},", "[{", '"]', "true", "false", "null", " the", "ing", "12", "123"]
    words += ["00", ".5", "e+", "\\n", '\\"', "\\u00", "  ", "\n  ", '"name', "name", "age", '":"', '"a']
    words += ["ab", "abc", "()", "é", "<tool", "<tool_call>", "</tool_call>", "<think>", "</think>", "x}"]
    pieces += [w.encode() for w in words]
    return Vocabulary(pieces, eos_ids=[1], special_ids=[0])


SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 100},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 80},
            "when": {"type": "string", "format": "date-time"},
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{1,4}$", "minLength": 3},
        },
        "required": ["name"],
    },
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 1},
    {"type": "array", "items": {"type": "object"}, "uniqueItems": True},
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "number"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "$ref": "#/$defs/node",
    },  # fmt: skip
    {
        "type": "object",
        "patternProperties": {"^x-": {"type": "string"}, "^n[0-9]+$": {"type": "integer"}},
        "additionalProperties": False,
    },
    {"anyOf": [{"type": "string", "maxLength": 300}, {"type": "array", "items": {"enum": [1, "a", None]}}]},
    {"type": "string", "minLength": 70, "maxLength": 90},
]


def _walk(compiled, vocab, rng: random.Random, steps: int = 40, walks: int = 6) -> None:
    from .matcher import Matcher

    for _ in range(walks):
        m = Matcher(compiled)
        for _ in range(steps):
            allowed = m.allowed_tokens()
            if len(allowed) == 0 or m.is_terminated():
                break
            m.accept(int(rng.choice(list(allowed))))
        m.forced_tokens()
        m.rollback(min(3, m.num_accepted()))


def run() -> None:
    from .compiler import Compiler
    from .tokens import trie_cache

    # tries built, not loaded from the disk cache: their construction's kernels must be met
    os.environ[trie_cache.ENV] = "0"
    vocab = workload_vocab()
    rng = random.Random(0)
    for order in ("schema", "any"):
        c = Compiler(vocab, key_order=order)
        for s in SCHEMAS:
            for ws in ("compact", "flexible"):
                _walk(c.json_schema(s, whitespace=ws), vocab, rng)
    c = Compiler(vocab, special_tokens={"<|sp|>": 0})
    _walk(c.regex(r"(ab|c)*[0-9]{2,40}x?"), vocab, rng)
    _walk(c.regex(r"[^\n]{0,200}"), vocab, rng)
    _walk(c.grammar('start: "[" (v ("," v)*)? "]" <|sp|>?\nv: start | /"[a-z]{0,4}"/ | /[0-9]+/'), vocab, rng)
    _walk(c.gbnf('root ::= "(" item* ")"\nitem ::= [a-z]+ " " | root'), vocab, rng)
    _walk(c.choice(["alpha", "beta", "gamma"]), vocab, rng)
    tags = [{"begin": "<tool_call>", "json_schema": SCHEMAS[0], "end": "</tool_call>"}]
    st = c.structural_tags(tags, triggers=["<tool"])
    st.primed.join()
    _walk(st, vocab, rng, steps=60)
    r = c.reasoning({"json_schema": SCHEMAS[0]}, max_tokens=5)
    r.primed.join()
    _walk(r, vocab, rng, steps=30)
    # counted repetitions (a string of up to 5,000 characters), far from and near their bound,
    # in a regular automaton and below a recursive rule
    from .matcher import Matcher

    for s in ({"type": "string", "maxLength": 5000}, {"type": "array", "items": {"anyOf": [
            {"$ref": "#"}, {"type": "string", "maxLength": 5000}]}}):  # fmt: skip
        cc = c.json_schema(s)
        _walk(cc, vocab, rng)
        m = Matcher(cc)
        m.accept_bytes((b'["' if "items" in s else b'"') + b"ab" * 2497)
        m.allowed_tokens()
    for s in SCHEMAS:  # whole texts: the automaton's own walks
        c.json_schema(s).accepts('{"name": "x"}')


def main(argv: list[str]) -> None:
    folder = next((a for a in argv if not a.startswith("--")), None)
    codes_folder = folder or native.cache_dir()
    if "--if-missing" not in argv or not all(map(os.path.exists, arg_codes.build_paths(codes_folder))):
        try:  # (a second: the arguments' codes, beside the kernels)
            arg_codes.build(codes_folder)
        except RuntimeError as e:
            print(f"argument codes not built ({e}): calls check their arguments in Python", file=sys.stderr)
    if "--if-missing" in argv and all(map(os.path.exists, native.build_paths(folder))):
        print(native.build_paths(folder)[0])
        return
    if native.STATE.mode != "jit":  # the build learns the types under the JIT: a new process
        os.environ[native.ENV_MODE] = "jit"
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name, *argv])
    print(native.build(run, folder))


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
