"""allOf merging and oneOf disjointness for the JSON Schema front end (a mixin of the compiler)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import ConstraintError, ConstraintTooComplex
from .json_common import (
    _ORIGIN,
    _PATTERNS,
    ANNOTATIONS,
    MAX_BRANCHES,
    MAX_DEPTH,
    TYPES,
    _canon,
    _child,
    _is_trivial,
    _json_type,
)


class MergeMixin:
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
