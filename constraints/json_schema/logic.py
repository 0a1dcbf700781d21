"""Boolean keywords lowered to ones the grammar enforces (a mixin of the compiler).

- ``not`` is pushed inward (negation normal form, :meth:`LogicMixin.negate`): a schema is a
  conjunction of keywords, so its negation is the disjunction (``anyOf``) of each keyword's
  negation, and most keywords negate to a positive keyword restricted to the instance type
  they apply to (``not {"minLength": 3}`` is ``{"type": "string", "maxLength": 2}`` or any
  non-string; ``not {"required": ["a"]}`` is an object without ``a``). What has no positive
  form stays a residual ``not`` next to its type: strings (patterns, lengths, string enums)
  and non-integer numbers are enforced natively (:meth:`native_not`); anything else raises,
  unless an ``enum``/``const`` in the same schema filters the values (checked by the
  validator against the original schema, so every keyword holds);
- ``oneOf`` whose branches are not provably disjoint becomes ``anyOf`` of each branch
  conjoined with the negations of the branches it may overlap (:meth:`exactly_one`);
- ``if``/``then``/``else`` is ``anyOf [if ∧ then, ¬if ∧ else]``; ``dependentRequired``,
  ``dependentSchemas`` and ``dependencies`` are ``anyOf [key absent, key present ∧ ...]``.

All rewrites are schema to schema, so recursive schemas (``$ref`` cycles, objects whose
extra keys take any value) lower the same way, and the result is exact.
"""

from __future__ import annotations

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import NOTHING, Expr, alt, intersect, lit
from . import formats as jf
from .common import (
    ANNOTATIONS,
    MAX_BRANCHES,
    MAX_LENGTH_COUNT,
    ORIGIN,
    SUPPORTED,
    UNSUPPORTED,
    canon,
    child,
    constraining,
    is_trivial,
)

NEG_DEPTH = 12  # nested negations followed through subschemas and $refs
MAX_NEG_PARTS = 64  # anyOf branches of one negation
JSON_TYPES = ("null", "boolean", "object", "array", "string", "number")
OBJECT_KW = (
    "properties",
    "patternProperties",
    "additionalProperties",
    "required",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
)
ARRAY_KW = (
    "items",
    "prefixItems",
    "additionalItems",
    "contains",
    "minContains",
    "maxContains",
    "minItems",
    "maxItems",
    "uniqueItems",
    "unevaluatedItems",
)
STRING_KW = ("pattern", "minLength", "maxLength", "format")
NUMBER_KW = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# counts whose negation is the opposite bound: keyword -> (type, opposite keyword, step)
_BOUNDS = {
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}
# keywords whose meaning depends on each other: negated (or kept residual) together
_GROUPS = (
    ("properties", "patternProperties", "additionalProperties", "unevaluatedProperties"),
    ("items", "prefixItems", "additionalItems", "unevaluatedItems"),
    ("contains", "minContains", "maxContains"),
    ("if", "then", "else"),
)
# keywords that hold for every instance when their schema is trivial
_TRIVIAL_WHEN_TRUE = (
    "additionalProperties",
    "items",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
)
_STRING_ATOM_KW = {"type", "pattern", "minLength", "maxLength", "enum", "const"}


def _types(t: object) -> set[str]:
    ts = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    if "number" in ts:
        ts.add("integer")
    return ts


def _value_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _any(parts: list) -> object:
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


class LogicMixin:
    # ------------------------------------------------------------------ negation
    def negate(self, x: object, depth: int = 0) -> object:
        """A schema accepting exactly the instances ``x`` rejects; parts without a positive
        form are residual ``{"type": t, "not": part}`` (enforced natively or raising)."""
        if x is True:
            return False
        if x is False:
            return True
        if not isinstance(x, dict) or depth > NEG_DEPTH:
            return {"not": x}
        x = {
            k: v
            for k, v in x.items()
            if (k not in ANNOTATIONS or k == "format") and not (k in _TRIVIAL_WHEN_TRUE and is_trivial(v))
        }
        all_patterns = list(x["patternProperties"]) if isinstance(x.get("patternProperties"), dict) else []
        if isinstance(x.get("patternProperties"), dict):
            x["patternProperties"] = {p: v for p, v in x["patternProperties"].items() if not is_trivial(v)}
            if not x["patternProperties"]:
                del x["patternProperties"]
        if "format" in x and not self.format_asserted(x["format"]):
            del x["format"]  # an annotation: always holds
        if "const" in x or "enum" in x:
            return self._negate_values(x, depth)
        parts: list = []
        done: set[str] = set()

        def residual(keys: tuple[str, ...], t: str | None) -> None:
            g = {k: x[k] for k in keys if k in x}
            done.update(g)
            if g:
                parts.append({"not": g} if t is None else {"type": t, "not": g})

        for group in _GROUPS:
            present = [k for k in group if k in x]
            if not present:
                continue
            if group[0] == "properties" and present == ["properties"]:
                continue  # negated below
            if present == ["items"] and isinstance(x["items"], (dict, bool)):
                done.add("items")  # some item fails items
                parts.append({"type": "array", "contains": self.negate(x["items"], depth + 1)})
                continue
            if group[0] == "contains" and "contains" in present and "maxContains" not in x:
                done.update(present)
                if int(x.get("minContains", 1)) == 1:  # no item is contained
                    parts.append({"type": "array", "items": self.negate(x["contains"], depth + 1)})
                elif int(x.get("minContains", 1)) > 1:
                    residual(tuple(present), "array")
                continue
            if (
                group[0] == "properties"
                and "properties" not in present
                and x.get("additionalProperties") is False
                and len(x.get("patternProperties", {})) == len(all_patterns)
                and all(v is False for v in x.get("patternProperties", {}).values())
            ):
                done.update(present)  # only the empty object: some member
                parts.append({"type": "object", "minProperties": 1})
                continue
            if (
                group[0] == "properties"
                and "unevaluatedProperties" not in present
                and isinstance(x.get("properties", {}), dict)
                and isinstance(x.get("patternProperties", {}), dict)
            ):
                # some member fails the schema its key takes: a declared key its property
                # (below), a key matching a pattern that pattern, any other key
                # additionalProperties; each "some member" has a positive form (:meth:`member_not`)
                done.update(k for k in present if k != "properties")
                for p, v in x.get("patternProperties", {}).items():
                    parts.append({"type": "object", "not": {"patternProperties": {p: v}}})
                if "additionalProperties" in x:
                    others = {
                        "properties": {k: True for k in x.get("properties", {})},
                        "patternProperties": {p: True for p in all_patterns},
                    }
                    parts.append(
                        {
                            "type": "object",
                            "not": {
                                **{k: v for k, v in others.items() if v},
                                "additionalProperties": x["additionalProperties"],
                            },
                        }
                    )
                continue
            if group[0] == "if":
                done.update(present)
                if "if" in x and ("then" in x or "else" in x):
                    cond = x["if"]
                    for branch, c in (("then", cond), ("else", self.negate(cond, depth + 1))):
                        if branch in x:
                            parts.append({"allOf": [c, self.negate(x[branch], depth + 1)]})
                continue
            t = "object" if group[0] in OBJECT_KW else "array"
            residual(tuple(present), t)
        for k, v in x.items():
            if k in done:
                continue
            if k == "type":
                ts = _types(v)
                comp = [t for t in JSON_TYPES if t not in ts and not (t == "number" and "integer" in ts)]
                if comp:
                    parts.append({"type": comp})
                listed = {v} if isinstance(v, str) else set(v) if isinstance(v, list) else set()
                if "integer" in listed and "number" not in listed:
                    parts.append({"type": "number", "not": {"type": "integer"}})  # non-integral numbers
            elif k == "required":
                parts += [{"type": "object", "properties": {key: False}} for key in dict.fromkeys(v)]
            elif k == "properties":
                for key, sub in v.items():
                    n = self.negate(sub, depth + 1)
                    if n is not False:
                        parts.append({"type": "object", "required": [key], "properties": {key: n}})
            elif k in _BOUNDS:
                t, other, step = _BOUNDS[k]
                bound = int(v) + step
                if bound >= 0:
                    parts.append({"type": t, other: bound})
            elif k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(v, bool):
                    continue  # draft-4 flag: read with its bound
                lower = k in ("minimum", "exclusiveMinimum")
                strict = (
                    k.startswith("exclusive")
                    or x.get("exclusiveMinimum" if lower else "exclusiveMaximum") is True
                )
                # not (x >= m) is x < m; not (x > m) is x <= m (and the mirror)
                kw = (
                    ("maximum" if strict else "exclusiveMaximum")
                    if lower
                    else ("minimum" if strict else "exclusiveMinimum")
                )
                parts.append({"type": "number", kw: v})
            elif k == "propertyNames" and self._key_set(self.negate(v, depth + 1)) is not None:
                # some key fails propertyNames: one of the few keys that do
                parts += [
                    {"type": "object", "required": [key]} for key in self._key_set(self.negate(v, depth + 1))
                ]
            elif k == "uniqueItems" and v is False:
                continue
            elif k in ("minContains", "maxContains"):
                continue  # without contains: no effect
            elif k == "allOf":
                parts += [self.negate(b, depth + 1) for b in v]
            elif k == "anyOf":
                parts.append(self.none_of(v, depth))
            elif k == "oneOf":
                # none holds, or two do
                parts.append(self.none_of(v, depth))
                for i, j in self.overlapping(v, {}):
                    parts.append({"allOf": [v[i], v[j]]})
            elif k == "not":
                parts.append(v)
            elif k == "$ref":
                parts.append(self._negate_ref(v, depth))
            elif k in ("dependentRequired", "dependentSchemas", "dependencies"):
                for key, dep in v.items():
                    if isinstance(dep, list):
                        parts += [
                            {"type": "object", "required": [key], "properties": {d: False}} for d in dep
                        ]
                    else:
                        n = self.negate(dep, depth + 1)
                        if n is not False:
                            parts.append({"type": "object", "required": [key], "allOf": [n]})
            elif k not in SUPPORTED and k not in UNSUPPORTED and not k.startswith("\x00"):
                continue  # a keyword no validator knows (e.g. "_format"): always holds
            else:
                t = (
                    "object"
                    if k in OBJECT_KW
                    else "array"
                    if k in ARRAY_KW
                    else "string"
                    if k in STRING_KW
                    else "number"
                    if k in NUMBER_KW
                    else None
                )
                parts.append({"not": {k: v}} if t is None else {"type": t, "not": {k: v}})
        parts = [p for p in parts if p is not False]
        if any(p is True for p in parts):
            return True
        if len(parts) > MAX_NEG_PARTS:
            raise ConstraintTooComplex(f"the negation of a schema has over {MAX_NEG_PARTS} alternatives")
        return _any(parts)

    def none_of(self, branches: list, depth: int = 0, negs: list | None = None) -> object:
        """A schema accepting exactly the instances that no branch accepts: the conjunction of
        the branches' negations, or, where the branches are told apart by a discriminator
        (:meth:`discriminator`), one alternative per value of it instead of the product of
        the negations (an object whose key picks branch ``i`` fails every other branch, so it
        only has to fail the rest of branch ``i``)."""
        if negs is None:
            negs = [self.negate(b, depth + 1) for b in branches]
        disc = self.discriminator(branches) if len(branches) > 1 else None
        if disc is None:
            return {"allOf": negs}
        key, values, rests = disc
        parts: list = [
            # not an object: the object keywords hold, the branches' other keywords decide
            {"allOf": [{"type": [t for t in JSON_TYPES if t != "object"]}, *negs]},
            # an object whose key is absent or picks no branch
            {"type": "object", "properties": {key: self.negate({"anyOf": values}, depth + 1)}},
        ]
        for v, r in zip(values, rests, strict=True):
            n = self.negate(r, depth + 1)
            if n is not False:
                picked = {"type": "object", "required": [key], "properties": {key: v}}
                parts.append(picked if n is True else {"allOf": [picked, n]})
        return _any(parts)

    def discriminator(self, branches: list) -> tuple[str, list, list] | None:
        """(key, value schema per branch, rest of each branch) where every branch requires
        ``key`` and declares it with values that exclude each other's (``type: {"enum":
        ["file"]}`` against ``{"enum": ["dir"]}``); the rest is the branch without the key's
        requirement and schema (so a branch is "the key holds its value and the rest holds")."""
        views = [self._object_view(b) for b in branches]
        if any(v is None for v in views):
            return None
        reqs = [v["required"] if isinstance(v.get("required"), list) else [] for v in views]
        props = [v["properties"] if isinstance(v.get("properties"), dict) else {} for v in views]
        common = set(reqs[0]).intersection(*reqs[1:]) & set(props[0]).intersection(*props[1:])
        for key in sorted(k for k in common if isinstance(k, str)):
            values = [p[key] for p in props]
            if not all(
                self.disjoint2(values[i], values[j], None) for j in range(len(values)) for i in range(j)
            ):
                continue
            rests = []
            for v, req, pr in zip(views, reqs, props, strict=True):
                r = {k: x for k, x in v.items() if k not in ("required", "properties")}
                if len(req) > 1:
                    r["required"] = [q for q in req if q != key]
                # the key stays declared (with any value), so additionalProperties does not apply to it
                r["properties"] = {p: (True if p == key else x) for p, x in pr.items()}
                rests.append(r)
            return key, values, rests
        return None

    @staticmethod
    def _key_set(n: object) -> list[str] | None:
        """The strings of a negated propertyNames that is a plain enum/const (or false)."""
        if n is False:
            return []
        if not isinstance(n, dict) or set(constraining(n)) - {"enum", "const", "type"}:
            return None
        c = constraining(n)
        if c.get("type", "string") != "string" or ("enum" in c) == ("const" in c):
            return None
        values = [c["const"]] if "const" in c else c["enum"]
        if not isinstance(values, list):
            return None
        return list(dict.fromkeys(v for v in values if isinstance(v, str)))

    def _negate_values(self, x: dict, depth: int) -> object:
        """not (enum ∧ rest): split by type; values of a type with no positive form stay residual."""
        values = [x["const"]] if "const" in x else x["enum"]
        if not isinstance(values, list):
            return {"not": x}
        rest = {k: v for k, v in x.items() if k not in ("const", "enum")}
        parts: list = [self.negate(rest, depth + 1)] if rest else []
        by_type: dict[str, list] = {}
        for v in values:
            by_type.setdefault(_value_type(v), []).append(v)
        free = [t for t in JSON_TYPES if t not in by_type]
        if free:
            parts.append({"type": free})
        for t, vs in by_type.items():
            if t == "boolean":
                left = [b for b in (True, False) if b not in vs]
                if left:
                    parts.append({"enum": left})
            elif t != "null":
                parts.append({"type": t, "not": {"enum": vs}})
        parts = [p for p in parts if p is not False]
        return True if any(p is True for p in parts) else _any(parts)

    def _negate_ref(self, ref: str, depth: int) -> object:
        try:
            target, tptr = self.resolve(ref, "#")
        except ConstraintError:
            return {"not": {"$ref": ref}}
        if tptr in self.neg_refs:
            return {"not": {"$ref": ref}}  # recursive: no finite negation
        self.neg_refs.append(tptr)
        try:
            return self.negate(target, depth + 1)
        finally:
            self.neg_refs.pop()

    def format_asserted(self, fmt: object) -> bool:
        return isinstance(fmt, str) and jf.format_raw(fmt) is not None

    # ---------------------------------------------------------- native residuals
    def native_not(self, s: dict) -> bool:
        """Whether ``s``'s ``not`` is enforced where ``s`` is compiled: a string-only schema
        whose operand is a string-language atom, or a number schema negating ``integer``."""
        x = s["not"]
        ts = _types(s.get("type")) if "type" in s else None
        if ts is not None and not ts and isinstance(s.get("type"), list):
            return True  # "type": [] (a merge of disjoint types) accepts nothing, whatever the not
        if ts == {"string"}:
            return self.string_atom(x)
        if ts == {"object"}:
            return self.member_not(x) is not None
        if ts is not None and ts <= {"number", "integer"}:
            if not isinstance(x, dict):
                return False
            c = constraining(x)
            # not {"multipleOf": m} where the numbers are integers (the integer type, or an
            # integral multipleOf): a difference of two remainder automata; over all numbers,
            # with m an integer, the non-integral ones as well
            return c == {"type": "integer"} or (
                set(c) == {"multipleOf"}
                and (self._integral(s) or self._integral({"multipleOf": c["multipleOf"]}))
            )
        return False

    @staticmethod
    def _integral(s: dict) -> bool:
        """Whether the numbers of ``s`` are compiled as integers (see compile_number)."""
        m = s.get("multipleOf")
        if isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0 and float(m).is_integer():
            return True
        return _types(s.get("type")) == {"integer"}

    @staticmethod
    def member_not(x: object) -> tuple[dict, object] | None:
        """For ``not x`` that says "some member fails its schema" about one class of keys:
        (the keys, as a string schema; the schema such a member's value fails). ``x`` is
        ``{"patternProperties": {p: v}}`` (a key matching ``p``) or properties and patterns
        that all hold with one ``additionalProperties`` (a key none of them names)."""
        if not isinstance(x, dict) or set(x) - {"properties", "patternProperties", "additionalProperties"}:
            return None
        props, pats = x.get("properties", {}), x.get("patternProperties", {})
        if (
            not isinstance(props, dict)
            or not isinstance(pats, dict)
            or not all(is_trivial(v) for v in props.values())
        ):
            return None
        if "additionalProperties" not in x:
            if props or len(pats) != 1:
                return None
            ((p, v),) = pats.items()
            return {"type": "string", "pattern": p}, v
        if not all(is_trivial(v) for v in pats.values()):
            return None
        named = [{"enum": list(props)}] if props else []
        named += [{"pattern": p} for p in pats]
        return {"type": "string", **({"not": _any(named)} if named else {})}, x["additionalProperties"]

    def string_atom(self, x: object) -> bool:
        if isinstance(x, bool):
            return True
        if not isinstance(x, dict):
            return False
        c = constraining(x)
        if set(c) == {"anyOf"} and isinstance(c["anyOf"], list):
            return all(self.string_atom(b) for b in c["anyOf"])
        if "format" in c and not self.format_asserted(c["format"]):
            c.pop("format")
        return set(c) <= _STRING_ATOM_KW

    def length_raw(self, raw: Expr, lo: int, hi: int | None, ptr: str) -> Expr:
        n = hi if hi is not None else lo
        if n > MAX_LENGTH_COUNT:
            kw = "maxLength" if hi is not None else "minLength"
            raise ConstraintTooComplex(
                f"{kw} {n} exceeds the bound on counted string lengths ({MAX_LENGTH_COUNT})",
                path=child(ptr, kw),
            )
        return jf.intersect_length(raw, lo, hi)

    def string_raw(self, x: object, ptr: str) -> Expr:
        """The raw strings a string atom (:meth:`string_atom`) accepts."""
        if x is True or x is False:
            return jf.ANY_RAW if x else NOTHING
        c = constraining(x)
        if "anyOf" in c:
            return alt(*(self.string_raw(b, child(ptr, "anyOf", i)) for i, b in enumerate(c["anyOf"])))
        if "type" in c and "string" not in ([c["type"]] if isinstance(c["type"], str) else c["type"]):
            return NOTHING
        parts = [self.pattern_raw(c["pattern"], child(ptr, "pattern"))] if "pattern" in c else []
        for kw in ("const", "enum"):
            if kw in c:
                vals = [c[kw]] if kw == "const" else c[kw]
                parts.append(alt(*(lit(v) for v in vals if isinstance(v, str))))
        lo, hi = int(c.get("minLength", 0)), c.get("maxLength")
        return self.length_raw(
            intersect(*parts) if parts else jf.ANY_RAW, lo, None if hi is None else int(hi), ptr
        )

    # ------------------------------------------------------------------ lowering
    def lower_logic(self, s: dict, ptr: str) -> dict | None:
        """``s`` with ``not`` (unless native or already being lowered), ``if/then/else`` and
        the dependency keywords rewritten as allOf/anyOf; None when nothing changes."""
        drop, extra = self.local_parts(s, ptr)
        if "not" in s and not self.native_not(s) and canon(s["not"]) not in self.negating:
            extra.append(self.negate(s["not"]))
            drop.append("not")
        if not extra and not drop:
            return None
        out = {k: v for k, v in s.items() if k not in drop and k not in ("$ref", "allOf")}
        conj = [*([{"$ref": s["$ref"]}] if "$ref" in s else []), *s.get("allOf", []), *extra]
        if conj:
            out["allOf"] = conj
        out[ORIGIN] = s.get(ORIGIN, s)  # enum values are checked against the original
        return out

    def local_parts(self, s: dict, ptr: str) -> tuple[list[str], list]:
        """Keywords whose meaning is local to their schema object (``if``/``then``/``else``,
        dependencies), as (keywords to drop, equivalent schemas to conjoin): lowered before
        an allOf merge, which would otherwise pair an ``if`` with another branch's ``then``."""
        drop: list[str] = []
        extra: list = []
        if "if" in s or "then" in s or "else" in s:
            drop += [k for k in ("if", "then", "else") if k in s]
            if "if" in s and ("then" in s or "else" in s):
                cond = s["if"]
                extra.append(
                    {
                        "anyOf": [
                            {"allOf": [cond, s.get("then", True)]},
                            {"allOf": [self.negate(cond), s.get("else", True)]},
                        ]
                    }
                )
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = s.get(kw)
            if kw not in s or not isinstance(deps, dict):
                continue
            drop.append(kw)
            if len(deps) > 8:
                raise ConstraintTooComplex(
                    f"{kw} with {len(deps)} keys exceeds the bound (8)", path=child(ptr, kw)
                )
            required = set(s.get("required", [])) if isinstance(s.get("required"), list) else set()
            for key, dep in deps.items():
                if isinstance(dep, list) and set(dep) <= required:
                    continue  # holds already
                # dependents first: instances tend to list what a key depends on before it
                then = (
                    {"required": [*dep, key]}
                    if isinstance(dep, list)
                    else {"required": [key], "allOf": [dep]}
                )
                # where the key is required the dependency simply holds (no alternative)
                extra.append(then if key in required else {"anyOf": [{"properties": {key: False}}, then]})
        return drop, extra

    def compile_lowered(self, s: dict, lowered: dict, ptr: str):
        key = canon(s["not"]) if "not" in s and "not" not in lowered else None
        if key is not None:
            self.negating.append(key)
        try:
            return self.compile(lowered, ptr)
        except ConstraintError as e:
            kw = "not" if key is not None else "if" if "if" in s and "if" not in lowered else None
            if kw is None or isinstance(e, ConstraintTooComplex) or "keyword 'not'" not in str(e):
                raise
            # a residual negation below: name the keyword written in the schema
            inner = getattr(e, "residual", e.path)
            err = ConstraintError(
                f"JSON Schema keyword '{kw}' cannot be enforced by the grammar: part of its "
                f"negation has no positive form (residual at {inner}); pass lenient=True to "
                "relax it",
                path=child(ptr, kw),
            )
            err.residual = inner
            raise err from None
        finally:
            if key is not None:
                self.negating.pop()

    # ------------------------------------------------------------------ oneOf
    def exactly_one(
        self, s: dict, branches: list, base: dict, pairs: list[tuple[int, int]], ptr: str
    ) -> list:
        """Per branch, the schema "this branch and none of those it may overlap" (the
        negations of the others), each with its original for enum filtering."""
        others: dict[int, list[int]] = {i: [] for i in range(len(branches))}
        for i, j in pairs:
            others[i].append(j)
            others[j].append(i)
        origin = s.get(ORIGIN, s)
        negs = {j: self.negate(branches[j]) for j in {j for i, j in pairs} | {i for i, j in pairs}}
        out = []
        for i, b in enumerate(branches):
            if len(others[i]) > 1:
                parts = [
                    base,
                    b,
                    self.none_of([branches[j] for j in others[i]], 0, [negs[j] for j in others[i]]),
                ]
            else:
                parts = [base, b, *(negs[j] for j in others[i])]
            out.append({"allOf": parts, ORIGIN: {"allOf": [origin, b]}})
        if len(out) > MAX_BRANCHES:
            raise ConstraintTooComplex(
                f"oneOf of {len(out)} branches exceeds the bound ({MAX_BRANCHES})", path=ptr
            )
        return out

    def exact_oneof(
        self, s: dict, branches: list, base: dict, pairs: list[tuple[int, int]], ptr: str
    ) -> list | None:
        """The branches of an exact oneOf (compiled), or None where it is relaxed to anyOf."""
        lenient, self.lenient = self.lenient, False
        try:
            schemas = self.exactly_one(s, branches, base, pairs, ptr)
            return [self.compile(x, child(ptr, "oneOf", i)) for i, x in enumerate(schemas)]
        except ConstraintError as e:
            why = str(e)
        finally:
            self.lenient = lenient
        self.relax(
            "oneOf",
            child(ptr, "oneOf"),
            "branches are not provably disjoint and their negation fails (" + why + "); relaxed to anyOf",
        )
        return None
