"""The fast metaschema check: a draft's metaschema compiled once into plain Python checks.

jsonschema's ``check_schema`` walks a schema through its draft's metaschema keyword by
keyword, resolving every ``$ref`` and ``$dynamicRef`` again at each node (draft 2020-12's
metaschema is eight documents joined by ``$dynamicRef: "#meta"``): about as long as the
rest of a small schema's compilation. :func:`metaschema_valid` answers the same question,
valid or not, from a checker made once per draft:

- references are resolved when the checker is made (``$ref`` through jsonschema's own
  resolver; ``$dynamicRef: "#meta"`` and ``$recursiveRef: "#"`` to the metaschema's root,
  where a check that starts at the root always lands);
- an ``allOf`` of references to documents that only constrain ``type`` and ``properties``
  (2020-12's vocabularies) is merged into one table: keyword -> the checks of its value;
- annotations (``title``, ``default``, ``format`` without a format checker, ...) are dropped.

It never reports an error: :func:`~.checks.check_metaschema` takes it as the fast path and
runs jsonschema (the reference) only for a schema it finds invalid, to name the error and
its place. A draft whose metaschema uses a keyword the compiler does not know (draft 3)
has no checker (None: jsonschema decides). ``tests/constraints/test_metaschema.py`` checks
the verdicts against jsonschema's on random schemas of every draft.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# keywords of a metaschema that never make an instance invalid (annotations, identifiers,
# definitions reached only through $ref, and format: jsonschema's check asserts no format)
_ANNOTATIONS = frozenset(
    (
        "$schema",
        "$id",
        "id",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$vocabulary",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
    )
)
# a document merged into an allOf (its checks joined to the referring node's table)
_MERGEABLE = _ANNOTATIONS | {"type", "properties"}
MAX_VISITS = 4  # checks per schema value (anyOf branches re-walk a value) before giving up


class Unsupported(Exception):
    """The metaschema uses a keyword (or a form of one) the compiler does not know."""


class _Budget(Exception):
    """The check visited more values than its budget (a pathological anyOf): jsonschema decides."""


def _equal(a: Any, b: Any) -> bool:
    """JSON Schema equality (1 == 1.0, True != 1, by value through arrays and objects)."""
    from jsonschema._utils import equal

    return equal(a, b)


def _unique(items: list) -> bool:
    if all(type(x) is str for x in items):
        return len(set(items)) == len(items)
    from jsonschema._utils import uniq

    return uniq(items)


class _Node:
    """The compiled checks of one metaschema node: allowed types (None: any), a table of
    object keyword -> checks of its value, additional-property checks, and other checks."""

    __slots__ = ("types", "props", "extra", "patterns", "misc", "trivial")

    def __init__(self) -> None:
        self.types: frozenset[str] | None = None
        self.props: dict[str, list[_Node]] = {}
        self.extra: list[_Node] | None = None  # additionalProperties' checks (None: none)
        self.patterns: list[tuple[re.Pattern, _Node]] = []
        self.misc: list[Callable[[Any, list], bool]] = []
        self.trivial = False  # true everywhere (filled in by finish())


class _Compiler:
    def __init__(self, cls) -> None:
        import jsonschema

        meta_cls = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
        if meta_cls.__name__ == "Draft3Validator":  # (its type, required and extends read otherwise)
            raise Unsupported("draft 3")
        self.root_resolver = meta_cls(cls.META_SCHEMA)._resolver
        self.root = cls.META_SCHEMA
        self.legacy_ref = meta_cls.__name__ in (
            "Draft3Validator",
            "Draft4Validator",
            "Draft6Validator",
            "Draft7Validator",
        )
        # the type predicates of the metaschema's own draft (draft 4: 1.0 is no integer)
        self.float_int = meta_cls.__name__ != "Draft4Validator"
        self.memo: dict[int, _Node] = {}

    def compile(self, schema: Any, resolver) -> _Node:
        key = id(schema)
        node = self.memo.get(key)
        if node is not None:
            return node
        node = self.memo[key] = _Node()
        if schema is True or schema == {}:
            node.trivial = True
            return node
        if schema is False:
            node.misc.append(lambda x, n: False)
            return node
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        self._fill(node, schema, resolver, set())
        return node

    def _fill(self, node: _Node, schema: dict, resolver, merged: set) -> None:
        if "$id" in schema or "id" in schema:  # (a new base URI for the refs below)
            ident = schema.get("$id", schema.get("id"))
            if isinstance(ident, str) and not ident.startswith("#"):
                resolver = resolver.in_subresource(_resource(schema))
        keys = list(schema)
        if "$ref" in schema and self.legacy_ref:
            keys = ["$ref"]  # (up to draft 7, $ref's siblings are ignored)
        for kw in keys:
            v = schema[kw]
            if kw in _ANNOTATIONS:
                continue
            if kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                if kw != "$ref":
                    if (kw, v) not in (("$dynamicRef", "#meta"), ("$recursiveRef", "#")):
                        raise Unsupported(f"{kw} {v!r}")
                    target, res = self.root, self.root_resolver
                else:
                    resolved = resolver.lookup(v)
                    target, res = resolved.contents, resolved.resolver
                if isinstance(target, dict) and set(target) <= _MERGEABLE and id(target) not in merged:
                    merged.add(id(target))
                    self._fill(node, target, res, merged)
                else:
                    sub = self.compile(target, res)
                    node.misc.append(_delegate(sub))
            elif kw == "allOf":
                for s in v:
                    if isinstance(s, dict) and set(s) <= _MERGEABLE | {"$ref"} and "$ref" in s:
                        self._fill(node, s, resolver, merged)
                    else:
                        node.misc.append(_delegate(self.compile(s, resolver)))
            elif kw in ("anyOf", "oneOf"):
                subs = [self.compile(s, resolver) for s in v]
                node.misc.append(_any(subs) if kw == "anyOf" else _one(subs))
            elif kw == "not":
                sub = self.compile(v, resolver)
                node.misc.append(lambda x, n, sub=sub: not _check(sub, x, n))
            elif kw == "type":
                ts = frozenset([v] if isinstance(v, str) else v)
                node.types = ts if node.types is None else node.types & ts
            elif kw == "properties":
                for k, s in v.items():
                    node.props.setdefault(k, []).append(self.compile(s, resolver))
            elif kw == "additionalProperties":
                node.extra = [self.compile(v, resolver)]
            elif kw == "patternProperties":
                node.patterns.extend((re.compile(p), self.compile(s, resolver)) for p, s in v.items())
            elif kw == "propertyNames":
                sub = self.compile(v, resolver)
                node.misc.append(
                    lambda x, n, sub=sub: not isinstance(x, dict) or all(_check(sub, k, n) for k in x)
                )
            elif kw == "items":
                if not isinstance(v, (dict, bool)):
                    raise Unsupported("items as an array")
                sub = self.compile(v, resolver)
                node.misc.append(
                    lambda x, n, sub=sub: not isinstance(x, list) or all(_check(sub, i, n) for i in x)
                )
            elif kw == "required":
                names = list(v)
                node.misc.append(
                    lambda x, n, names=names: not isinstance(x, dict) or all(k in x for k in names)
                )
            elif kw == "dependencies":
                for name, dep in v.items():
                    if isinstance(dep, list):
                        node.misc.append(
                            lambda x, n, name=name, dep=dep: (
                                not isinstance(x, dict) or name not in x or all(k in x for k in dep)
                            )
                        )
                    else:
                        sub = self.compile(dep, resolver)
                        node.misc.append(
                            lambda x, n, name=name, sub=sub: (
                                not isinstance(x, dict) or name not in x or _check(sub, x, n)
                            )
                        )
            else:
                node.misc.append(self._scalar(kw, v, schema))
        if merged and (node.extra is not None or node.patterns):
            # (a merged document's properties would hide their keys from additionalProperties)
            raise Unsupported("additionalProperties beside a merged allOf")

    def _scalar(self, kw: str, v: Any, schema: dict) -> Callable[[Any, list], bool]:
        if kw == "enum":
            values = list(v)
            if all(type(e) is str for e in values):
                allowed = frozenset(values)
                return lambda x, n: type(x) is str and x in allowed
            return lambda x, n: any(_equal(x, e) for e in values)
        if kw == "const":
            return lambda x, n: _equal(x, v)
        if kw == "minItems":
            return lambda x, n: not isinstance(x, list) or len(x) >= v
        if kw == "maxItems":
            return lambda x, n: not isinstance(x, list) or len(x) <= v
        if kw == "uniqueItems":
            if not v:
                return lambda x, n: True
            return lambda x, n: not isinstance(x, list) or _unique(x)
        if kw == "minLength":
            return lambda x, n: not isinstance(x, str) or len(x) >= v
        if kw == "maxLength":
            return lambda x, n: not isinstance(x, str) or len(x) <= v
        if kw == "pattern":
            rx = re.compile(v)
            return lambda x, n: not isinstance(x, str) or rx.search(x) is not None
        if kw in ("minimum", "maximum"):
            excl = schema.get("exclusive" + kw[0].upper() + kw[1:])
            low = kw == "minimum"
            if excl is True:  # (draft 4: a boolean beside minimum / maximum)
                return lambda x, n: not _number(x) or (x > v if low else x < v)
            return lambda x, n: not _number(x) or (x >= v if low else x <= v)
        if kw in ("exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(v, bool):
                return lambda x, n: True  # (draft 4: read with minimum / maximum)
            low = kw == "exclusiveMinimum"
            return lambda x, n: not _number(x) or (x > v if low else x < v)
        raise Unsupported(kw)

    def finish(self) -> None:
        """Mark the nodes that accept everything (no checks at all), so the walk skips them."""
        for node in self.memo.values():
            if (
                node.types is None
                and not node.props
                and node.extra is None
                and not node.patterns
                and not node.misc
            ):
                node.trivial = True


def _resource(schema: dict):
    from referencing.jsonschema import specification_with

    spec = specification_with(
        schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
        default=None,
    )
    if spec is None:
        from referencing.jsonschema import DRAFT202012

        spec = DRAFT202012
    return spec.create_resource(schema)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _delegate(sub: _Node) -> Callable[[Any, list], bool]:
    return lambda x, n: _check(sub, x, n)


def _any(subs: list[_Node]) -> Callable[[Any, list], bool]:
    return lambda x, n: any(_check(s, x, n) for s in subs)


def _one(subs: list[_Node]) -> Callable[[Any, list], bool]:
    return lambda x, n: sum(1 for s in subs if _check(s, x, n)) == 1


_TYPE_OF = {str: "string", bool: "boolean", type(None): "null", list: "array", dict: "object"}


def _type_ok(types: frozenset[str], x: Any, float_int: bool) -> bool:
    t = type(x)
    name = _TYPE_OF.get(t)
    if name is not None:
        return name in types
    if isinstance(x, bool):
        return "boolean" in types
    if isinstance(x, int):
        return "integer" in types or "number" in types
    if isinstance(x, float):
        return "number" in types or ("integer" in types and float_int and x.is_integer())
    for cls, name in ((str, "string"), (list, "array"), (dict, "object")):
        if isinstance(x, cls):
            return name in types
    return False


def _check(node: _Node, x: Any, budget: list) -> bool:
    """Is ``x`` valid under ``node``? ``budget``: [values still to visit, float_int]."""
    if node.trivial:
        return True
    budget[0] -= 1
    if budget[0] < 0:
        raise _Budget
    if node.types is not None and not _type_ok(node.types, x, budget[1]):
        return False
    if isinstance(x, dict):
        props, extra, patterns = node.props, node.extra, node.patterns
        if props or extra is not None or patterns:
            for k, v in x.items():
                subs = props.get(k)
                if subs is not None:
                    for s in subs:
                        if not _check(s, v, budget):
                            return False
                matched = False
                for rx, s in patterns:
                    if rx.search(k) is not None:
                        matched = True
                        if not _check(s, v, budget):
                            return False
                if extra is not None and subs is None and not matched:
                    for s in extra:
                        if not _check(s, v, budget):
                            return False
    for m in node.misc:
        if not m(x, budget):
            return False
    return True


_CHECKERS: dict[type, tuple[_Node, bool] | None] = {}


def checker(cls) -> tuple[_Node, bool] | None:
    """The compiled metaschema of validator class ``cls`` (made once), or None."""
    if cls in _CHECKERS:
        return _CHECKERS[cls]
    try:
        c = _Compiler(cls)
        root = c.compile(cls.META_SCHEMA, c.root_resolver)
        c.finish()
        out = (root, c.float_int)
    except Unsupported:
        out = None
    _CHECKERS[cls] = out
    return out


def metaschema_valid(schema: Any, cls, n_values: int) -> bool | None:
    """Is ``schema`` valid under the metaschema of ``cls``: True, False, or None where this
    check cannot tell (no checker for the draft, a walk past its budget of
    ``MAX_VISITS * n_values`` values, Python's recursion limit): then jsonschema decides."""
    compiled = checker(cls)
    if compiled is None:
        return None
    root, float_int = compiled
    budget = [MAX_VISITS * max(n_values, 1) + 64, float_int]
    try:
        return _check(root, schema, budget)
    except (_Budget, RecursionError):
        return None
