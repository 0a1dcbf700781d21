"""One compiler per vocabulary: front ends → grammar IR → automaton → compiled constraint.

Compiled constraints are cached (bounded LRU) by (kind, spec, options), so every request
with the same constraint shares one immutable :class:`CompiledConstraint`. A grammar with
uniqueItems markers gets its run-time check (:mod:`.unique_items`): :func:`compile_constraint`.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections import OrderedDict
from typing import Any

from . import ir, native
from .automaton.nfa import Limits
from .automaton.pushdown import compile_grammar
from .compiled import CompiledConstraint
from .errors import ConstraintError, ConstraintTooComplex, is_interrupt, is_recursion_error
from .json_schema.common import DEFAULT_WHITESPACE, WHITESPACE
from .json_schema.loader import schema_key
from .key_order import attach, compile_unique  # (uniqueItems' and key order's run-time checks)
from .limits import check_deadline

# the bounds on an automaton's size: past one of them a JSON schema is compiled again with the
# next narrower whitespace (Compiler.json_schema)
SIZE_BOUNDS = frozenset({"max_dfa_states", "max_nfa_states", "max_ir_nodes"})


class Compiler:
    """Compiles regexes, JSON Schemas, Lark grammars and choices for one vocabulary.

    Whatever the input, each method returns a :class:`CompiledConstraint` or raises
    :class:`ConstraintError` naming where the constraint is at fault (a JSON pointer, a
    regex position, a grammar line and column); a constraint past one of ``limits``
    (:class:`~.limits.Limits`: sizes, nesting, states, ``max_seconds`` for the whole
    compilation, front end included) raises :class:`ConstraintTooComplex`.
    """

    def __init__(
        self,
        vocab,
        *,
        cache_size: int = 256,
        limits: Limits | None = None,
        special_tokens: dict[str, int] | None = None,
        key_order: str = "schema",
    ) -> None:
        self.vocab = vocab
        self.limits = limits or Limits()
        # special token text -> id, for grammars naming them (``<|im_end|>``); by id
        # (``<[128009]>``) any special id of the vocabulary may be named
        self.special_tokens = dict(special_tokens or getattr(vocab, "special_tokens", None) or {})
        # JSON Schema objects: keys in schema order, or "any" order (see .key_order)
        self.key_order = _check_key_order(key_order)
        self._cache: OrderedDict[tuple, CompiledConstraint] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # the tries are shared by every compilation: made once, now (loaded from the disk
        # cache after the first process: .tokens.trie_cache); under numba's JIT, its kernels
        # are loaded or compiled now too (an AOT build loads them with the package: .native)
        vocab.index()
        vocab.split_index(0x22)
        if native.STATE.mode == "jit":
            _warm_up(vocab)
        prime_shared_rows(vocab)

    def _cached(self, key: tuple, build, where, finish=None) -> CompiledConstraint:
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
            if finish is not None:
                compiled = finish(compiled)
        except BaseException as e:  # every refusal is a ConstraintError (a Rust panic included)
            if is_interrupt(e):
                raise
            raise refusal(e, where) from (e if not isinstance(e, ConstraintError) else e.__cause__)
        self._keep(key, compiled)
        return compiled

    def _keep(self, key: tuple, compiled: CompiledConstraint) -> None:
        """Cache ``compiled`` under ``key`` (least recently used out past the cache's size)."""
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

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
        key_order: str | None = None,
    ) -> CompiledConstraint:
        """JSON documents valid under ``schema`` (dict, bool, JSON text, pydantic model or type:
        see :func:`~.json_schema.loader.load_schema`). ``key_order``: ``"schema"`` or ``"any"``
        (object keys in any order, each once, required ones before the object closes:
        :mod:`.key_order`); None: the compiler's. ``whitespace`` is the widest layout allowed:
        where it makes the automaton too large (a bound of :data:`SIZE_BOUNDS`), the schema is
        compiled with the next narrower whitespace (``"flexible"``, ``"natural"``,
        ``"compact"``), whose outputs it allows too; ``notes`` says so and
        ``whitespace_used`` names the one used."""
        if not isinstance(whitespace, str) or whitespace not in WHITESPACE:
            raise ConstraintError(
                f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}", path="#"
            )
        spec = _schema_key(schema, self.limits)
        order = self.key_order if key_order is None else _check_key_order(key_order)

        def compiled(ws: str) -> CompiledConstraint:
            def build(deadline: float) -> ir.Grammar:
                from .json_schema.lowering import schema_to_grammar

                return schema_to_grammar(
                    schema,
                    whitespace=ws,
                    strict=bool(strict),
                    lenient=bool(lenient),
                    limits=self.limits,
                    deadline=deadline,
                    key_order=order,
                )

            return self._cached(key(ws), build, lambda e: {"path": _rule_pointer(e)})

        def key(ws: str) -> tuple:
            extra = (order,) if order != "schema" else ()
            return ("json_schema", spec, ws, bool(strict), bool(lenient)) + extra

        def narrower(ws: str) -> str | None:
            i = WHITESPACE.index(ws)
            return WHITESPACE[i - 1] if i else None

        def note(out: CompiledConstraint, ws: str, first: ConstraintTooComplex) -> None:
            used = out.whitespace_used or ws  # (itself compiled narrower)
            out.whitespace_used = used
            out.notes = [
                f"whitespace {whitespace!r} makes this schema's automaton too large "
                f"({first.message}): compiled with {used!r} whitespace",
                *(n for n in out.notes if not n.startswith("whitespace ")),
            ]

        return self._narrowing(whitespace, compiled, key, narrower, note)

    def grammar(self, text: str, *, start: str = "start") -> CompiledConstraint:
        """Outputs in the language of a Lark EBNF grammar."""
        if not isinstance(text, str):
            raise ConstraintError(f"grammar must be a str, got {type(text).__name__}", line=1, column=1)
        if not isinstance(start, str):
            raise ConstraintError(f"start must be a str, got {type(start).__name__}", line=1, column=1)

        def build(deadline: float) -> ir.Grammar:
            from .frontends.lark import lark_to_grammar

            return lark_to_grammar(
                text, start=start, limits=self.limits, deadline=deadline, specials=self._specials()
            )

        def where(e: ConstraintError | None) -> dict[str, int]:
            from .frontends.lark import rule_location

            return rule_location(text, e.rule if e is not None else None, start)

        return self._cached(("grammar", text, start), build, where)

    def gbnf(self, text: str, *, start: str = "root") -> CompiledConstraint:
        """Outputs in the language of a GBNF grammar (llama.cpp's dialect: :mod:`.frontends.gbnf`)."""
        if not isinstance(start, str):
            raise ConstraintError(f"start must be a str, got {type(start).__name__}", line=1, column=1)

        def build(deadline: float) -> ir.Grammar:
            from .frontends.gbnf import gbnf_to_grammar

            return gbnf_to_grammar(text, start=start, limits=self.limits, deadline=deadline)

        def where(e: ConstraintError | None) -> dict[str, int]:
            from .frontends.gbnf import rule_location

            return rule_location(text, e.rule if e is not None else None, start)

        return self._cached(("gbnf", text, start), build, where)

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

    def structural_tags(
        self,
        tags: list[dict],
        triggers: list[str] | None = None,
        *,
        min_segments: int = 0,
        max_segments: int | None = None,
    ) -> CompiledConstraint:
        """Free text in which a trigger starts a tagged segment (tool calls inside text).

        Each tag is ``{"begin": str, "end": str, "then": "text" | "end"}`` plus at most one
        content key (``json_schema``, ``regex``, ``grammar``, ``choice``, with the options of
        those methods: ``whitespace``, ``strict``, ``lenient``, ``key_order``, ``flags``,
        ``start``); no
        content key: any text up to the first ``end``. A segment starts where a trigger
        (default: the tags' begins) first occurs in the free text; a trigger begins the
        tags whose ``begin`` starts with it. After ``end`` the free text resumes
        (``then="text"``, the default) or the output ends (``"end"``). Between
        ``min_segments`` and ``max_segments`` (None: any number) segments. Errors name the
        place as a JSON pointer: ``#/structural_tags/0/json_schema/properties/a``,
        ``#/triggers/1``. See :mod:`.frontends.structural`.
        """
        spec = {
            "structural_tags": tags,
            "triggers": triggers,
            "min_segments": min_segments,
            "max_segments": max_segments,
        }
        starts = [
            t
            for t in (triggers or [t.get("begin") for t in tags if isinstance(t, dict)])
            if isinstance(t, str)
        ]

        def finish(compiled: CompiledConstraint) -> CompiledConstraint:
            return prime_rows(compiled, [t.encode("utf-8", "surrogatepass") for t in starts])

        def key(spec: dict) -> tuple:
            return ("structural_tags", self._spec_key(spec, "#"))

        def compiled(spec: dict) -> CompiledConstraint:
            return self._cached(
                key(spec), lambda deadline: self.lower(spec, "#", deadline), lambda e: {"path": "#"}, finish
            )

        return self._narrowing_spec(spec, compiled, key)

    def reasoning(
        self,
        after: dict | None = None,
        *,
        begin: str = "<think>",
        end: str = "</think>",
        max_tokens: int | None = None,
    ) -> CompiledConstraint:
        """A reasoning block, then a constraint: ``begin``, any text without ``end``, ``end``,
        then the language of ``after`` (a spec as :meth:`lower` reads it: ``{"json_schema":
        ...}``, ``{"regex": ...}``, ``{"structural_tags": [...], ...}``; None: any text).
        ``begin`` may be empty (the prompt opened the block). With ``max_tokens``, once the
        block has that many tokens the matcher forces the end marker (:mod:`.reasoning`)."""
        from .frontends.structural import reasoning_grammar
        from .reasoning import attach_budget

        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0
        ):
            raise ConstraintError(f"max_tokens must be None or an int >= 0, got {max_tokens!r}", path="#")
        if not isinstance(begin, str) or not isinstance(end, str):
            raise ConstraintError("reasoning markers must be strings", path="#/reasoning")

        def key_of(after: dict | None) -> tuple:
            spec_key = self._spec_key(after, "#") if after is not None else None
            return ("reasoning", json.dumps([begin, end, spec_key, max_tokens]))

        # a marker that is a special token of the vocabulary is that token, not its text
        ids = self.special_tokens
        begin_m = ir.special_bytes(ids[begin]) if begin in ids else begin.encode("utf-8", "surrogatepass")
        end_m = ir.special_bytes(ids[end]) if end in ids else end.encode("utf-8", "surrogatepass")

        def finish(compiled: CompiledConstraint) -> CompiledConstraint:
            compiled.markers = (begin, end)  # (to split an output into reasoning and answer)
            prime_rows(compiled, [begin_m + end_m], skip=len(begin_m))
            return attach_budget(compiled, begin_m, end_m, max_tokens)

        def compiled(after: dict | None) -> CompiledConstraint:
            def build(deadline: float) -> ir.Grammar:
                sub = self.lower(after, "#", deadline) if after is not None else None
                markers = (begin_m if begin in ids else begin, end_m if end in ids else end)
                return reasoning_grammar(*markers, sub)

            return self._cached(key_of(after), build, lambda e: {"path": "#"}, finish)

        return self._narrowing_spec(after, compiled, key_of)

    def _narrowing(self, spec: Any, compiled, key, narrower, note) -> CompiledConstraint:
        """``compiled(spec)``; where its automaton is too large (a bound of
        :data:`SIZE_BOUNDS`), ``compiled(narrower(spec))`` (a narrower whitespace, whose
        language is a subset of the wider one's, so its outputs are this call's outputs too),
        and so on until ``narrower`` gives None. The result gets a note (``note(copy, spec
        used, first error)``) and is kept under ``key(spec)``, so the failed attempts are not
        repeated."""
        asked = spec
        try:
            return compiled(spec)
        except ConstraintTooComplex as e:
            if e.bound not in SIZE_BOUNDS:
                raise
            first = last = e
        spec = narrower(spec)
        while spec is not None:
            try:
                got = compiled(spec)
            except ConstraintTooComplex as e:
                if e.bound not in SIZE_BOUNDS:
                    raise
                last, spec = e, narrower(spec)
                continue
            out = copy.copy(got)  # the same automaton and rows, a note of its own
            note(out, spec, first)
            self._keep(key(asked), out)
            return out
        raise last

    def _narrowing_spec(self, spec: dict | None, compiled, key) -> CompiledConstraint:
        """:meth:`_narrowing` of a constraint dict (structural tags, the answer after a
        reasoning block): every JSON schema in it one step narrower at a time."""

        def note(out: CompiledConstraint, used: dict, first: ConstraintTooComplex) -> None:
            out.notes = [
                f"the whitespace of its JSON schemas makes this constraint's automaton too large "
                f"({first.message}): compiled with {_whitespaces(used)} whitespace",
                *(n for n in out.notes if not n.startswith("the whitespace of its JSON schemas ")),
            ]

        return self._narrowing(spec, compiled, key, _narrower_whitespace, note)

    # ------------------------------------------------------------- sub-constraints

    CONTENT_KEYS = ("json_schema", "regex", "grammar", "choice", "structural_tags")

    def lower(self, spec: dict, path: str, deadline: float | None = None) -> ir.Grammar:
        """The grammar IR of a constraint given as a dict: one of ``{"json_schema": s,
        "whitespace", "strict", "lenient", "key_order"}`` (key_order: the compiler's by
        default), ``{"regex": p, "flags"}``, ``{"grammar": text, "start", "syntax": "lark" |
        "gbnf"}``, ``{"choice": [...]}``, ``{"structural_tags": [...], "triggers",
        "min_segments", "max_segments"}`` (not compiled: to embed in another). Errors name
        their place under ``path`` (a JSON pointer)."""
        from .frontends.structural import Tag, check_markers, check_then, tags_grammar

        if not isinstance(spec, dict):
            raise ConstraintError(f"a constraint must be a dict, got {type(spec).__name__}", path=path)
        kinds = [k for k in self.CONTENT_KEYS if spec.get(k) is not None]
        if len(kinds) != 1:
            raise ConstraintError(
                f"a constraint needs exactly one of {', '.join(self.CONTENT_KEYS)}, got "
                f"{', '.join(kinds) or 'none'}",
                path=path,
            )
        kind = kinds[0]
        where = f"{'' if path == '#' else path}/{kind}"
        where = "#" + where if not where.startswith("#") else where
        value = spec[kind]
        limits = self.limits
        try:
            if kind == "json_schema":
                from .json_schema.lowering import schema_to_grammar

                whitespace = spec.get("whitespace", DEFAULT_WHITESPACE)
                if whitespace not in WHITESPACE:
                    raise ConstraintError(f"whitespace must be one of {', '.join(WHITESPACE)}", path=path)
                order = spec.get("key_order", self.key_order)
                if order not in ("schema", "any"):
                    raise ConstraintError(f"key_order must be 'schema' or 'any', got {order!r}", path=path)
                _schema_key(value, limits)
                return schema_to_grammar(
                    value,
                    whitespace=whitespace,
                    strict=bool(spec.get("strict", False)),
                    lenient=bool(spec.get("lenient", False)),
                    runtime_unique=False,
                    limits=limits,
                    deadline=deadline,
                    key_order=order,
                )
            if kind == "regex":
                from .frontends.regex import regex_to_ir

                if not isinstance(value, str):
                    raise ConstraintError("regex must be a str", position=0)
                return ir.Grammar(
                    {"start": regex_to_ir(value, flags=int(spec.get("flags", 0)), limits=limits)}
                )
            if kind == "grammar":
                from .frontends.lark import lark_to_grammar

                if not isinstance(value, str):
                    raise ConstraintError("grammar must be a str", line=1, column=1)
                syntax = spec.get("syntax", "lark")
                if syntax == "gbnf":
                    from .frontends.gbnf import gbnf_to_grammar

                    return gbnf_to_grammar(value, start=spec.get("start", "root"), limits=limits,
                                           deadline=deadline)  # fmt: skip
                if syntax != "lark":
                    raise ConstraintError(
                        f"grammar syntax must be 'lark' or 'gbnf', got {syntax!r}", path=path
                    )
                start = spec.get("start", "start")
                return lark_to_grammar(
                    value, start=start, limits=limits, deadline=deadline, specials=self._specials()
                )
            if kind == "choice":
                if not isinstance(value, list) or not value or not all(isinstance(o, str) for o in value):
                    raise ConstraintError("choice needs a non-empty list of strings")
                return ir.Grammar({"start": ir.alt(*(ir.lit(o) for o in value))})
            # structural tags
            if not isinstance(value, list) or not value:
                raise ConstraintError("structural_tags must be a non-empty list of tags")
            tags = []
            for i, t in enumerate(value):
                at = f"{where}/{i}"
                if not isinstance(t, dict):
                    raise ConstraintError(f"a tag must be a dict, got {type(t).__name__}", path=at)
                unknown = (
                    set(t)
                    - {"begin", "end", "then", *self.CONTENT_KEYS[:4]}
                    - {
                        "whitespace",
                        "strict",
                        "lenient",
                        "key_order",
                        "flags",
                        "start",
                        "syntax",
                    }
                )
                if unknown:
                    raise ConstraintError(f"unknown tag field(s) {', '.join(sorted(unknown))}", path=at)
                begin = check_markers("begin", t.get("begin"), f"{at}/begin")
                end = check_markers("end", t.get("end"), f"{at}/end")
                then = check_then(t.get("then", "text"), f"{at}/then")
                has = any(t.get(k) is not None for k in self.CONTENT_KEYS[:4])
                sub = self.lower(t, at, deadline) if has else None
                tags.append(Tag(begin, end, sub, then, at))
            triggers = spec.get("triggers")
            if triggers is not None and not isinstance(triggers, list):
                raise ConstraintError("triggers must be a list of strings", path="#/triggers")
            return tags_grammar(tags, triggers, spec.get("min_segments", 0), spec.get("max_segments"))
        except ConstraintError as e:
            if kind == "structural_tags":  # (its errors name their places already)
                raise
            raise _under(e, where) from None

    def _spec_key(self, spec: Any, path: str) -> str:
        """A cache key of a constraint dict (schemas by their canonical text)."""

        def norm(v: Any, at: str) -> Any:
            if isinstance(v, dict):
                return {
                    k: (_schema_key(x, self.limits) if k == "json_schema" else norm(x, at))
                    for k, x in v.items()
                }
            if isinstance(v, (list, tuple)):
                return [norm(x, at) for x in v]
            if v is None or isinstance(v, (str, int, float, bool)):
                return v
            raise ConstraintError(f"unexpected value of type {type(v).__name__} in the constraint", path=at)

        return json.dumps(norm(spec, path), sort_keys=True)

    def _specials(self) -> dict:
        """What a grammar may name as special tokens: text -> id, and the valid ids."""
        vocab = self.vocab
        return {"names": self.special_tokens, "ids": vocab.special_ids, "size": vocab.vocab_size}

    def from_ir(self, grammar: ir.Grammar, *, name: str = "ir") -> CompiledConstraint:
        """Compile an IR grammar directly (not cached)."""
        return compile_constraint(grammar, self.vocab, "ir", name, self.limits)


def _under(e: ConstraintError, where: str) -> ConstraintError:
    """``e`` placed under the JSON pointer ``where`` (a sub-constraint's error: its schema
    pointer is appended, a regex position or grammar line and column kept)."""
    path = e.path
    if path is None:
        path = where
    elif not path.startswith(where):
        path = where + (path[1:] if path.startswith("#") else "/" + path)
    new = ConstraintError.__new__(type(e))
    ConstraintError.__init__(new, e.message, path=path, line=e.line, column=e.column, position=e.position)
    for k, v in e.__dict__.items():
        if k not in ("message", "path", "line", "column", "position"):
            new.__dict__[k] = v
    return new


def _check_key_order(key_order: object) -> str:
    from .json_schema.objects import KEY_ORDERS

    if key_order not in KEY_ORDERS:
        raise ConstraintError(
            f"key_order must be one of {', '.join(map(repr, KEY_ORDERS))}, got {key_order!r}", path="#"
        )
    return key_order  # type: ignore[return-value]


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
    if sum(e._size for e in grammar.rules.values()) <= limits.max_ir_nodes:
        return  # (the nodes as trees, shared ones counted each time: no fewer than the distinct)
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
    one (uniqueItems or key-order markers: :func:`~.key_order.compile_unique`); ``deadline``: a
    ``time.monotonic()`` the automaton must be done by (default: ``limits.max_seconds`` from now)."""
    automaton, tags = compile_unique(grammar, limits, deadline)
    compiled = CompiledConstraint(automaton, vocab, kind, spec, grammar.notes, grammar.specials)
    return attach(compiled, tags)


def prime_rows(compiled: CompiledConstraint, paths: list[bytes], skip: int = 0) -> CompiledConstraint:
    """Build, in a background thread, the rows of the configurations met along each of
    ``paths`` from the start (past its first ``skip`` bytes): the free text's states with a
    trigger or end marker partly written, each a whole-trie walk (~3 ms on a 128k
    vocabulary) that would otherwise be paid mid-generation. ``compiled.primed`` is the
    thread (rows are built under the constraint's lock, as on first use)."""
    a = compiled.automaton
    configs = []
    for path in paths:
        cfg = a.initial
        for k, b in enumerate(path):
            cfg = a.step_byte(cfg, b)
            if cfg is None:
                break
            if k + 1 > skip and cfg not in configs:
                configs.append(cfg)

    def build() -> None:
        for cfg in configs:
            try:
                compiled.mask_row(cfg)
            except Exception:  # noqa: BLE001 # pragma: no cover - a cache: the row is built on first use instead
                return

    compiled.primed = threading.Thread(target=build, name="deepinfer-prime-rows", daemon=True)
    compiled.primed.start()
    return compiled


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


def _with_schemas(spec: Any, f) -> Any:
    """``spec`` (a constraint dict as :meth:`Compiler.lower` reads it, tags and all) rebuilt
    with each dict that holds a JSON schema replaced by ``f(dict)``."""
    if isinstance(spec, list):
        return [_with_schemas(x, f) for x in spec]
    if not isinstance(spec, dict):
        return spec
    out = {k: x if k == "json_schema" else _with_schemas(x, f) for k, x in spec.items()}
    return f(out) if spec.get("json_schema") is not None else out


def _narrower_whitespace(spec: Any) -> Any:
    """``spec`` with the whitespace of each JSON schema in it one step narrower
    (``"flexible"`` to ``"natural"`` to ``"compact"``: each language a subset of the wider
    one's); None where none is narrower than compact."""
    changed = False

    def narrow(d: dict) -> dict:
        nonlocal changed
        ws = d.get("whitespace", DEFAULT_WHITESPACE)
        if ws not in WHITESPACE[1:]:
            return d
        changed = True
        return {**d, "whitespace": WHITESPACE[WHITESPACE.index(ws) - 1]}

    out = _with_schemas(spec, narrow)
    return out if changed else None


def _whitespaces(spec: Any) -> str:
    """The whitespaces the JSON schemas of ``spec`` ask for, as a phrase ("'natural'")."""
    found: list[str] = []

    def note(d: dict) -> dict:
        ws = d.get("whitespace", DEFAULT_WHITESPACE)
        if ws not in found:
            found.append(ws)
        return d

    _with_schemas(spec, note)
    return " and ".join(repr(w) for w in found)
