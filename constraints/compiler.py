"""One compiler per vocabulary: front ends → grammar IR → automaton → compiled constraint.

Compiled constraints are cached (bounded LRU) by (kind, spec, options), so every request
with the same constraint shares one immutable :class:`CompiledConstraint`. A grammar with
uniqueItems markers gets its run-time check (:mod:`.unique_items`): :func:`compile_constraint`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from . import ir
from .automaton.nfa import Limits
from .automaton.pushdown import compile_grammar
from .compiled import CompiledConstraint
from .errors import ConstraintError, ConstraintTooComplex, is_interrupt, is_recursion_error
from .json_schema.common import DEFAULT_WHITESPACE, WHITESPACE
from .json_schema.loader import schema_key
from .limits import check_deadline
from .unique_items import attach, compile_unique


class Compiler:
    """Compiles regexes, JSON Schemas, Lark grammars and choices for one vocabulary.

    Whatever the input, each method returns a :class:`CompiledConstraint` or raises
    :class:`ConstraintError` naming where the constraint is at fault (a JSON pointer, a
    regex position, a grammar line and column); a constraint past one of ``limits``
    (:class:`~.limits.Limits`: sizes, nesting, states, ``max_seconds`` for the whole
    compilation, front end included) raises :class:`ConstraintTooComplex`.
    """

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

    def _cached(self, key: tuple, build, where) -> CompiledConstraint:
        """The compiled constraint of ``key``: from the cache, or ``build(deadline)``'s grammar
        compiled; ``where(error)`` gives the location of an error that names none."""
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        kind, spec = key[0], key[1]
        limits = self.limits
        deadline = time.monotonic() + limits.max_seconds
        try:
            grammar = build(deadline)
            check_deadline(deadline, "front end", limits, **where(None))
            _check_ir_size(grammar, limits, where)
            compiled = compile_constraint(grammar, self.vocab, kind, spec, limits, deadline=deadline)
        except BaseException as e:  # every refusal is a ConstraintError (a Rust panic included)
            if is_interrupt(e):
                raise
            raise refusal(e, where) from (e if not isinstance(e, ConstraintError) else e.__cause__)
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def regex(self, pattern: str, *, flags: int = 0) -> CompiledConstraint:
        """Outputs that ``re.fullmatch(pattern, text, flags)`` accepts."""
        if not isinstance(pattern, str):
            raise ConstraintError(f"regex must be a str, got {type(pattern).__name__}", position=0)
        if not isinstance(flags, int):
            raise ConstraintError(f"regex flags must be an int, got {type(flags).__name__}", position=0)
        bound = self.limits.max_regex_chars
        if len(pattern) > bound:
            raise ConstraintTooComplex(
                f"regex has {len(pattern):,} characters, over the bound of {bound:,} "
                "(Limits.max_regex_chars)",
                bound="max_regex_chars",
                position=bound,
            )

        def build(deadline: float) -> ir.Grammar:
            from .frontends.regex import regex_to_ir  # (front ends load on first use)

            return ir.Grammar({"start": regex_to_ir(pattern, flags=flags, limits=self.limits)})

        return self._cached(("regex", pattern, flags), build, lambda e: {"position": 0})

    def json_schema(
        self,
        schema: Any,
        *,
        whitespace: str = DEFAULT_WHITESPACE,
        strict: bool = False,
        lenient: bool = False,
    ) -> CompiledConstraint:
        """JSON documents valid under ``schema`` (dict, bool, JSON text, pydantic model or type:
        see :func:`~.json_schema.loader.load_schema`)."""
        if not isinstance(whitespace, str) or whitespace not in WHITESPACE:
            raise ConstraintError(
                f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}", path="#"
            )
        spec = _schema_key(schema, self.limits)

        def build(deadline: float) -> ir.Grammar:
            from .json_schema.lowering import schema_to_grammar

            return schema_to_grammar(
                schema,
                whitespace=whitespace,
                strict=bool(strict),
                lenient=bool(lenient),
                limits=self.limits,
                deadline=deadline,
            )

        key = ("json_schema", spec, whitespace, bool(strict), bool(lenient))
        return self._cached(key, build, lambda e: {"path": _rule_pointer(e)})

    def grammar(self, text: str, *, start: str = "start") -> CompiledConstraint:
        """Outputs in the language of a Lark EBNF grammar."""
        if not isinstance(text, str):
            raise ConstraintError(f"grammar must be a str, got {type(text).__name__}", line=1, column=1)
        if not isinstance(start, str):
            raise ConstraintError(f"start must be a str, got {type(start).__name__}", line=1, column=1)

        def build(deadline: float) -> ir.Grammar:
            from .frontends.lark import lark_to_grammar

            return lark_to_grammar(text, start=start, limits=self.limits, deadline=deadline)

        def where(e: ConstraintError | None) -> dict[str, int]:
            from .frontends.lark import rule_location

            return rule_location(text, e.rule if e is not None else None, start)

        return self._cached(("grammar", text, start), build, where)

    def choice(self, options: list[str]) -> CompiledConstraint:
        """Exactly one of ``options`` (errors name the option as a JSON pointer: ``#/2``)."""
        if not isinstance(options, (list, tuple)) or not options:
            raise ConstraintError("choice needs a non-empty list of strings", path="#")
        total = 0
        for i, o in enumerate(options):
            if not isinstance(o, str):
                raise ConstraintError(f"choice option is not a string: {type(o).__name__}", path=f"#/{i}")
            try:
                o.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ConstraintError(
                    f"choice option holds a lone surrogate (U+{ord(o[e.start]):04X} at character "
                    f"{e.start}), which is not valid UTF-8",
                    path=f"#/{i}",
                ) from None
            total += len(o) + 1
            if total > self.limits.max_grammar_chars:
                raise ConstraintTooComplex(
                    f"choice options have over {self.limits.max_grammar_chars:,} characters "
                    "(Limits.max_grammar_chars)",
                    bound="max_grammar_chars",
                    path=f"#/{i}",
                )
        opts = tuple(options)
        return self._cached(
            ("choice", json.dumps(opts)),
            lambda deadline: ir.Grammar({"start": ir.alt(*(ir.lit(o) for o in opts))}),
            lambda e: {"path": "#"},
        )

    def from_ir(self, grammar: ir.Grammar, *, name: str = "ir") -> CompiledConstraint:
        """Compile an IR grammar directly (not cached)."""
        return compile_constraint(grammar, self.vocab, "ir", name, self.limits)


def refusal(e: BaseException, where) -> ConstraintError:
    """``e`` as a :class:`ConstraintError` that names a location (``where(error)``, for one
    that names none): Python's recursion and memory errors are bounds past; any other
    exception is an internal error, still refused as a ConstraintError."""
    if isinstance(e, ConstraintError):
        return e if e.located else e.at(**where(e))
    if is_recursion_error(e):
        return ConstraintTooComplex(
            "constraint nests too deeply to compile (Python's recursion limit)",
            bound="recursion",
            **where(None),
        )
    if isinstance(e, MemoryError):
        return ConstraintTooComplex(
            "constraint needs more memory than there is", bound="memory", **where(None)
        )
    return ConstraintError(
        f"constraint could not be compiled: internal error {type(e).__name__}: {str(e)[:200]}",
        **where(None),
    )


def _schema_key(schema: Any, limits: Limits) -> str:
    """The cache key of a schema, or a ConstraintError naming what is wrong with it."""
    try:
        spec = schema_key(schema)
    except ConstraintError as e:
        raise e.at(path="#") from None
    except BaseException as e:  # not JSON (too deep, cyclic, not serialisable), a model pydantic fails on
        if is_interrupt(e):
            raise
        if isinstance(schema, (dict, list)):
            from .json_schema.checks import check_value

            check_value(schema, limits)  # names the value at fault
        raise refusal(e, lambda _e: {"path": "#"}) from None
    if len(spec) > limits.max_schema_chars:
        raise ConstraintTooComplex(
            f"schema has {len(spec):,} characters, over the bound of {limits.max_schema_chars:,} "
            "(Limits.max_schema_chars)",
            bound="max_schema_chars",
            path="#",
        )
    return spec


_RENAMED = re.compile(r"~(?:[2-9]|\d{2,})$")  # the suffix of a rule name given twice (lowering.named)


def _rule_pointer(e: ConstraintError | None) -> str:
    """The JSON pointer a JSON Schema rule stands for (``ref:#/$defs/a`` -> ``#/$defs/a``),
    else the schema's root."""
    rule = e.rule if e is not None else None
    if rule:
        _, _, ptr = rule.partition(":")
        if ptr.startswith("#"):
            return _RENAMED.sub("", ptr)
    return "#"


def _check_ir_size(grammar: ir.Grammar, limits: Limits, where) -> None:
    n = ir.count_nodes(grammar.rules.values(), limits.max_ir_nodes)
    if n > limits.max_ir_nodes:
        raise ConstraintTooComplex(
            f"the constraint's grammar has over {limits.max_ir_nodes:,} IR nodes (Limits.max_ir_nodes)",
            bound="max_ir_nodes",
            **where(None),
        )


def compile_constraint(
    grammar: ir.Grammar,
    vocab,
    kind: str,
    spec: str,
    limits: Limits | None = None,
    deadline: float | None = None,
) -> CompiledConstraint:
    """A grammar's compiled constraint over ``vocab``, with its run-time check if it needs
    one (uniqueItems markers: :func:`~.unique_items.compile_unique`); ``deadline``: a
    ``time.monotonic()`` the automaton must be done by (default: ``limits.max_seconds`` from now)."""
    automaton, tags = compile_unique(grammar, limits, deadline)
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
