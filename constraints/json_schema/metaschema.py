"""The fast metaschema check: a draft's metaschema compiled once into plain Python checks.

jsonschema's ``check_schema`` walks a schema through its draft's metaschema keyword by
keyword, resolving every ``$ref`` and ``$dynamicRef`` again at each node (draft 2020-12's
metaschema is eight documents joined by ``$dynamicRef: "#meta"``): about as long as the
rest of a small schema's compilation. :func:`metaschema_valid` answers the same question,
valid or not, from a checker made once per draft:

- references are resolved when the checker is made (``$ref`` among the official metaschema
  documents; ``$dynamicRef: "#meta"`` and ``$recursiveRef: "#"`` to the metaschema's root,
  where a check that starts at the root always lands);
- an ``allOf`` of references to documents that only constrain ``type`` and ``properties``
  (2020-12's vocabularies) is merged into one table: keyword -> the checks of its value;
- annotations (``title``, ``default``, ``format`` without a format checker, ...) are dropped.

It never reports an error: :func:`~.checks.check_metaschema` takes it as the fast path and
runs jsonschema (the reference) only for a schema it finds invalid, to name the error and
its place. A draft whose metaschema uses a keyword the compiler does not know (draft 3)
has no checker (None: jsonschema decides). ``tests/constraints/test_metaschema.py`` checks
the verdicts against jsonschema's on random schemas of every draft.

Neither jsonschema nor referencing is imported on that path (together about 100 ms, most of
a new process's first compilation): a schema's draft comes from its ``$schema`` by
:data:`DRAFT_URIS` (jsonschema's own table: a test compares them), and the metaschema
documents are read from the files of jsonschema-specifications, the package jsonschema
takes them from, without importing it (:func:`_documents`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from .common import MISSING, pointer_keys, pointer_step

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
    """JSON Schema equality (1 == 1.0, True != 1, by value through arrays and objects), as
    jsonschema's."""
    if a is b:
        return True
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _unique(items: list) -> bool:
    if all(type(x) is str for x in items):
        return len(set(items)) == len(items)
    return not any(_equal(items[i], items[j]) for i in range(len(items)) for j in range(i))


# the metaschemas' URIs (as jsonschema keys them: urlsplit(uri).geturl()) -> jsonschema's
# validator class name of the draft
DRAFT_URIS = {
    "http://json-schema.org/draft-03/schema": "Draft3Validator",
    "http://json-schema.org/draft-04/schema": "Draft4Validator",
    "http://json-schema.org/draft-06/schema": "Draft6Validator",
    "http://json-schema.org/draft-07/schema": "Draft7Validator",
    "https://json-schema.org/draft/2019-09/schema": "Draft201909Validator",
    "https://json-schema.org/draft/2020-12/schema": "Draft202012Validator",
}
_URI_OF = {name: uri for uri, name in DRAFT_URIS.items()}
LATEST = "Draft202012Validator"


def draft_name(schema: object) -> str:
    """The name of jsonschema's validator class for ``schema`` (``validator_for`` with the
    2020-12 default), from its ``$schema``: a string that is not a URI the table knows gives
    the default, as jsonschema does."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if not isinstance(uri, str):
        return LATEST  # (absent; or not a string, which its metaschema refuses)
    try:
        return DRAFT_URIS.get(urlsplit(uri).geturl(), LATEST)
    except ValueError:  # (jsonschema's lookup raises the same: let it name it)
        import jsonschema

        return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).__name__


_DOCS: dict[str, dict[str, Any]] = {}  # draft -> its metaschema documents by URI


def _documents(draft: str) -> dict[str, Any]:
    """The official metaschema documents of ``draft`` (its metaschema, and 2019-09's and
    2020-12's vocabularies) by URI, fragment dropped: read from jsonschema-specifications'
    files without importing it (its folder of that draft only), else (another layout) from
    its registry."""
    docs = _DOCS.get(draft)
    if docs is not None:
        return docs
    spec = importlib.util.find_spec("jsonschema_specifications")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    docs = {}
    for folder in folders:
        # (the draft's folder among its schemas: "Draft7Validator" -> "draft7")
        base = os.path.join(folder, "schemas", draft.removesuffix("Validator").lower())
        paths = [os.path.join(base, "metaschema.json")]
        vocab = os.path.join(base, "vocabularies")
        if os.path.isdir(vocab):
            paths += [os.path.join(vocab, f) for f in sorted(os.listdir(vocab)) if not f.startswith(".")]
        for path in paths:
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                ident = doc.get("$id", doc.get("id")) if isinstance(doc, dict) else None
                if isinstance(ident, str):
                    docs[urldefrag(ident)[0]] = doc
    if urldefrag(_URI_OF.get(draft, _URI_OF[LATEST]))[0] not in docs:
        from jsonschema_specifications import REGISTRY

        docs = {urldefrag(uri)[0]: REGISTRY.contents(uri) for uri in REGISTRY}
    _DOCS[draft] = docs
    return docs


class _Resolver:
    """``$ref`` among the metaschema documents, relative to a base URI."""

    def __init__(self, docs: dict[str, Any], base: str) -> None:
        self.docs, self.base = docs, base

    def in_subresource(self, ident: str) -> _Resolver:
        return _Resolver(self.docs, urldefrag(urljoin(self.base, ident))[0])

    def lookup(self, ref: str) -> tuple[Any, _Resolver]:
        uri, frag = urldefrag(urljoin(self.base, ref))
        target = self.docs.get(uri)
        if target is None:
            raise Unsupported(f"$ref {ref!r}")
        if frag.startswith("/"):
            for key in pointer_keys(frag):
                target = pointer_step(target, key)
                if target is MISSING:
                    raise Unsupported(f"$ref {ref!r}")
        elif frag:
            raise Unsupported(f"$ref {ref!r} (an anchor)")
        return target, _Resolver(self.docs, uri)


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
    def __init__(self, draft: str) -> None:
        docs = _documents(draft)
        uri = urldefrag(_URI_OF.get(draft, _URI_OF[LATEST]))[0]
        self.root = docs[uri]
        meta = draft_name(self.root)  # (the metaschema's own draft)
        if meta == "Draft3Validator":  # (its type, required and extends read otherwise)
            raise Unsupported("draft 3")
        self.root_resolver = _Resolver(docs, uri)
        self.legacy_ref = meta in ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")
        # the type predicates of the metaschema's own draft (draft 4: 1.0 is no integer)
        self.float_int = meta != "Draft4Validator"
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
                resolver = resolver.in_subresource(ident)
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
                    target, res = resolver.lookup(v)
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


_CHECKERS: dict[str, tuple[_Node, bool] | None] = {}


def checker(draft: str) -> tuple[_Node, bool] | None:
    """The compiled metaschema of ``draft`` (a :func:`draft_name`; made once), or None."""
    if draft in _CHECKERS:
        return _CHECKERS[draft]
    try:
        c = _Compiler(draft)
        root = c.compile(c.root, c.root_resolver)
        c.finish()
        out = (root, c.float_int)
    except Unsupported:
        out = None
    _CHECKERS[draft] = out
    return out


def metaschema_valid(schema: Any, draft: str, n_values: int) -> bool | None:
    """Is ``schema`` valid under the metaschema of ``draft`` (a :func:`draft_name`): True,
    False, or None where this check cannot tell (no checker for the draft, a walk past its
    budget of ``MAX_VISITS * n_values`` values, Python's recursion limit): then jsonschema
    decides."""
    compiled = checker(draft)
    if compiled is None:
        return None
    root, float_int = compiled
    budget = [MAX_VISITS * max(n_values, 1) + 64, float_int]
    try:
        return _check(root, schema, budget)
    except (_Budget, RecursionError):
        return None
