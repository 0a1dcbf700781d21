"""One compiler per vocabulary: front ends → grammar IR → automaton → compiled constraint.

Compiled constraints are cached (bounded LRU) by (kind, spec, options), so every request
with the same constraint shares one immutable :class:`CompiledConstraint`. A grammar with
uniqueItems markers gets its run-time check (:mod:`.unique_items`): :func:`compile_constraint`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from . import ir
from .automaton.nfa import Limits
from .automaton.pushdown import compile_grammar
from .compiled import CompiledConstraint
from .errors import ConstraintError
from .json_schema.common import WHITESPACE
from .json_schema.loader import schema_key
from .unique_items import attach, compile_unique


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
        prime_shared_rows(vocab)

    def _cached(self, key: tuple, build) -> CompiledConstraint:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        kind, spec = key[0], key[1]
        compiled = compile_constraint(build(), self.vocab, kind, spec, self.limits)
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
            from .frontends.regex import regex_to_ir  # (front ends load on first use)

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
        """JSON documents valid under ``schema`` (dict, bool, JSON text, pydantic model or type:
        see :func:`~.json_schema.loader.load_schema`)."""
        if whitespace not in WHITESPACE:
            raise ConstraintError(f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}")
        spec = schema_key(schema)

        def build():
            from .json_schema.lowering import schema_to_grammar

            return schema_to_grammar(schema, whitespace=whitespace, strict=strict, lenient=lenient)

        return self._cached(("json_schema", spec, whitespace, strict, lenient), build)

    def grammar(self, text: str, *, start: str = "start") -> CompiledConstraint:
        """Outputs in the language of a Lark EBNF grammar."""

        def build():
            from .frontends.lark import lark_to_grammar

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
        return compile_constraint(grammar, self.vocab, "ir", name, self.limits)


def compile_constraint(
    grammar: ir.Grammar, vocab, kind: str, spec: str, limits: Limits | None = None
) -> CompiledConstraint:
    """A grammar's compiled constraint over ``vocab``, with its run-time check if it needs
    one (uniqueItems markers: :func:`~.unique_items.compile_unique`)."""
    automaton, tags = compile_unique(grammar, limits)
    return attach(CompiledConstraint(automaton, vocab, kind, spec, grammar.notes), tags)


WARM_UP_SECONDS = 600.0  # the kernels' first compilation (numba, cold disk cache)


def _warm_up(vocab) -> None:
    import numpy as np

    idx = vocab.index()
    table = np.full((1, 1), -1, dtype=np.int32)
    idx.walk(
        table,
        np.zeros(256, dtype=np.int32),
        0,
        np.zeros(1, dtype=bool),
        np.zeros(idx.n_words, dtype=np.uint32),
    )
    # and the automaton kernels (byte classes, subset construction, minimisation, products),
    # on a small recursive grammar with a spliced string and on a difference: loaded from
    # numba's disk cache, or compiled once. Compiling them (tens of seconds on a cold cache)
    # is not the grammar's time: no request's deadline applies here.
    from .frontends.lark import lark_to_grammar

    untimed = Limits(max_seconds=WARM_UP_SECONDS)
    compile_grammar(lark_to_grammar('start: "[" (v ("," v)*)? "]"\nv: start | /"[a-z]{0,4}"/'), untimed)
    word = ir.plus(ir.byte_range(0x61, 0x7A))
    compile_grammar(ir.Grammar({"start": ir.difference(word, ir.lit("ab"))}), untimed)


def prime_shared_rows(vocab) -> None:
    """Compute the shared rows of JSON strings (keys and values) for ``vocab`` now, once per
    vocabulary: otherwise the first request pays two whole-trie walks (~1 ms)."""
    if vocab.__dict__.get("_primed"):
        return
    vocab.__dict__["_primed"] = True
    from .json_schema.lowering import schema_to_grammar

    try:
        g = schema_to_grammar(
            {"type": "object", "properties": {"a": {"type": "string"}}},
            whitespace="compact",
            strict=False,
            lenient=False,
        )
        c = CompiledConstraint(
            compile_grammar(g, Limits(max_seconds=WARM_UP_SECONDS)), vocab, "json_schema", "prime"
        )
        a = c.automaton
        for prefix in (b'{"', b'{"a":"'):
            cfg = a.step_bytes(a.initial, prefix)
            if cfg is not None:
                c.mask_row(cfg)
    except Exception:  # noqa: BLE001 # pragma: no cover - a cache, never needed for correctness
        pass
