"""JSON Schema (draft 2020-12, plus draft-7 forms) → grammar IR.

:func:`schema_to_grammar` lowers a schema to a :class:`~deepinfer.constraints.ir.Grammar`
whose start rule accepts JSON texts valid under the schema. Choices the grammar makes
(documented in the README):

- objects list their declared ``properties`` in schema order; other keys (when allowed)
  come after them; ``strict=True`` forbids keys not declared;
- values are written canonically (``json.dumps(..., separators=(",", ":"),
  ensure_ascii=False)``): bounded numbers are plain decimals without exponent, enum and
  const values are their compact serialization (an integral number also as ``N.0``);
- ``whitespace="flexible"`` allows, between tokens, at most one line break followed by at
  most :data:`FLEX_INDENT` spaces or tabs (enough for ``json.dumps(indent=2)`` ten levels
  deep), so a model cannot emit whitespace until max_tokens;
- ``format`` is enforced (an assertion) for the formats in
  :data:`~deepinfer.constraints.json_formats.SUPPORTED_FORMATS`; others are annotations;
- a keyword the grammar cannot enforce raises :class:`ConstraintError` naming it and its
  JSON pointer, unless ``lenient=True``: then it is relaxed and listed in ``grammar.notes``.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from urllib.parse import unquote

from . import json_formats as jf
from . import json_numbers as jn
from .errors import ConstraintError, ConstraintTooComplex
from .ir import ANY_CHAR, EMPTY, NOTHING, Alt, Expr, Grammar, Ref, Repeat, Seq, alt, lit, opt, rep, seq, star

FLEX_INDENT = 20
MAX_DEPTH = 64  # nested schema levels while compiling
MAX_ENUM = 10_000  # enum values
MAX_REPEAT_COST = 400_000  # IR nodes a counted repetition may expand to
MAX_BRANCHES = 256  # anyOf x anyOf products while merging allOf

ANNOTATIONS = {
    "title", "description", "examples", "default", "$comment", "$schema", "$id", "id", "readOnly",
    "writeOnly", "deprecated", "contentMediaType", "contentEncoding", "contentSchema", "$defs",
    "definitions", "$anchor", "$dynamicAnchor", "$vocabulary", "format", "discriminator", "nullable",
}
UNSUPPORTED = (
    "uniqueItems", "not", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentSchemas", "dependentRequired", "dependencies", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef",
)
SUPPORTED = (
    "type", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
)
TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
_ORIGIN = "\x00origin"  # merged schemas remember the node they came from (for enum filtering)
_PATTERNS = "\x00patterns"


def _child(ptr: str, *keys: object) -> str:
    for k in keys:
        ptr += "/" + str(k).replace("~", "~0").replace("/", "~1")
    return ptr


def _load(schema: object) -> object:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"schema is not valid JSON: {e}", path="#") from None
    if isinstance(schema, type):
        try:
            import pydantic
        except ImportError as e:  # pragma: no cover
            raise ImportError("JSON Schema from a model class needs pydantic: pip install pydantic") from e
        if issubclass(schema, pydantic.BaseModel):
            return schema.model_json_schema()
        raise ConstraintError(f"expected a JSON Schema, got the class {schema.__name__}", path="#")
    if isinstance(schema, (dict, bool)):
        return schema
    raise ConstraintError(f"expected a JSON Schema (dict, bool, JSON text or model), got {type(schema).__name__}")


def _is_trivial(s: object) -> bool:
    """True for schemas that accept everything (``true``, ``{}``, annotations only)."""
    return s is True or (isinstance(s, dict) and all(k in ANNOTATIONS - {"format"} for k in s))


def _constraining(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ANNOTATIONS or k == "format"}


class _SchemaCompiler:
    def __init__(self, root: object, whitespace: str, strict: bool, lenient: bool) -> None:
        if whitespace not in ("compact", "flexible"):
            raise ConstraintError(f"whitespace must be 'compact' or 'flexible', got {whitespace!r}")
        self.root = root
        self.strict = strict
        self.lenient = lenient
        self.notes: list[str] = []
        self.rules: dict[str, Expr] = {}
        self.stack: list[str] = []
        self.cache: dict[str, Expr] = {}
        self.recursive: set[str] = set()
        self.depth = 0
        self._validator = None
        self.ids: dict[str, tuple[object, str]] = {}
        self._index_ids(root, "#")
        ws = EMPTY
        if whitespace == "flexible":
            ws = seq(opt(seq(opt(lit("\r")), lit("\n"))), rep(jf.byte_set(b" \t"), 0, FLEX_INDENT))
        self.ws = ws
        self.comma = seq(ws, lit(","), ws)
        self.colon = seq(ws, lit(":"), ws)

    # ------------------------------------------------------------------ helpers
    def relax(self, keyword: str, ptr: str, why: str = "") -> None:
        if self.lenient:
            self.notes.append(f"{keyword} at {ptr}" + (f" ({why})" if why else ""))
            return
        raise ConstraintError(
            f"JSON Schema keyword '{keyword}' cannot be enforced by the grammar"
            + (f": {why}" if why else "") + "; pass lenient=True to relax it",
            path=ptr,
        )

    def repeat(self, item: Expr, lo: int, hi: int | None, ptr: str, what: str) -> Expr:
        n = hi if hi is not None else lo
        if n > 64 and n * _cost(item) > MAX_REPEAT_COST:
            raise ConstraintTooComplex(
                f"{what} {n} of an item of {_cost(item)} grammar nodes exceeds the size bound ({MAX_REPEAT_COST})",
                path=ptr,
            )
        return rep(item, lo, hi)

    def _index_ids(self, node: object, ptr: str) -> None:
        if isinstance(node, dict):
            for key in ("$id", "id"):
                if isinstance(node.get(key), str):
                    self.ids[node[key]] = (node, ptr)
            if isinstance(node.get("$anchor"), str):
                self.ids["#" + node["$anchor"]] = (node, ptr)
            for k, v in node.items():
                if k not in ("enum", "const", "default", "examples"):
                    self._index_ids(v, _child(ptr, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self._index_ids(v, _child(ptr, i))

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
                raise ConstraintError(f"$ref {ref!r} points outside this schema (remote refs are not fetched)", path=ptr)
            ref = "#" + frag
        if not ref.startswith("#"):
            raise ConstraintError(f"$ref {ref!r} points outside this schema (remote refs are not fetched)", path=ptr)
        return self._walk(self.root, "#", ref[1:], ref, ptr)

    def _walk(self, node: object, base: str, frag: str, ref: str, ptr: str) -> tuple[object, str]:
        if frag and not frag.startswith("/"):
            raise ConstraintError(f"$ref {ref!r}: unknown anchor", path=ptr)
        target, tptr = node, base
        for raw in frag.split("/")[1:]:
            key = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and key in target:
                target = target[key]
            elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
                target = target[int(key)]
            else:
                raise ConstraintError(f"$ref {ref!r} does not resolve", path=ptr)
            tptr = _child(tptr, key)
        return target, tptr

    def validator(self, node: object):
        import jsonschema

        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.root, default=jsonschema.Draft202012Validator)
            self._validator = cls(self.root)
        return self._validator.evolve(schema=node)

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
        if tptr in self.recursive or (tptr != "#" and _cost(e) > 64):
            # a named rule: the automaton inlines it where small, keeps it a rule where shared and large
            self.rules[name] = e
            e = Ref(name)
        self.cache[tptr] = e
        return e

    def compile(self, s: object, ptr: str) -> Expr:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ConstraintTooComplex(f"schema nesting deeper than {MAX_DEPTH} levels", path=ptr)
            return self._compile(s, ptr)
        finally:
            self.depth -= 1

    def _compile(self, s: object, ptr: str) -> Expr:
        if s is True:
            return self.any_value()
        if s is False:
            return NOTHING
        if not isinstance(s, dict):
            raise ConstraintError(f"a schema must be an object or a boolean, got {type(s).__name__}", path=ptr)
        self.check_unsupported(s, ptr)
        if "$ref" in s and _ORIGIN not in s:
            rest = _constraining({k: v for k, v in s.items() if k != "$ref"})
            if not rest:
                return self.ref(s["$ref"], _child(ptr, "$ref"))
            return self.compile({**{k: v for k, v in s.items() if k not in ("$ref", "allOf")},
                                 "allOf": [{"$ref": s["$ref"]}, *s.get("allOf", [])]}, ptr)
        if "allOf" in s:
            rest = _constraining({k: v for k, v in s.items() if k != "allOf"})
            branches = s["allOf"]
            if not isinstance(branches, list) or not branches:
                raise ConstraintError("allOf must be a non-empty array", path=ptr)
            nontrivial = [(i, b) for i, b in enumerate(branches) if not _is_trivial(b)]
            if not rest and len(nontrivial) <= 1:
                if not nontrivial:
                    return self.any_value()
                i, b = nontrivial[0]
                return self.compile(b, _child(ptr, "allOf", i))
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
            if kw == "uniqueItems" and v is False:
                continue
            if kw in ("minContains", "maxContains") and "contains" not in s:
                continue
            if kw == "if" and "then" not in s and "else" not in s:
                continue
            if kw in ("then", "else") and "if" not in s:
                continue
            if kw in ("then", "else"):
                continue  # reported once, as "if"
            if kw in ("unevaluatedProperties", "unevaluatedItems") and _is_trivial(v):
                continue
            if kw in ("dependentRequired", "dependentSchemas", "dependencies") and not v:
                continue
            self.relax(kw, _child(ptr, kw))

    def types_of(self, s: dict, ptr: str) -> list[str]:
        t = s.get("type")
        if t is None:
            return list(TYPES[:-1])
        ts = [t] if isinstance(t, str) else t
        if not isinstance(ts, list) or any(x not in TYPES for x in ts):
            raise ConstraintError(f"unknown type {t!r}", path=_child(ptr, "type"))
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
            self.rules[name] = NOTHING
            v = Ref(name)
            member = seq(jf.string_of(jf.CHAR), self.colon, v)
            obj = seq(lit("{"), self.ws, opt(seq(member, star(seq(self.comma, member)))), self.ws, lit("}"))
            arr = seq(lit("["), self.ws, opt(seq(v, star(seq(self.comma, v)))), self.ws, lit("]"))
            self.rules[name] = alt(lit("null"), lit("true"), lit("false"), jn.NUMBER, jf.string_of(jf.CHAR), obj, arr)
        return Ref(name)

    def value_lit(self, v: object) -> Expr:
        if isinstance(v, dict):
            members = [seq(lit(json.dumps(k, ensure_ascii=False)), self.colon, self.value_lit(x)) for k, x in v.items()]
            return seq(lit("{"), self.ws, *_join(members, self.comma), self.ws, lit("}"))
        if isinstance(v, list):
            return seq(lit("["), self.ws, *_join([self.value_lit(x) for x in v], self.comma), self.ws, lit("]"))
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
                raise ConstraintError("enum must be an array", path=_child(ptr, "enum"))
        if len(values) > MAX_ENUM:
            raise ConstraintTooComplex(f"enum of {len(values)} values exceeds the bound ({MAX_ENUM})", path=_child(ptr, kw))
        node = s.get(_ORIGIN, s)
        check = self.validator(node)
        ok = [v for v in values if check.is_valid(v)]
        if not ok:
            raise ConstraintError(f"no {kw} value satisfies the schema (unsatisfiable)", path=_child(ptr, kw))
        return alt(*(self.value_lit(v) for v in ok))

    def compile_choice(self, s: dict, kw: str, ptr: str) -> Expr:
        branches = s[kw]
        if not isinstance(branches, list) or not branches:
            raise ConstraintError(f"{kw} must be a non-empty array", path=_child(ptr, kw))
        base = {k: v for k, v in s.items() if k != kw}
        if kw == "oneOf" and len(branches) > 1 and not self.disjoint(branches, base):
            self.relax("oneOf", _child(ptr, kw), "branches are not provably disjoint; relaxed to anyOf")
        trivial_base = not _constraining({k: v for k, v in base.items() if k != _ORIGIN})
        parts = []
        for i, b in enumerate(branches):
            bptr = _child(ptr, kw, i)
            if trivial_base:
                parts.append(self.compile(b, bptr))
            else:
                parts.append(self.compile({"allOf": [base, b]}, bptr))
        return alt(*parts)

    # ----------------------------------------------------------------- oneOf
    def _shallow(self, b: object, depth: int = 0) -> object:
        """Resolve $ref / single-branch allOf chains for disjointness checks."""
        while isinstance(b, dict) and "$ref" in b and depth < 16:
            b, _ = self.resolve(b["$ref"], "#")
            depth += 1
        return b

    def _type_set(self, b: object) -> set[str] | None:
        b = self._shallow(b)
        if not isinstance(b, dict):
            return None if b is True else set()
        if "const" in b or "enum" in b:
            vals = [b["const"]] if "const" in b else b.get("enum", [])
            return {_json_type(v) for v in vals}
        t = b.get("type")
        if t is None:
            if "allOf" in b:
                sets = [x for x in (self._type_set(y) for y in b["allOf"]) if x is not None]
                return set.intersection(*sets) if sets else None
            return None
        ts = {t} if isinstance(t, str) else set(t)
        if "number" in ts:
            ts.add("integer")
        return ts

    def disjoint(self, branches: list, base: dict) -> bool:
        sets = [self._type_set(b) for b in branches]
        if all(x is not None for x in sets):
            if all(not (sets[i] & sets[j]) for i in range(len(sets)) for j in range(i)):
                return True
        # all enum/const with pairwise distinct values
        vals = []
        for b in branches:
            b = self._shallow(b)
            if isinstance(b, dict) and ("const" in b or "enum" in b):
                vals.append({_canon(v) for v in ([b["const"]] if "const" in b else b["enum"])})
            else:
                break
        else:
            if all(not (vals[i] & vals[j]) for i in range(len(vals)) for j in range(i)):
                return True
        # a discriminator: a property required in every branch with disjoint const/enum values
        objs = [self._shallow(b) for b in branches]
        if not all(isinstance(o, dict) and isinstance(o.get("properties"), dict) for o in objs):
            return False
        common = set(objs[0]["properties"])
        for o in objs[1:]:
            common &= set(o["properties"])
        for key in common:
            dvals = []
            for o in objs:
                p = self._shallow(o["properties"][key])
                if key not in o.get("required", []) or not isinstance(p, dict) or not ("const" in p or "enum" in p):
                    break
                dvals.append({_canon(v) for v in ([p["const"]] if "const" in p else p["enum"])})
            else:
                if all(not (dvals[i] & dvals[j]) for i in range(len(dvals)) for j in range(i)):
                    return True
        return False

    # ----------------------------------------------------------------- allOf merge
    def merge_all(self, s: dict, ptr: str) -> dict:
        merged: dict = {k: v for k, v in s.items() if k != "allOf"}
        for i, b in enumerate(s["allOf"]):
            merged = self.merge2(merged, self.flatten(b, _child(ptr, "allOf", i), 0), ptr)
        merged[_ORIGIN] = s.get(_ORIGIN, s)
        return merged

    def flatten(self, b: object, ptr: str, depth: int) -> dict:
        if depth > MAX_DEPTH:
            raise ConstraintTooComplex("allOf/$ref chain too deep to merge", path=ptr)
        if b is True:
            return {}
        if b is False:
            return {"enum": []}
        if not isinstance(b, dict):
            raise ConstraintError("a schema must be an object or a boolean", path=ptr)
        self.check_unsupported(b, ptr)
        out = {k: v for k, v in b.items() if k not in ("$ref", "allOf")}
        if "$ref" in b:
            target, tptr = self.resolve(b["$ref"], _child(ptr, "$ref"))
            if tptr in self.stack:
                raise ConstraintError("a recursive $ref cannot be merged with sibling keywords or allOf", path=ptr)
            self.stack.append(tptr)
            try:
                out = self.merge2(out, self.flatten(target, tptr, depth + 1), ptr)
            finally:
                self.stack.pop()
        for i, x in enumerate(b.get("allOf", [])):
            out = self.merge2(out, self.flatten(x, _child(ptr, "allOf", i), depth + 1), ptr)
        return out

    def merge2(self, a: dict, b: dict, ptr: str) -> dict:
        out = dict(a)
        for k, vb in b.items():
            if k in ANNOTATIONS - {"format"} or k == _ORIGIN:
                continue
            if k not in out:
                out[k] = vb
                continue
            va = out[k]
            if va == vb and k not in ("anyOf", "oneOf"):
                continue
            if k == "type":
                ta = {va} if isinstance(va, str) else set(va)
                tb = {vb} if isinstance(vb, str) else set(vb)
                both = (ta & tb) | ({"integer"} if ("integer" in ta and "number" in tb) or
                                    ("number" in ta and "integer" in tb) else set())
                out[k] = [t for t in TYPES if t in both]
            elif k == "required":
                out[k] = list(dict.fromkeys([*va, *vb]))
            elif k in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum") and not isinstance(va, bool):
                out[k] = max(va, vb)
            elif k in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum") and not isinstance(va, bool):
                out[k] = min(va, vb)
            elif k in ("enum", "const"):
                pass  # filtered against the original node when compiled
            elif k == "pattern":
                out[_PATTERNS] = [*out.get(_PATTERNS, [va]), vb]
            elif k == "multipleOf":
                if isinstance(va, int) and isinstance(vb, int):
                    out[k] = va * vb // math.gcd(va, vb)
                elif Decimal(str(va)) % Decimal(str(vb)) == 0:
                    out[k] = va
                elif Decimal(str(vb)) % Decimal(str(va)) == 0:
                    out[k] = vb
                else:
                    raise ConstraintError("cannot merge multipleOf values under allOf", path=ptr)
            elif k in ("anyOf", "oneOf"):
                prod = [{"allOf": [x, y]} for x in va for y in vb]
                if len(prod) > MAX_BRANCHES:
                    raise ConstraintTooComplex(f"allOf of {k} branches exceeds {MAX_BRANCHES} combinations", path=ptr)
                out[k] = prod
            elif k in ("items", "additionalProperties", "propertyNames", "additionalItems", "contains"):
                out[k] = {"allOf": [va, vb]}
            elif k in ("properties", "patternProperties", "prefixItems"):
                pass  # below
            else:
                raise ConstraintError(f"cannot merge '{k}' under allOf", path=ptr)
        if "properties" in a and "properties" in b or ("additionalProperties" in a or "additionalProperties" in b):
            out.update(self._merge_props(a, b, ptr))
        elif "patternProperties" in a and "patternProperties" in b:
            out.update(self._merge_props(a, b, ptr))
        if "prefixItems" in a and "prefixItems" in b:
            pa, pb = a["prefixItems"], b["prefixItems"]
            ia, ib = a.get("items", True), b.get("items", True)
            n = max(len(pa), len(pb))
            out["prefixItems"] = [
                {"allOf": [pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib]} for i in range(n)
            ]
        elif "prefixItems" in a or "prefixItems" in b:
            if "items" in a and "prefixItems" in b or "items" in b and "prefixItems" in a:
                px, other = (b["prefixItems"], a["items"]) if "prefixItems" in b else (a["prefixItems"], b["items"])
                out["prefixItems"] = [{"allOf": [p, other]} for p in px]
        return out

    def _merge_props(self, a: dict, b: dict, ptr: str) -> dict:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        if ("patternProperties" in a or "patternProperties" in b) and (
            "additionalProperties" in a or "additionalProperties" in b
        ):
            raise ConstraintError("cannot merge patternProperties with additionalProperties under allOf", path=ptr)

        def side(x: dict, props: dict, key: str) -> object:
            if key in props:
                return props[key]
            pats = [v for p, v in x.get("patternProperties", {}).items() if re.search(p, key)]
            if pats:
                return {"allOf": pats}
            return x.get("additionalProperties", True)

        props = {}
        for key in dict.fromkeys([*pa, *pb]):
            sa, sb = side(a, pa, key), side(b, pb, key)
            props[key] = sb if _is_trivial(sa) else sa if _is_trivial(sb) else {"allOf": [sa, sb]}
        out: dict = {"properties": props}
        adds = [x["additionalProperties"] for x in (a, b) if "additionalProperties" in x]
        if adds:
            out["additionalProperties"] = adds[0] if len(adds) == 1 else {"allOf": adds}
        pp = {}
        for x in (a, b):
            for p, v in x.get("patternProperties", {}).items():
                pp[p] = {"allOf": [pp[p], v]} if p in pp else v
        if pp:
            out["patternProperties"] = pp
        return out

    # ----------------------------------------------------------------- strings
    def pattern_raw(self, pattern: str, ptr: str) -> Expr:
        from .regex import regex_to_ir

        branches = _split_top(pattern)
        parts = []
        for br in branches:
            head = br.startswith("^")
            tail = br.endswith("$") and not _escaped_at(br, len(br) - 1)
            body = br[1 if head else 0: len(br) - 1 if tail else len(br)]
            try:
                e = regex_to_ir(body) if body else EMPTY
            except ConstraintError as err:
                raise ConstraintError(f"pattern {pattern!r}: {err}", path=ptr) from None
            anyc = star(ANY_CHAR)
            parts.append(seq(EMPTY if head else anyc, e, EMPTY if tail else anyc))
        return alt(*parts)

    def compile_string(self, s: dict, ptr: str) -> Expr:
        lo = int(s.get("minLength", 0))
        hi = s.get("maxLength")
        hi = int(hi) if hi is not None else None
        if hi is not None and hi < lo:
            return NOTHING
        raws: list[tuple[str, Expr]] = []
        patterns = s.get(_PATTERNS) or ([s["pattern"]] if "pattern" in s else [])
        for p in patterns:
            raws.append(("pattern", self.pattern_raw(p, _child(ptr, "pattern"))))
        fmt = s.get("format")
        if isinstance(fmt, str):
            f = jf.format_raw(fmt)
            if f is not None:
                raws.append(("format", f))
        if not raws:
            return jf.string_of(jf.CHAR, lo, hi) if hi is None or hi <= 64 else seq(
                jf.QUOTE, self.repeat(jf.CHAR, lo, hi, _child(ptr, "maxLength"), "maxLength"), jf.QUOTE)
        if len(raws) > 1:
            self.relax(raws[1][0], _child(ptr, raws[1][0]), f"only one of pattern/format per string; kept {raws[0][0]}")
        kind, raw = raws[0]
        if lo > 0 or hi is not None:
            raw = self.intersect_length(raw, lo, hi, kind, ptr)
        return seq(jf.QUOTE, jf.encode_raw(raw), jf.QUOTE)

    def intersect_length(self, raw: Expr, lo: int, hi: int | None, kind: str, ptr: str) -> Expr:
        out = jf.intersect_length(raw, lo, hi)
        if out is not None:
            return out
        kw = "maxLength" if hi is not None else "minLength"
        self.relax(kw, _child(ptr, kw), f"length bounds together with {kind}; {kind} kept, length not enforced")
        return raw

    # ----------------------------------------------------------------- numbers
    def compile_number(self, s: dict, ptr: str, *, integer: bool) -> Expr:
        def dec(k: str) -> Decimal | None:
            v = s.get(k)
            if v is None or isinstance(v, bool):
                return None
            if not isinstance(v, (int, float)):
                raise ConstraintError(f"{k} must be a number", path=_child(ptr, k))
            return Decimal(str(v)) if isinstance(v, float) else Decimal(v)

        lo, hi = dec("minimum"), dec("maximum")
        lo_x = hi_x = False
        if s.get("exclusiveMinimum") is True:
            lo_x = True
        if s.get("exclusiveMaximum") is True:
            hi_x = True
        emin, emax = dec("exclusiveMinimum"), dec("exclusiveMaximum")
        if emin is not None and (lo is None or emin >= lo):
            lo, lo_x = emin, True
        if emax is not None and (hi is None or emax <= hi):
            hi, hi_x = emax, True
        mult = dec("multipleOf")
        if mult is not None and mult <= 0:
            raise ConstraintError("multipleOf must be > 0", path=_child(ptr, "multipleOf"))
        if mult is not None and mult == mult.to_integral_value() and not integer:
            integer, mult = True, mult  # a multiple of an integer is an integer
        if integer:
            ilo = None if lo is None else int(math.floor(lo)) + 1 if lo_x and lo == lo.to_integral_value() else (
                None if lo is None else math.ceil(lo))
            ihi = None if hi is None else int(math.ceil(hi)) - 1 if hi_x and hi == hi.to_integral_value() else (
                None if hi is None else math.floor(hi))
            if ilo is not None and ihi is not None and ilo > ihi:
                return NOTHING
            if mult is not None and (mult == 1 or (1 / mult) == (1 / mult).to_integral_value()):
                mult = None
            if mult is None:
                return jn.int_range(ilo, ihi)
            m = int(mult)
            if ilo is not None and ihi is not None and (ihi - ilo) // m <= 2000:
                first = -(-ilo // m) * m
                vals = range(first, ihi + 1, m)
                return alt(*(lit(str(v)) for v in vals)) if vals else NOTHING
            self.relax("multipleOf", _child(ptr, "multipleOf"), "integer multipleOf over an unbounded range")
            return jn.int_range(ilo, ihi)
        cap = None
        if mult is not None:
            inv = 1 / mult
            if inv == inv.to_integral_value() and str(int(inv)).rstrip("0") == "1":
                cap = len(str(int(inv))) - 1
            else:
                self.relax("multipleOf", _child(ptr, "multipleOf"), "only powers of ten for non-integer numbers")
        if lo is None and hi is None and cap is None:
            return jn.NUMBER
        return jn.decimal_range(lo, hi, lo_excl=lo_x, hi_excl=hi_x, cap=cap)

    # ----------------------------------------------------------------- arrays
    def compile_array(self, s: dict, ptr: str) -> Expr:
        prefix = s.get("prefixItems")
        items = s.get("items", True)
        pptr = _child(ptr, "prefixItems")
        iptr = _child(ptr, "items")
        if isinstance(items, list):  # draft-7 tuple form
            prefix, pptr = items, iptr
            items, iptr = s.get("additionalItems", True), _child(ptr, "additionalItems")
        prefix = prefix or []
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = int(hi) if hi is not None else None
        if hi is not None and hi < lo:
            return NOTHING
        pexprs = [self.compile(p, _child(pptr, i)) for i, p in enumerate(prefix)]
        iexpr = self.compile(items, iptr)
        k = len(pexprs)
        # tail after the whole prefix: items, count between max(0, lo-k) and hi-k
        t_lo, t_hi = max(0, lo - k), (None if hi is None else hi - k)
        body: Expr
        if k == 0:
            if t_hi == 0:
                body = EMPTY
            else:
                more = self.repeat(seq(self.comma, iexpr), max(0, t_lo - 1), None if t_hi is None else t_hi - 1,
                                   _child(ptr, "maxItems"), "maxItems")
                body = seq(iexpr, more)
                if t_lo == 0:
                    body = opt(body)
        else:
            if t_hi is not None and t_hi < 0:
                pexprs = pexprs[:hi]
                k = len(pexprs)
                t_hi = 0
            tail = EMPTY if t_hi == 0 else self.repeat(seq(self.comma, iexpr), t_lo, t_hi, _child(ptr, "maxItems"),
                                                        "maxItems")
            body = tail
            for i in range(k - 1, -1, -1):
                cur = seq(self.comma if i > 0 else EMPTY, pexprs[i], body)
                body = cur if i < lo else opt(cur)
        return seq(lit("["), self.ws, body, self.ws, lit("]"))

    # ----------------------------------------------------------------- objects
    def compile_object(self, s: dict, ptr: str) -> Expr:
        props = s.get("properties", {})
        required = list(dict.fromkeys(s.get("required", [])))
        pats = s.get("patternProperties", {})
        addl = s.get("additionalProperties", True)
        if self.strict:
            addl = False
        names = s.get("propertyNames")
        pnames = names if names is not None and not _is_trivial(names) else None
        name_check = self.validator(pnames) if pnames is not None else None
        members: list[tuple[str, object, str]] = []  # (key, schema, pointer) in schema order
        for key, sub in props.items():
            members.append((key, sub, _child(ptr, "properties", key)))
        for key in required:
            if key not in props:
                pm = [(p, v) for p, v in pats.items() if re.search(p, key)]
                if pm:
                    members.append((key, {"allOf": [v for _, v in pm]}, _child(ptr, "patternProperties", pm[0][0])))
                elif addl is False:
                    raise ConstraintError(f"required property {key!r} is not allowed (additionalProperties is false)",
                                          path=_child(ptr, "required"))
                else:
                    members.append((key, addl, _child(ptr, "additionalProperties")))
        items: list[tuple[Expr, bool]] = []
        for key, sub, sptr in members:
            pm = [v for p, v in pats.items() if key in props and re.search(p, key)]
            if pm:
                sub = {"allOf": [sub, *pm]}
            value = self.compile(sub, sptr)
            ok = value != NOTHING and (name_check is None or name_check.is_valid(key))
            if not ok:
                if key in required:
                    raise ConstraintError(f"required property {key!r} cannot be satisfied", path=sptr)
                continue
            items.append((seq(lit(json.dumps(key, ensure_ascii=False)), self.colon, value), key in required))
        extra = self.extra_member(s, ptr, list(props) + required, pats, addl, pnames)
        lo = int(s.get("minProperties", 0))
        hi = s.get("maxProperties")
        hi = int(hi) if hi is not None else None
        body = self.members_body(items, extra, lo, hi, ptr)
        return seq(lit("{"), self.ws, body, self.ws, lit("}"))

    def extra_member(self, s: dict, ptr: str, declared: list[str], pats: dict, addl: object,
                     pnames: object) -> Expr | None:
        """One member whose key is not declared, or None when no such key is allowed."""
        parts = []
        for p, sub in pats.items():
            pptr = _child(ptr, "patternProperties", p)
            raw = self.pattern_raw(p, pptr)
            if any(re.search(p, k) for k in declared) or len(pats) > 1:
                self.relax("patternProperties", pptr, "pattern keys may overlap declared or other pattern keys")
            value = self.compile(sub, pptr)
            if value != NOTHING:
                parts.append(seq(jf.QUOTE, jf.encode_raw(raw), jf.QUOTE, self.colon, value))
        if addl is not False:
            aptr = _child(ptr, "additionalProperties")
            value = self.compile(addl, aptr)
            if value != NOTHING:
                if pats:
                    self.relax("additionalProperties", aptr,
                               "keys matching no patternProperties pattern are not generated")
                else:
                    key = jf.raw_except(declared)
                    if pnames is not None:
                        if declared:
                            self.relax("propertyNames", _child(ptr, "propertyNames"),
                                       "enforced on declared keys only")
                        else:
                            return seq(self.compile_key(pnames, _child(ptr, "propertyNames")), self.colon, value)
                    parts.append(seq(jf.QUOTE, jf.encode_raw(key), jf.QUOTE, self.colon, value))
        return alt(*parts) if parts else None

    def compile_key(self, names: object, ptr: str) -> Expr:
        """Keys under ``propertyNames`` (only its string part matters)."""
        if isinstance(names, dict):
            names = {**names, "type": "string"}
        return self.compile(names, ptr)

    def members_body(self, items: list[tuple[Expr, bool]], extra: Expr | None, lo: int, hi: int | None,
                     ptr: str) -> Expr:
        comma = self.comma
        n_req = sum(1 for _, r in items if r)
        n_max = len(items) if extra is None else None
        if hi is not None and hi < max(lo, n_req) or (n_max is not None and n_max < lo):
            return NOTHING
        simple = lo <= n_req and (hi is None or (n_max is not None and hi >= n_max))
        if simple:
            rest: list[Expr] = [EMPTY] * (len(items) + 1)
            for j in range(len(items) - 1, -1, -1):
                m, r = items[j]
                rest[j] = seq(seq(comma, m) if r else opt(seq(comma, m)), rest[j + 1])
            firsts = []
            for f, (m, r) in enumerate(items):
                firsts.append(seq(m, rest[f + 1]))
                if r:
                    break
            decl = alt(*firsts)
            if extra is None:
                return decl if n_req else opt(decl)
            tail = star(seq(comma, extra))
            parts = [seq(decl, tail)]
            if not n_req:
                parts.append(opt(seq(extra, tail)))
            return alt(*parts)
        n_opt = len(items) - n_req
        if n_opt > 12:
            raise ConstraintTooComplex(
                f"minProperties/maxProperties over {n_opt} optional properties exceeds the bound (12)",
                path=ptr)
        memo: dict = {}

        def d(j: int, c: int, first: bool) -> Expr:
            """Members j.. with exactly c of them present; ``first``: nothing emitted before."""
            if (j, c, first) in memo:
                return memo[j, c, first]
            if j == len(items):
                out = EMPTY if c == 0 else NOTHING
            elif c < 0:
                out = NOTHING
            else:
                m, r = items[j]
                took = seq(EMPTY if first else comma, m, d(j + 1, c - 1, False))
                out = took if r else alt(took, d(j + 1, c, first))
            memo[j, c, first] = out
            return out

        parts = []
        for c in range(n_req, len(items) + 1):
            if hi is not None and c > hi:
                break
            decl = d(0, c, True)
            if decl == NOTHING:
                continue
            if extra is None:
                if c >= lo:
                    parts.append(decl)
                continue
            e_lo, e_hi = max(0, lo - c), None if hi is None else hi - c
            if c > 0:
                parts.append(seq(decl, self.repeat(seq(comma, extra), e_lo, e_hi, _child(ptr, "maxProperties"),
                                                   "maxProperties")))
            elif e_hi != 0:
                more = self.repeat(seq(comma, extra), max(0, e_lo - 1), None if e_hi is None else e_hi - 1,
                                   _child(ptr, "maxProperties"), "maxProperties")
                parts.append(seq(extra, more) if e_lo > 0 else opt(seq(extra, more)))
            elif e_lo == 0:
                parts.append(EMPTY)
        return alt(*parts)


def _json_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _canon(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return json.dumps(v, sort_keys=True)


def _join(items: list[Expr], sep: Expr) -> list[Expr]:
    out: list[Expr] = []
    for i, x in enumerate(items):
        if i:
            out.append(sep)
        out.append(x)
    return out


def _cost(e: Expr, memo: dict | None = None) -> int:
    """Rough IR size with counted repetitions expanded (shared nodes counted once)."""
    memo = {} if memo is None else memo
    if id(e) in memo:
        return 1
    if isinstance(e, (Seq, Alt)):
        n = 1 + sum(_cost(x, memo) for x in e.items)
    elif isinstance(e, Repeat):
        n = 1 + _cost(e.item, memo) * max(1, e.max if e.max is not None else e.min)
    else:
        n = 1
    memo[id(e)] = (e, n)
    return n


def _escaped_at(p: str, i: int) -> bool:
    n = 0
    while i - 1 - n >= 0 and p[i - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def _split_top(p: str) -> list[str]:
    """Split a regex at its top-level ``|`` (outside groups and classes)."""
    out, depth, cls, start, i = [], 0, False, 0, 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if cls:
            if c == "]":
                cls = False
        elif c == "[":
            cls = True
            if p[i + 1: i + 2] == "]" or p[i + 1: i + 3] == "^]":
                i += 2 if p[i + 1] == "]" else 3
                continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(p[start:i])
            start = i + 1
        i += 1
    out.append(p[start:])
    return out


def schema_to_grammar(
    schema: object,
    *,
    whitespace: str = "compact",
    strict: bool = False,
    lenient: bool = False,
) -> Grammar:
    """Lower a JSON Schema to a grammar whose start rule accepts exactly its valid JSON texts.

    Parameters
    ----------
    schema:
        A schema as a dict or bool, its JSON text, or a pydantic model class.
    whitespace:
        ``"compact"`` (no whitespace) or ``"flexible"`` (bounded whitespace between tokens).
    strict:
        Forbid object keys that the schema does not declare (``additionalProperties: false``).
    lenient:
        Relax keywords the grammar cannot enforce instead of raising; ``grammar.notes`` says which.

    Raises
    ------
    ConstraintError
        Unsupported keyword (without ``lenient``), bad or unsatisfiable schema; the message
        names the JSON pointer.
    ConstraintTooComplex
        The schema would expand past a size bound (huge enums, counts, nesting).
    """
    root = _load(schema)
    c = _SchemaCompiler(root, whitespace, strict, lenient)
    start = c.ref("#", "#")
    if start == NOTHING or (isinstance(start, Ref) and c.rules.get(start.name) == NOTHING):
        raise ConstraintError("schema is unsatisfiable: no JSON value is valid", path="#")
    rules = {"start": start, **c.rules}
    return Grammar(rules=rules, start="start", notes=c.notes)
