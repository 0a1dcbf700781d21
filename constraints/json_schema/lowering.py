"""JSON Schema (draft 2020-12, plus draft-7 forms) → grammar IR.

:func:`schema_to_grammar` lowers a schema to a :class:`~deepinfer.constraints.ir.Grammar`
whose start rule accepts JSON texts valid under the schema. Choices the grammar makes
(documented in the README):

- objects list their declared ``properties`` in schema order; other keys (when allowed)
  come after them; ``strict=True`` forbids keys not declared;
- values are written canonically (``json.dumps(..., separators=(",", ":"),
  ensure_ascii=False)``): bounded numbers are plain decimals without exponent, enum and
  const values are their compact serialization (an integral number also as ``N.0``);
- whitespace, bounded so that a model cannot emit whitespace until max_tokens:
  ``"compact"`` allows none; ``"natural"`` allows what models write: after ``{``, ``[`` and
  ``,`` and before ``}`` and ``]`` one space or one line break followed by at most
  :data:`FLEX_INDENT` spaces (``json.dumps(indent=2)`` ten levels deep), and one space after
  ``:``; ``"flexible"`` allows, around every token, at most one line break followed by at
  most :data:`FLEX_INDENT` spaces or tabs;
- ``format`` is enforced (an assertion) for the formats in
  :data:`~deepinfer.constraints.json_schema.formats.SUPPORTED_FORMATS`; others are annotations;
- a keyword the grammar cannot enforce raises :class:`ConstraintError` naming it and its
  JSON pointer, unless ``lenient=True``: then it is relaxed and listed in ``grammar.notes``.
"""

from __future__ import annotations

import json
import re
import threading
import time

from ..errors import ConstraintError, ConstraintTooComplex, is_interrupt, is_recursion_error
from ..ir import (
    EMPTY,
    NOTHING,
    Expr,
    Grammar,
    Ref,
    alt,
    lit,
    opt,
    rep,
    seq,
    star,
)
from ..limits import Limits, headroom, out_of_time
from . import formats as jf
from . import numbers as jn
from .arrays import ArrayMixin
from .checks import check_metaschema, check_value
from .common import (
    DEFAULT_WHITESPACE,
    FLEX_INDENT,
    MAX_DEPTH,
    MAX_ENUM,
    MAX_REPEAT_COST,
    MISSING,
    ORIGIN,
    TYPES,
    UNSUPPORTED,
    WHITESPACE,
    canon,
    child,
    constraining,
    cost,
    cost_over,
    is_trivial,
    join,
    pointer_keys,
    pointer_step,
    repeat_cost,
)
from .loader import load_schema
from .logic import LogicMixin
from .merge import MergeMixin
from .objects import ObjectMixin
from .scalars import ScalarMixin


class _SchemaCompiler(MergeMixin, ObjectMixin, ArrayMixin, LogicMixin, ScalarMixin):
    def __init__(self, root: object, whitespace: str, strict: bool, lenient: bool) -> None:
        if whitespace not in WHITESPACE:
            raise ConstraintError(f"whitespace must be one of {', '.join(WHITESPACE)}, got {whitespace!r}")
        self.root = root
        self.strict = strict
        self.lenient = lenient
        self.notes: list[str] = []
        self.unique_ptrs: list[str] = []  # uniqueItems checked at run time (see arrays.marked_array)
        self.runtime_unique = True
        self.key_order = "schema"  # or "any": keys in any order, checked at run time (objects.py)
        self.rules: dict[str, Expr] = {}
        self.stack: list[str] = []
        self.flattening: list[str] = []  # $ref targets whose keywords are being merged (allOf)
        self.cache: dict[str, Expr] = {}
        self.rule_names: dict[Expr, str] = {}  # rule body -> the name it is kept under
        self.merge_names: dict[str, str] = {}  # canonical allOf-with-$ref schema -> its rule name
        self.merge_taken: set[str] = set()  # (the names given)
        self.recursive: set[str] = set()
        self.depth = 0
        self._validator = None
        self._searchers: dict[str, object] = {}  # pattern -> its search automaton (None: use re)
        self.ids: dict[str, tuple[object, str]] = {}
        # why subschemas compiled to NOTHING (named if the whole schema turns out unsatisfiable)
        self.unsat: list[tuple[str, str]] = []
        self.negating: list[str] = []  # operands of `not` being lowered (a residual stays)
        self.neg_refs: list[str] = []  # $ref targets being negated (a cycle stays residual)
        self.limits = Limits()
        self.deadline: float | None = None  # the compile deadline (time.monotonic()), if any
        self._index_ids(root, "#")
        # ws: after { [ , and before } ]; pad: before , and :; after_colon
        ws = pad = after_colon = EMPTY
        if whitespace == "flexible":
            ws = pad = after_colon = seq(
                opt(seq(opt(lit("\r")), lit("\n"))), rep(jf.byte_set(b" \t"), 0, FLEX_INDENT)
            )
        elif whitespace == "natural":
            ws = opt(alt(lit(" "), seq(lit("\n"), rep(lit(" "), 0, FLEX_INDENT))))
            after_colon = opt(lit(" "))
        self.ws, self.pad = ws, pad
        self.comma = seq(pad, lit(","), ws)
        self.colon = seq(pad, lit(":"), after_colon)
        self.after_colon = after_colon

    # ------------------------------------------------------------------ helpers
    def tick(self, ptr: str) -> None:
        """Refuse the schema once the compile deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise out_of_time("JSON Schema lowering", self.limits, path=ptr)

    def unsatisfiable(self, why: str, ptr: str) -> Expr:
        """An unsatisfiable subschema: NOTHING, so that an optional property, an item of an
        array that may be empty or an anyOf branch drops it; the reason is kept for the error
        if the whole schema is unsatisfiable."""
        self.unsat.append((why, ptr))
        return NOTHING

    def relax(self, keyword: str, ptr: str, why: str = "") -> None:
        if self.lenient:
            self.notes.append(f"{keyword} at {ptr}" + (f" ({why})" if why else ""))
            return
        raise ConstraintError(
            f"JSON Schema keyword '{keyword}' cannot be enforced by the grammar"
            + (f": {why}" if why else "")
            + "; pass lenient=True to relax it",
            path=ptr,
        )

    def named(self, name: str, e: Expr) -> Ref:
        """A reference to a rule whose body is ``e``: the rule already holding the same body
        where there is one (the same subschema reached by several paths, e.g. an anyOf
        repeated in several properties), so that the automaton sees one shared rule (kept a
        rule, not inlined into every caller, when it is large) instead of equal copies."""
        prev = self.rule_names.get(e)
        if prev is None:
            # a pointer compiled again in another context (merged with other keywords) gives
            # another body: a name of its own
            base, k = name, 1
            while name in self.rules:
                k += 1
                name = f"{base}~{k}"
            self.rules[name] = e
            self.rule_names[e] = prev = name
        return Ref(prev)

    def repeat(self, item: Expr, lo: int, hi: int | None, ptr: str, what: str) -> Expr:
        n = hi if hi is not None else lo
        if n > 64 and repeat_cost(item, n) > MAX_REPEAT_COST:
            raise ConstraintTooComplex(
                f"{what} {n} of an item of {cost(item)} grammar nodes "
                f"exceeds the size bound ({MAX_REPEAT_COST})",
                path=ptr,
            )
        return rep(item, lo, hi)

    def _id_keys(self) -> tuple[str, ...]:
        """The identifier keyword of the root's draft: ``id`` up to draft-04, ``$id`` after
        (both when the draft is not named)."""
        sch = self.root.get("$schema") if isinstance(self.root, dict) else None
        if isinstance(sch, str):
            if "draft-03" in sch or "draft-04" in sch:
                return ("id",)
            if "json-schema.org" in sch:
                return ("$id",)
        return ("$id", "id")

    def _fragment_anchors(self) -> bool:
        """Whether ``id``/``$id: "#name"`` declares an anchor: up to draft-07 (and when the
        draft is not named); from 2019-09 on, ``$anchor`` does."""
        sch = self.root.get("$schema") if isinstance(self.root, dict) else None
        return (
            not isinstance(sch, str)
            or "json-schema.org" not in sch
            or any(d in sch for d in ("draft-03", "draft-04", "draft-06", "draft-07"))
        )

    def _index_ids(self, node: object, ptr: str) -> None:
        if isinstance(node, dict):
            for key in self._id_keys():
                v = node.get(key)
                if not isinstance(v, str):
                    continue
                base, _, frag = v.partition("#")
                if base:
                    # a new base URI (an empty fragment "x#" is the same as "x")
                    self.ids[base] = (node, ptr)
                    if frag:
                        self.ids[v] = (node, ptr)
                elif frag and not frag.startswith("/") and self._fragment_anchors():
                    # "#name": a location-independent identifier (an anchor) up to draft-07;
                    # "#" alone or a "#/pointer" identifies nothing new
                    self.ids["#" + frag] = (node, ptr)
            if isinstance(node.get("$anchor"), str):
                self.ids["#" + node["$anchor"]] = (node, ptr)
            for k, v in node.items():
                if k not in ("enum", "const", "default", "examples"):
                    self._index_ids(v, child(ptr, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self._index_ids(v, child(ptr, i))

    def resolve(self, ref: str, ptr: str) -> tuple[object, str]:
        if ref in self.ids:
            return self.ids[ref]
        if "#" in ref and not ref.startswith("#"):
            base, frag = ref.split("#", 1)
            if base in self.ids and base != "":
                node, bptr = self.ids[base]
                return self._walk(node, bptr, frag, ref, ptr)
            root_id = self.root.get("$id") if isinstance(self.root, dict) else None
            if not (isinstance(root_id, str) and root_id.split("#")[0] == base):
                raise ConstraintError(
                    f"$ref {ref!r} points outside this schema (remote refs are not fetched)", path=ptr
                )
            ref = "#" + frag
        if not ref.startswith("#"):
            raise ConstraintError(
                f"$ref {ref!r} points outside this schema (remote refs are not fetched)", path=ptr
            )
        return self._walk(self.root, "#", ref[1:], ref, ptr)

    def _walk(self, node: object, base: str, frag: str, ref: str, ptr: str) -> tuple[object, str]:
        if frag and not frag.startswith("/"):
            raise ConstraintError(f"$ref {ref!r}: unknown anchor", path=ptr)
        target, tptr = node, base
        for key in pointer_keys(frag):
            target = pointer_step(target, key)
            if target is MISSING:
                raise ConstraintError(f"$ref {ref!r} does not resolve", path=ptr)
            tptr = child(tptr, key)
        return target, tptr

    def validator(self, node: object, ptr: str = "#") -> _Check:
        """A jsonschema validator of ``node`` (the root's draft), its regexes matched by
        :meth:`search` (linear time) instead of ``re.search``; an error of jsonschema (a
        ``$ref`` it cannot resolve) is a ConstraintError at ``ptr``."""
        if self._validator is None:
            from .checks import metaschema_class

            self._validator = safe_validator_class(metaschema_class(self.root))(self.root)
        return _Check(self._validator.evolve(schema=node), ptr, self.search)

    def search(self, pattern: str, text: str, ptr: str = "#") -> bool:
        """``re.search(pattern, text)`` as the grammar reads ``pattern`` (:meth:`pattern_raw`),
        decided by an automaton, linear in ``text`` (Python's ``re`` may backtrack for
        minutes on a crafted pattern and key); a pattern the grammar cannot read is left to
        ``re`` (an invalid one is a ConstraintError at ``ptr``)."""
        a = self._searchers.get(pattern, _MISS)
        if a is _MISS:
            a = None
            if len(self._searchers) < MAX_SEARCHERS:
                try:
                    from ..automaton.pushdown import compile_grammar

                    raw = self.pattern_raw(pattern, ptr)
                    soon = time.monotonic() + 1.0
                    a = compile_grammar(
                        Grammar({"start": raw}),
                        deadline=soon if self.deadline is None else min(soon, self.deadline),
                    )
                except ConstraintError:
                    a = None
            self._searchers[pattern] = a
        if a is None:
            try:
                return re.search(pattern, text) is not None
            except (re.error, RecursionError, OverflowError, ValueError) as e:
                raise ConstraintError(f"pattern {pattern!r}: invalid regex: {e}", path=ptr) from None
        return a.accepts(text.encode("utf-8", "surrogatepass"))

    # ----------------------------------------------------------------- compile
    def ref(self, ref: str, ptr: str) -> Expr:
        target, tptr = self.resolve(ref, ptr)
        name = "ref:" + tptr
        if tptr in self.stack:
            self.recursive.add(tptr)
            return Ref(name)
        if tptr in self.cache:
            return self.cache[tptr]
        self.stack.append(tptr)
        try:
            e = self.compile(target, tptr)
        finally:
            self.stack.pop()
        if tptr in self.recursive:
            self.rules[name] = e  # (its body refers to the name)
            self.rule_names.setdefault(e, name)
            e = Ref(name)
        elif tptr != "#" and cost_over(e, 64):
            # a named rule: the automaton inlines it where small, keeps it a rule where shared and large
            e = self.named(name, e)
        self.cache[tptr] = e
        return e

    def merged_rule(self, s: dict, ptr: str) -> Expr:
        key = canon(s)
        name = self.merge_names.get(key)
        if name is None:
            # other schemas merged at the same pointer (the blocks of several contains) are
            # other rules: a name of their own
            base, k = "merge:" + ptr, 1
            name = base
            while name in self.merge_taken:
                k += 1
                name = f"{base}~{k}"
            self.merge_names[key] = name
            self.merge_taken.add(name)
        if name in self.stack:
            self.recursive.add(name)
            return Ref(name)
        if name in self.cache:
            return self.cache[name]
        self.stack.append(name)
        try:
            e = self.compile(self.merge_all(s, ptr), ptr)
        finally:
            self.stack.pop()
        if name in self.recursive:
            self.rules[name] = e
            e = Ref(name)
        self.cache[name] = e
        return e

    def compile(self, s: object, ptr: str) -> Expr:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ConstraintTooComplex(
                    f"schema nesting deeper than {MAX_DEPTH} levels", path=ptr, bound="MAX_DEPTH"
                )
            self.tick(ptr)
            return self._compile(s, ptr)
        except RecursionError:
            raise ConstraintTooComplex(
                "schema nests too deeply to lower", path=ptr, bound="max_schema_nesting"
            ) from None
        finally:
            self.depth -= 1

    def _compile(self, s: object, ptr: str) -> Expr:
        if s is True:
            return self.any_value()
        if s is False:
            return NOTHING
        if not isinstance(s, dict):
            raise ConstraintError(
                f"a schema must be an object or a boolean, got {type(s).__name__}", path=ptr
            )
        if "const" in s or "enum" in s:
            # the values are checked by the validator against the whole (original) schema,
            # so every keyword beside them holds, whether or not the grammar could enforce it
            return self.compile_enum(s, ptr)
        lowered = self.lower_logic(s, ptr)
        if lowered is not None:
            return self.compile_lowered(s, lowered, ptr)
        self.check_unsupported(s, ptr)
        if "$ref" in s and ORIGIN not in s:
            rest = constraining({k: v for k, v in s.items() if k != "$ref"})
            if not rest:
                return self.ref(s["$ref"], child(ptr, "$ref"))
            return self.compile(
                {
                    **{k: v for k, v in s.items() if k not in ("$ref", "allOf")},
                    "allOf": [{"$ref": s["$ref"]}, *s.get("allOf", [])],
                },
                ptr,
            )
        if "allOf" in s:
            rest = constraining({k: v for k, v in s.items() if k != "allOf"})
            branches = s["allOf"]
            if not isinstance(branches, list) or not branches:
                raise ConstraintError("allOf must be a non-empty array", path=ptr)
            nontrivial = [(i, b) for i, b in enumerate(branches) if not is_trivial(b)]
            if not rest and len(nontrivial) <= 1:
                if not nontrivial:
                    return self.any_value()
                i, b = nontrivial[0]
                return self.compile(b, child(ptr, "allOf", i))
            if any(isinstance(b, dict) and "$ref" in b for b in branches):
                # a merge with a reference: one rule per distinct schema, so that a target
                # merged again below itself (items: {allOf: [{$ref: node}, ...]}) recurses
                return self.merged_rule(s, ptr)
            merged = self.merge_all(s, ptr)
            return self.compile(merged, ptr)
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                return self.compile_choice(s, kw, ptr)
        if "const" in s or "enum" in s:
            return self.compile_enum(s, ptr)
        types = self.types_of(s, ptr)
        parts = []
        for t in types:
            if t == "integer" and "number" in types:
                continue
            parts.append(self.compile_type(t, s, ptr))
        return alt(*parts)

    def check_unsupported(self, s: dict, ptr: str) -> None:
        for kw in UNSUPPORTED:
            if kw not in s:
                continue
            v = s[kw]
            if kw == "uniqueItems" and (
                v is False or self.runtime_unique or self.unique_groups(s) is not None
            ):
                continue  # enforced by compile_array (over a few item values, else at run time)
            if kw in ("contains", "minContains", "maxContains"):
                continue  # compile_array enforces or relaxes them
            if kw == "if" and "then" not in s and "else" not in s:
                continue
            if kw in ("then", "else") and "if" not in s:
                continue
            if kw in ("then", "else"):
                continue  # reported once, as "if"
            if kw in ("unevaluatedProperties", "unevaluatedItems") and is_trivial(v):
                continue
            if kw in ("dependentRequired", "dependentSchemas", "dependencies") and not v:
                continue
            if kw == "not" and self.native_not(s):
                continue
            self.relax(kw, child(ptr, kw))

    def types_of(self, s: dict, ptr: str) -> list[str]:
        t = s.get("type")
        if t is None:
            return list(TYPES[:-1])
        ts = [t] if isinstance(t, str) else t
        if not isinstance(ts, list) or any(x not in TYPES for x in ts):
            raise ConstraintError(f"unknown type {t!r}", path=child(ptr, "type"))
        return list(dict.fromkeys(ts))

    def compile_type(self, t: str, s: dict, ptr: str) -> Expr:
        if t == "null":
            return lit("null")
        if t == "boolean":
            return alt(lit("true"), lit("false"))
        if t == "string":
            return self.compile_string(s, ptr)
        if t in ("number", "integer"):
            return self.compile_number(s, ptr, integer=t == "integer")
        if t == "array":
            return self.compile_array(s, ptr)
        return self.compile_object(s, ptr)

    # ----------------------------------------------------------------- values
    def any_value(self) -> Expr:
        name = "json:value"
        if name not in self.rules:
            punct = (self.ws, self.colon, self.comma)
            body = _ANY_VALUE.get(punct)
            if body is None:
                v = Ref(name)
                member = seq(jf.string_of(jf.CHAR), self.colon, v)
                members = opt(seq(member, star(seq(self.comma, member))))
                obj = seq(lit("{"), self.ws, members, self.ws, lit("}"))
                arr = seq(lit("["), self.ws, opt(seq(v, star(seq(self.comma, v)))), self.ws, lit("]"))
                body = alt(lit("null"), lit("true"), lit("false"), jn.NUMBER, jf.string_of(jf.CHAR), obj, arr)
                if len(_ANY_VALUE) >= 16:
                    _ANY_VALUE.clear()
                _ANY_VALUE[punct] = body
            self.rules[name] = body
        return Ref(name)

    def value_lit(self, v: object) -> Expr:
        if isinstance(v, dict):
            members = [
                seq(lit(json.dumps(k, ensure_ascii=False)), self.colon, self.value_lit(x))
                for k, x in v.items()
            ]
            return seq(lit("{"), self.ws, *join(members, self.comma), self.ws, lit("}"))
        if isinstance(v, list):
            return seq(
                lit("["), self.ws, *join([self.value_lit(x) for x in v], self.comma), self.ws, lit("]")
            )
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
            return alt(lit(str(int(v))), lit(json.dumps(v)))
        if isinstance(v, int) and not isinstance(v, bool):
            return alt(lit(str(v)), lit(f"{v}.0"))
        return lit(json.dumps(v, ensure_ascii=False))

    def compile_enum(self, s: dict, ptr: str) -> Expr:
        if "const" in s:
            values, kw = [s["const"]], "const"
        else:
            values, kw = s["enum"], "enum"
            if not isinstance(values, list):
                raise ConstraintError("enum must be an array", path=child(ptr, "enum"))
        if len(values) > MAX_ENUM:
            raise ConstraintTooComplex(
                f"enum of {len(values)} values exceeds the bound ({MAX_ENUM})", path=child(ptr, kw)
            )
        node = s.get(ORIGIN, s)
        if node is s:
            # each value is one of the values of its own keyword: checked against the rest
            # (jsonschema's enum check is linear per value: quadratic over the enum)
            node = {k: v for k, v in s.items() if k != kw}
        if isinstance(node, dict) and not constraining(node):
            ok = list(values)
        else:
            check = self.validator(node, child(ptr, kw))
            ok = []
            for i, v in enumerate(values):
                if not i & 255:
                    self.tick(child(ptr, kw))
                if check.is_valid(v):
                    ok.append(v)
        if not ok:
            return self.unsatisfiable(f"no {kw} value satisfies the schema (unsatisfiable)", child(ptr, kw))
        return alt(*(self.value_lit(v) for v in ok))

    def compile_choice(self, s: dict, kw: str, ptr: str) -> Expr:
        branches = s[kw]
        if not isinstance(branches, list) or not branches:
            raise ConstraintError(f"{kw} must be a non-empty array", path=child(ptr, kw))
        base = {k: v for k, v in s.items() if k != kw}
        exprs = None
        if kw == "oneOf" and len(branches) > 1:
            pairs = self.overlapping(branches, base)
            if pairs:
                exprs = self.exact_oneof(s, branches, base, pairs, ptr)
        if exprs is None:
            trivial_base = not constraining({k: v for k, v in base.items() if k != ORIGIN})
            origin = s.get(ORIGIN, s)
            # enum values in a branch are checked against the original schema and the branch
            exprs = [
                self.compile(b, child(ptr, kw, i))
                if trivial_base
                else self.compile({"allOf": [base, b], ORIGIN: {"allOf": [origin, b]}}, child(ptr, kw, i))
                for i, b in enumerate(branches)
            ]
        parts = []
        for i, e in enumerate(exprs):
            bptr = child(ptr, kw, i)
            if len(branches) > 1 and cost_over(e, 64):
                # a named rule: inlined unless the inlined automaton is too large (then the
                # branches run side by side as pushdown stacks)
                e = self.named("branch:" + bptr, e)
            parts.append(e)
        return alt(*parts)


class _Check:
    """``is_valid`` of a jsonschema validator, its errors raised as ConstraintError; its
    regexes are matched by ``search`` (see :func:`safe_validator_class`)."""

    __slots__ = ("validator", "ptr", "search")

    def __init__(self, validator, ptr: str, search) -> None:
        self.validator = validator
        self.ptr = ptr
        self.search = search

    def is_valid(self, value: object) -> bool:
        outer = getattr(_SEARCH, "fn", None)
        _SEARCH.fn = self.search
        try:
            error = next(self.validator.iter_errors(value), None)
            if error is None:
                return True
            _unlink(error)
            return False
        except ConstraintError:
            raise
        except BaseException as e:  # (a Rust panic of jsonschema's referencing included)
            if is_interrupt(e):
                raise
            if is_recursion_error(e):
                raise ConstraintTooComplex(
                    "checking a value against the schema recursed too deeply (a $ref cycle?)", path=self.ptr
                ) from None
            raise ConstraintError(
                f"the schema cannot check values here ({type(e).__name__}: {str(e)[:160]})", path=self.ptr
            ) from None
        finally:
            _SEARCH.fn = outer


def _unlink(error) -> None:
    """Break the reference cycles of a jsonschema error: the errors of its ``context`` (an
    ``anyOf`` branch's, say) point back at it as their ``parent``. Left alone, the error tree
    is garbage for Python's cyclic collector, freed in whichever later mask or step allocates
    when a pass falls due."""
    work = [error]
    while work:
        e = work.pop()
        for sub in e.context:
            sub.parent = None
            work.append(sub)


# the "json:value" rule's body by the compilation's (whitespace, colon, comma): one object
# for every compilation that writes them alike, so what is kept by it across compilations
# (its DFA, its byte sets) is found by identity, not by comparing the trees
_ANY_VALUE: dict[tuple[Expr, Expr, Expr], Expr] = {}

_MISS = object()
MAX_SEARCHERS = 256  # patterns matched by an automaton per schema (others by re)


_SEARCH = threading.local()  # .fn: the search of the _Check running in this thread
_SAFE_CLASSES: dict[type, type] = {}


def _search(pattern: str, text: str) -> bool:
    return _SEARCH.fn(pattern, text)


def safe_validator_class(base):
    """``base`` (a jsonschema validator class) with ``pattern``, ``patternProperties`` and
    ``additionalProperties`` matching regexes by the ``search(pattern, text)`` of the
    :class:`_Check` that runs it (made once per class: making one takes ~1 ms)."""
    cls = _SAFE_CLASSES.get(base)
    if cls is None:
        cls = _SAFE_CLASSES[base] = _make_safe_class(base, _search)
    return cls


def _make_safe_class(base, search):
    import jsonschema

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not search(patrn, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator, pattern_props, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        for p, subschema in pattern_props.items():
            for k, v in instance.items():
                if search(p, k):
                    yield from validator.descend(v, subschema, path=k, schema_path=p)

    original = base.VALIDATORS.get("additionalProperties")

    def additional_properties(validator, ap, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        props = schema.get("properties", {})
        pats = list(schema.get("patternProperties", {}))
        extras = [k for k in instance if k not in props and not any(search(p, k) for p in pats)]
        if validator.is_type(ap, "object"):
            for k in extras:
                yield from validator.descend(instance[k], ap, path=k)
        elif not ap and extras:
            yield jsonschema.ValidationError(f"additional properties are not allowed ({extras!r})")

    changes = {"pattern": pattern, "patternProperties": pattern_properties}
    if original is not None:
        changes["additionalProperties"] = additional_properties
    return jsonschema.validators.extend(base, changes)


def schema_to_grammar(
    schema: object,
    *,
    whitespace: str = DEFAULT_WHITESPACE,
    strict: bool = False,
    lenient: bool = False,
    runtime_unique: bool = True,
    limits: Limits | None = None,
    deadline: float | None = None,
    key_order: str = "schema",
) -> Grammar:
    """Lower a JSON Schema to a grammar whose start rule accepts exactly its valid JSON texts.

    Parameters
    ----------
    schema:
        A schema as a dict or bool, its JSON text, or a pydantic model class.
    whitespace:
        ``"flexible"`` (the default: bounded whitespace around every token), ``"natural"``
        (the spaces and line breaks of a pretty-printed or spaced JSON text, bounded) or
        ``"compact"`` (no whitespace).
    strict:
        Forbid object keys that the schema does not declare (``additionalProperties: false``).
    lenient:
        Relax keywords the grammar cannot enforce instead of raising; ``grammar.notes`` says which.
    runtime_unique:
        Enforce ``uniqueItems`` over items that cannot be enumerated with a run-time check
        (:mod:`..unique_items`); False: such a ``uniqueItems`` is unsupported (relaxed if lenient).
    key_order:
        ``"schema"`` (the default): object members in schema order; ``"any"``: declared keys
        in any order, each at most once, required ones checked before the object closes (a
        run-time check, :mod:`..key_order`; where it cannot be kept, the grammar falls back to
        schema order and its notes say so).
    limits:
        The size bounds checked before lowering (:class:`~..limits.Limits`: characters,
        values, nesting, properties); default ``Limits()``.
    deadline:
        A ``time.monotonic()`` past which the checks and the lowering stop
        (:class:`ConstraintTooComplex`); None: no deadline.

    Raises
    ------
    ConstraintError
        Unsupported keyword (without ``lenient``), bad or unsatisfiable schema; the message
        names the JSON pointer.
    ConstraintTooComplex
        The schema is past a size bound or would expand past one (huge enums, counts,
        nesting), or the deadline passed.

    Before lowering, the schema is checked (:mod:`.checks`): JSON values only, within the
    bounds of ``limits``, and valid under its draft's metaschema (jsonschema's
    ``check_schema``; 2020-12 when it names no ``$schema``), each refusal naming the JSON
    pointer of the value at fault.
    """
    limits = limits or Limits()
    root = load_schema(schema, limits)
    sizes = check_value(root, limits, deadline)
    check_metaschema(root, limits, deadline, sizes)
    with headroom():
        c = _SchemaCompiler(root, whitespace, strict, lenient)
        c.runtime_unique = runtime_unique
        c.key_order = key_order
        c.limits, c.deadline = limits, deadline
        start = c.ref("#", "#")
    if start == NOTHING or (isinstance(start, Ref) and c.rules.get(start.name) == NOTHING):
        why = "".join(f"; {m} at {p}" for m, p in c.unsat[:3])
        raise ConstraintError("schema is unsatisfiable: no JSON value is valid" + why, path="#")
    rules = {"start": start, **c.rules}
    unique = tuple(dict.fromkeys(c.unique_ptrs))
    fallback = None
    if unique and lenient:

        def fallback() -> Grammar:
            return schema_to_grammar(
                schema,
                whitespace=whitespace,
                strict=strict,
                lenient=True,
                runtime_unique=False,
                limits=limits,
                deadline=deadline,
                key_order=key_order,
            )

    elif key_order == "any":

        def fallback() -> Grammar:  # (where the key order check cannot be kept: schema order)
            g = schema_to_grammar(
                schema,
                whitespace=whitespace,
                strict=strict,
                lenient=lenient,
                runtime_unique=runtime_unique,
                limits=limits,
                deadline=deadline,
            )
            g.notes.append(
                f"key_order='any' cannot be enforced here ({KEY_ORDER_FALLBACK}): keys in schema order"
            )
            return g

    return Grammar(rules=rules, start="start", notes=c.notes, unique=unique, fallback=fallback)


KEY_ORDER_FALLBACK = (
    "an object that reads like one written otherwise, or an automaton too large without counted repetitions"
)
