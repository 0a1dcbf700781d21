"""One compiler per vocabulary: front ends → grammar IR → automaton → compiled constraint.

Compiled constraints are cached (bounded LRU) by (kind, spec, options), so every request
with the same constraint shares one immutable :class:`CompiledConstraint`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from . import ir
from .automaton import compile_grammar
from .compiled import CompiledConstraint
from .errors import ConstraintError
from .nfa import Limits


class Compiler:
    """Compiles regexes, JSON Schemas, Lark grammars and choices for one vocabulary."""

    def __init__(self, vocab, *, cache_size: int = 256, limits: Limits | None = None) -> None:
        self.vocab = vocab
        self.limits = limits or Limits()
        self._cache: OrderedDict[tuple, CompiledConstraint] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # the tries are shared by every compilation: build them once, now, and compile
        # the numba walk (cached on disk after the first process)
        vocab.index()
        vocab.split_index(0x22)
        _warm_up(vocab)

    def _cached(self, key: tuple, build) -> CompiledConstraint:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        kind, spec = key[0], key[1]
        grammar = build()
        compiled = CompiledConstraint(
            compile_grammar(grammar, self.limits), self.vocab, kind, spec, grammar.notes
        )
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def regex(self, pattern: str, *, flags: int = 0) -> CompiledConstraint:
        """Outputs that ``re.fullmatch(pattern, text, flags)`` accepts."""
        if not isinstance(pattern, str):
            raise ConstraintError(f"regex must be a str, got {type(pattern).__name__}")

        def build():
            from .regex import regex_to_ir

            return ir.Grammar({"start": regex_to_ir(pattern, flags=flags)})

        return self._cached(("regex", pattern, flags), build)

    def json_schema(
        self,
        schema: Any,
        *,
        whitespace: str = "compact",
        strict: bool = False,
        lenient: bool = False,
    ) -> CompiledConstraint:
        """JSON documents valid under ``schema`` (dict, JSON text, bool, or pydantic model)."""
        if whitespace not in ("compact", "flexible"):
            raise ConstraintError(f"whitespace must be 'compact' or 'flexible', got {whitespace!r}")
        spec = schema_key(schema)

        def build():
            from .json_schema import schema_to_grammar

            return schema_to_grammar(schema, whitespace=whitespace, strict=strict, lenient=lenient)

        return self._cached(("json_schema", spec, whitespace, strict, lenient), build)

    def grammar(self, text: str, *, start: str = "start") -> CompiledConstraint:
        """Outputs in the language of a Lark EBNF grammar."""

        def build():
            from .ebnf import lark_to_grammar

            return lark_to_grammar(text, start=start)

        return self._cached(("grammar", text, start), build)

    def choice(self, options: list[str]) -> CompiledConstraint:
        """Exactly one of ``options``."""
        if not options or not all(isinstance(o, str) for o in options):
            raise ConstraintError("choice needs a non-empty list of strings")
        opts = tuple(options)
        return self._cached(
            ("choice", json.dumps(opts)), lambda: ir.Grammar({"start": ir.alt(*(ir.lit(o) for o in opts))})
        )

    def from_ir(self, grammar: ir.Grammar, *, name: str = "ir") -> CompiledConstraint:
        """Compile an IR grammar directly (not cached)."""
        return CompiledConstraint(compile_grammar(grammar, self.limits), self.vocab, "ir", name, grammar.notes)


def _warm_up(vocab) -> None:
    import numpy as np

    idx = vocab.index()
    table = np.full((1, 1), -1, dtype=np.int32)
    idx.walk(table, np.zeros(256, dtype=np.int32), 0, np.zeros(1, dtype=bool),
             np.zeros(idx.n_words, dtype=np.uint32))
    # and the automaton kernels (byte classes, subset construction, minimisation, products),
    # on a small recursive grammar with a spliced string and on a difference: loaded from
    # numba's disk cache, or compiled once
    from .ebnf import lark_to_grammar

    compile_grammar(lark_to_grammar('start: "[" (v ("," v)*)? "]"\nv: start | /"[a-z]{0,4}"/'))
    word = ir.plus(ir.byte_range(0x61, 0x7A))
    compile_grammar(ir.Grammar({"start": ir.difference(word, ir.lit("ab"))}))


def schema_key(schema: Any) -> str:
    """A cache key for a schema given as dict / bool / JSON text / pydantic model class."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, (dict, bool)):
        return json.dumps(schema, ensure_ascii=False)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return f"{schema.__module__}.{schema.__qualname__}:" + json.dumps(schema.model_json_schema())
    raise ConstraintError(
        f"json_schema must be a dict, a JSON string, a bool or a pydantic model class, got {type(schema).__name__}"
    )
