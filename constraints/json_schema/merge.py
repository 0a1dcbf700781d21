"""allOf merging and oneOf disjointness for the JSON Schema front end (a mixin of the compiler)."""

from __future__ import annotations

import math
from decimal import Decimal

from ..errors import ConstraintError, ConstraintTooComplex
from .common import (
    ADDL,
    ANNOTATIONS,
    CONTAINS,
    MAX_BRANCHES,
    MAX_DEPTH,
    ORIGIN,
    PATTERNS,
    TYPES,
    canon,
    child,
    is_trivial,
    json_type,
)


def _constraining_other(b: dict, key: str) -> bool:
    return any(k != key and (k not in ANNOTATIONS or k == "format") for k in b)


def _both(a: object, b: object) -> object:
    """Schema of ``a`` and ``b`` (one where the other is trivial or the same)."""
    return b if is_trivial(a) else a if is_trivial(b) or a == b else {"allOf": [a, b]}


class MergeMixin:
    def _type_set(self, b: object, depth: int = 0) -> set[str] | None:
        """The instance types ``b`` may accept (None: any); ``integer`` stands with ``number``."""
        if depth > 16:
            return None
        if not isinstance(b, dict):
            return None if b is not False else set()
        own: set[str] | None = None
        if "const" in b or "enum" in b:
            vals = [b["const"]] if "const" in b else b.get("enum", [])
            own = {json_type(v) for v in vals} if isinstance(vals, list) else None
            if own is not None and "integer" in own:
                own.add("number")
        elif "type" in b:
            t = b["type"]
            own = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
            if own is not None and "number" in own:
                own.add("integer")
        subs = []
        if isinstance(b.get("$ref"), str):
            try:
                target, _ = self.resolve(b["$ref"], "#")
            except ConstraintError:
                target = True
            subs.append(self._type_set(target, depth + 1))
        subs += [self._type_set(y, depth + 1) for y in b.get("allOf", []) if isinstance(b.get("allOf"), list)]
        for sub in subs:
            if sub is not None:
                own = sub if own is None else own & (sub | ({"integer"} if "number" in sub else set()))
        return own

    def _object_view(self, b: object, depth: int = 0) -> dict | None:
        """``b`` resolved through $ref (and single-branch allOf) for object-keyword checks."""
        while isinstance(b, dict) and depth < 16:
            if isinstance(b.get("$ref"), str) and not _constraining_other(b, "$ref"):
                try:
                    b, _ = self.resolve(b["$ref"], "#")
                except ConstraintError:
                    return None
            elif (
                isinstance(b.get("allOf"), list)
                and len(b["allOf"]) == 1
                and not _constraining_other(b, "allOf")
            ):
                b = b["allOf"][0]
            else:
                break
            depth += 1
        return b if isinstance(b, dict) else None

    def _forbids(self, o: dict, key: str) -> bool:
        """Whether object schema ``o`` rejects every object with ``key``."""
        props = o.get("properties") if isinstance(o.get("properties"), dict) else {}
        if key in props:
            return props[key] is False
        if any(self.search(p, key) for p in o.get("patternProperties", {}) if isinstance(p, str)):
            return False
        return o.get("additionalProperties", True) is False

    def disjoint2(self, a: object, b: object, base_types: set[str] | None, depth: int = 0) -> bool:
        """Whether no instance satisfies both ``a`` and ``b`` (sound, incomplete)."""
        if a is False or b is False:
            return True
        ta, tb = self._type_set(a), self._type_set(b)
        if base_types is not None:
            ta = base_types if ta is None else ta & base_types
            tb = base_types if tb is None else tb & base_types
        if ta is not None and tb is not None and not (ta & tb):
            return True
        oa, ob = self._object_view(a), self._object_view(b)
        if oa is None or ob is None:
            return False
        both = ta & tb if ta is not None and tb is not None else ta if ta is not None else tb
        if both is not None and self._counts_disjoint(oa, ob, both):
            return True
        if depth <= 4:
            # a conjunction excludes what one of its parts excludes
            for x, y in ((oa, ob), (ob, oa)):
                if (
                    isinstance(x.get("allOf"), list)
                    and len(x["allOf"]) > 1
                    and any(self.disjoint2(c, y, base_types, depth + 1) for c in x["allOf"])
                ):
                    return True
        if ("const" in oa or "enum" in oa) and ("const" in ob or "enum" in ob):
            va = [oa["const"]] if "const" in oa else oa["enum"]
            vb = [ob["const"]] if "const" in ob else ob["enum"]
            if (
                isinstance(va, list)
                and isinstance(vb, list)
                and not ({canon(v) for v in va} & {canon(v) for v in vb})
            ):
                return True
        # object keywords say nothing about other types: one side must accept objects only
        if not (ta is not None and ta <= {"object"} or tb is not None and tb <= {"object"}) or depth > 4:
            return False
        ra = (
            [k for k in oa.get("required", []) if isinstance(k, str)]
            if isinstance(oa.get("required"), list)
            else []
        )
        rb = (
            [k for k in ob.get("required", []) if isinstance(k, str)]
            if isinstance(ob.get("required"), list)
            else []
        )
        if any(self._forbids(ob, k) for k in ra) or any(self._forbids(oa, k) for k in rb):
            return True
        pa = oa.get("properties") if isinstance(oa.get("properties"), dict) else {}
        pb = ob.get("properties") if isinstance(ob.get("properties"), dict) else {}
        for key in set(ra) & set(rb):
            if key in pa and key in pb and self.disjoint2(pa[key], pb[key], None, depth + 1):
                return True  # a discriminator
        return False

    @staticmethod
    def _counts_disjoint(oa: dict, ob: dict, types: set[str]) -> bool:
        """Whether the size bounds of ``oa`` and ``ob`` exclude each other for the one type
        both may accept (e.g. ``maxItems: 0`` against ``minItems: 1`` for arrays)."""
        for t, lo_k, hi_k in (
            ("array", "minItems", "maxItems"),
            ("string", "minLength", "maxLength"),
            ("object", "minProperties", "maxProperties"),
        ):
            if not types <= {t}:
                continue
            los = [
                x[lo_k] for x in (oa, ob) if isinstance(x.get(lo_k), int) and not isinstance(x[lo_k], bool)
            ]
            his = [
                x[hi_k] for x in (oa, ob) if isinstance(x.get(hi_k), int) and not isinstance(x[hi_k], bool)
            ]
            if los and his and max(los) > min(his):
                return True
        return False

    def overlapping(self, branches: list, base: dict) -> list[tuple[int, int]]:
        """Pairs of branches (i < j) not provably disjoint under ``base``."""
        bt = self._type_set(
            {k: v for k, v in base.items() if k in ("type", "enum", "const", "$ref", "allOf")}
        )
        return [
            (i, j)
            for j in range(len(branches))
            for i in range(j)
            if not self.disjoint2(branches[i], branches[j], bt)
        ]

    def disjoint(self, branches: list, base: dict) -> bool:
        return not self.overlapping(branches, base)

    # ----------------------------------------------------------------- allOf merge
    def merge_all(self, s: dict, ptr: str) -> dict:
        merged: dict = {k: v for k, v in s.items() if k != "allOf"}
        for i, b in enumerate(s["allOf"]):
            merged = self.merge2(merged, self.flatten(b, child(ptr, "allOf", i), 0), ptr)
        merged[ORIGIN] = s.get(ORIGIN, s)
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
        # keywords the grammar cannot enforce are checked on the merged schema, where an
        # enum may filter them or `not` and friends are lowered
        drop, extra = self.local_parts(b, ptr)
        out = {k: v for k, v in b.items() if k not in ("$ref", "allOf") and k not in drop}
        for x in extra:
            out = self.merge2(out, self.flatten(x, ptr, depth + 1), ptr)
        if "$ref" in b:
            target, tptr = self.resolve(b["$ref"], child(ptr, "$ref"))
            # a target being compiled (recursion through properties or items) merges like
            # any other: its subschemas stay references; only a chain of allOf/$ref back to
            # itself has no merge
            if tptr in self.flattening:
                raise ConstraintError(
                    "a recursive $ref cannot be merged with sibling keywords or allOf", path=ptr
                )
            self.flattening.append(tptr)
            try:
                out = self.merge2(out, self.flatten(target, tptr, depth + 1), ptr)
            finally:
                self.flattening.pop()
        for i, x in enumerate(b.get("allOf", [])):
            out = self.merge2(out, self.flatten(x, child(ptr, "allOf", i), depth + 1), ptr)
        return out

    def merge2(self, a: dict, b: dict, ptr: str) -> dict:
        counts = ("minContains", "maxContains")
        # minContains/maxContains count the items of their own contains (none: no effect)
        a, b = ({k: v for k, v in x.items() if k not in counts or "contains" in x} for x in (a, b))
        out = {k: v for k, v in a.items() if k not in counts}
        for k, vb in b.items():
            if k in ANNOTATIONS - {"format"} or k == ORIGIN or k in counts:
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
                both = (ta & tb) | (
                    {"integer"}
                    if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb)
                    else set()
                )
                out[k] = [t for t in TYPES if t in both]
            elif k == "required":
                out[k] = list(dict.fromkeys([*va, *vb]))
            elif k in (
                "minimum",
                "minLength",
                "minItems",
                "minProperties",
                "exclusiveMinimum",
            ) and not isinstance(va, bool):
                out[k] = max(va, vb)
            elif k in (
                "maximum",
                "maxLength",
                "maxItems",
                "maxProperties",
                "exclusiveMaximum",
            ) and not isinstance(va, bool):
                out[k] = min(va, vb)
            elif k in ("enum", "const"):
                pass  # filtered against the original node when compiled
            elif k == "pattern":
                out[PATTERNS] = [*out.get(PATTERNS, [va]), vb]
            elif k == "multipleOf":
                if isinstance(va, int) and isinstance(vb, int):
                    out[k] = va * vb // math.gcd(va, vb)
                elif Decimal(str(va)) % Decimal(str(vb)) == 0:
                    out[k] = va
                elif Decimal(str(vb)) % Decimal(str(va)) == 0:
                    out[k] = vb
                else:
                    raise ConstraintError("cannot merge multipleOf values under allOf", path=ptr)
            elif k == "not":
                out[k] = {"anyOf": [va, vb]}  # not a and not b: neither holds
            elif k in ("anyOf", "oneOf"):
                if len(va) * len(vb) > MAX_BRANCHES * 16:
                    raise ConstraintTooComplex(
                        f"allOf of {k} branches exceeds {MAX_BRANCHES} combinations", path=ptr
                    )
                # pairs that provably exclude each other (or the types already merged) never hold:
                # left out (for oneOf too: exactly one pair holds iff one branch of each side does)
                bt = self._type_set({x: out[x] for x in ("type", "enum", "const") if x in out})
                prod = [_both(x, y) for x in va for y in vb if not self.disjoint2(x, y, bt)] or [False]
                if len(prod) > MAX_BRANCHES:
                    raise ConstraintTooComplex(
                        f"allOf of {k} branches exceeds {MAX_BRANCHES} combinations", path=ptr
                    )
                out[k] = prod
            elif k == "contains":
                # two contains may be met by different items: not one contains of both, but the
                # second is kept apart (compile_array enforces both where the counts are plain)
                if any(c in x for x in (a, b) for c in counts):
                    raise ConstraintError(
                        "cannot merge two different 'contains' with minContains/maxContains under allOf",
                        path=ptr,
                    )
                out[CONTAINS] = [*out.get(CONTAINS, []), vb]
            elif k in (CONTAINS, ADDL):
                out[k] = [*va, *vb]
            elif k in ("items", "additionalProperties", "propertyNames", "additionalItems"):
                out[k] = _both(va, vb)
            elif k in ("properties", "patternProperties", "prefixItems"):
                pass  # below
            else:
                raise ConstraintError(f"cannot merge '{k}' under allOf", path=ptr)
        if any(c in x for x in (a, b) for c in counts):
            out.update(self._merge_counts(a, b))
        if (
            "properties" in a
            and "properties" in b
            or ("additionalProperties" in a or "additionalProperties" in b)
            or ADDL in a
            or ADDL in b
        ):
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
                px, other = (
                    (b["prefixItems"], a["items"]) if "prefixItems" in b else (a["prefixItems"], b["items"])
                )
                out["prefixItems"] = [{"allOf": [p, other]} for p in px]
        return out

    @staticmethod
    def _merge_counts(a: dict, b: dict) -> dict:
        """The counts of one contains (both sides' when they share it): the larger minimum
        (1 by default), the smaller maximum."""
        sides = [x for x in (a, b) if "contains" in x]
        lo = max(int(x.get("minContains", 1)) for x in sides)
        his = [int(x["maxContains"]) for x in sides if "maxContains" in x]
        out: dict = {} if lo == 1 else {"minContains": lo}
        if his:
            out["maxContains"] = min(his)
        return out

    def _merge_props(self, a: dict, b: dict, ptr: str) -> dict:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        ppa, ppb = a.get("patternProperties") or {}, b.get("patternProperties") or {}
        # a key matching a pattern of one side only still takes the other's additionalProperties:
        # kept apart (ADDL) where both sides have different patterns
        apart = bool(ppa and ppb and set(ppa) != set(ppb))
        extra_addl = [*a.get(ADDL, []), *b.get(ADDL, [])]
        if apart:
            extra_addl += [
                (list(x["patternProperties"]), x["additionalProperties"])
                for x in (a, b)
                if "additionalProperties" in x and not is_trivial(x["additionalProperties"])
            ]

        def side(x: dict, props: dict, key: str) -> object:
            if key in props:
                return props[key]
            pats = [v for p, v in (x.get("patternProperties") or {}).items() if self.search(p, key)]
            pats += [v for ps, v in x.get(ADDL, []) if not any(self.search(p, key) for p in ps)]
            if pats:
                return {"allOf": pats}
            return x.get("additionalProperties", True)

        props = {}
        for key in dict.fromkeys([*pa, *pb]):
            sa, sb = side(a, pa, key), side(b, pb, key)
            props[key] = _both(sa, sb)
        out: dict = {"properties": props}
        adds = [x["additionalProperties"] for x in (a, b) if "additionalProperties" in x]
        if adds:
            out["additionalProperties"] = adds[0] if len(adds) == 1 else _both(*adds)
        pp = {}
        for x, y in ((a, b), (b, a)):
            for p, v in (x.get("patternProperties") or {}).items():
                if not apart and not y.get("patternProperties") and "additionalProperties" in y:
                    # no pattern of y matches this key: y's additionalProperties applies to it
                    v = {"allOf": [v, y["additionalProperties"]]}
                pp[p] = {"allOf": [pp[p], v]} if p in pp else v
        if pp:
            out["patternProperties"] = pp
        if extra_addl:
            out[ADDL] = extra_addl
        return out
