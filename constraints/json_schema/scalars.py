"""Strings and numbers for the JSON Schema front end (a mixin of the compiler).

- strings: every ``pattern`` (ECMA-style search, anchors as written), the ``format`` and the
  length bounds are intersected on the encoded language between the quotes; a ``not`` whose
  operand is a string atom is a difference of raw string languages;
- numbers: bounds and ``multipleOf`` as integer or decimal range automata; ``not {"type":
  "integer"}`` keeps the non-integral numbers, ``not {"multipleOf": m}`` over integers is a
  difference of remainder automata.
"""

from __future__ import annotations

import math
from decimal import Decimal

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import ANY_CHAR, EMPTY, NOTHING, Expr, alt, difference, intersect, seq, star
from . import formats as jf
from . import numbers as jn
from .common import (
    MAX_LENGTH_COUNT,
    PATTERNS,
    child,
    constraining,
    escaped_at,
    impossible_anchor,
    split_top,
)
from .numbers import int_multiple


class ScalarMixin:
    # ----------------------------------------------------------------- strings
    def pattern_raw(self, pattern: str, ptr: str) -> Expr:
        from ..frontends.regex import leading_anchor, regex_to_ir

        branches = split_top(pattern)
        parts = []
        for br in branches:
            head = br.startswith("^")
            tail = br.endswith("$") and not escaped_at(br, len(br) - 1)
            body = br[1 if head else 0 : len(br) - 1 if tail else len(br)]
            if not head:
                # a start anchor inside a group (``(^a)``, ``\A``) anchors the branch as well
                # (the regex front end takes it for the start of its text)
                lead = leading_anchor(body)
                if lead is None:
                    raise ConstraintError(
                        f"pattern {pattern!r}: anchor ^ starts some alternatives of a branch but not all",
                        path=ptr,
                    )
                head = lead
            anyc = star(ANY_CHAR)
            try:
                if not tail and ("$" in body or "\\Z" in body):
                    # an end anchor inside: the search's trailing text must come before it
                    e, tail = jf.pattern_end_inside(body, tail), True
                else:
                    e = regex_to_ir(body) if body else EMPTY
            except ConstraintError as err:
                msg = str(err)
                if (
                    "anchor ^ not at the start" in msg or "anchor $ not at the end" in msg
                ) and impossible_anchor(br):
                    # e.g. a JS-style "/^...$/": ECMA reads the slashes as literals, so "/^"
                    # never matches; the branch's language is empty (not the slashes stripped)
                    continue
                if "anchor $ not at the end" not in msg:
                    raise ConstraintError(f"pattern {pattern!r}: {err}", path=ptr) from None
                try:
                    e = jf.pattern_end_inside(body, tail)
                except ConstraintError:
                    raise ConstraintError(f"pattern {pattern!r}: {err}", path=ptr) from None
            parts.append(seq(EMPTY if head else anyc, e, EMPTY if tail else anyc))
        return alt(*parts)

    def compile_string(self, s: dict, ptr: str) -> Expr:
        return seq(jf.QUOTE, self.string_content(s, ptr), jf.QUOTE)

    def string_content(self, s: dict, ptr: str) -> Expr:
        """The encoded language between the quotes: every pattern, the format and the length
        bounds intersected (product DFAs), so none of them is dropped."""
        lo = int(s.get("minLength", 0))
        hi = s.get("maxLength")
        hi = int(hi) if hi is not None else None
        if hi is not None and hi < lo:
            return NOTHING
        raws: list[Expr] = []
        patterns = s.get(PATTERNS) or ([s["pattern"]] if "pattern" in s else [])
        for p in patterns:
            raw = self.pattern_raw(p, child(ptr, "pattern"))
            if raw == NOTHING:
                return self.unsatisfiable(f"pattern {p!r} matches no string", child(ptr, "pattern"))
            raws.append(raw)
        fmt = s.get("format")
        if isinstance(fmt, str):
            f = jf.format_raw(fmt)
            if f is not None:
                raws.append(f)
        if "not" in s and self.string_atom(s["not"]):
            # strings of the schema minus those of its `not` operand, decided on raw
            # strings and written canonically (the encoding is injective)
            neg = self.string_raw(s["not"], child(ptr, "not"))
            pos = self.length_raw(intersect(*raws) if raws else jf.ANY_RAW, lo, hi, ptr)
            return jf.encode_raw(difference(pos, neg))
        if raws:
            # patterns and formats are written canonically (json.dumps(ensure_ascii=False))
            body = jf.encode_raw(intersect(*raws))
            fewest, most = jf.byte_bounds(body)
            if hi is not None and most <= hi:
                hi = None  # a character is at least one byte: the bound holds already
            if lo and fewest >= 6 * lo:
                lo = 0  # a character is at most six bytes (an escape) in canonical form
        else:
            # a counted repetition of one character determinises faster than a product
            return self.repeat(
                jf.CHAR,
                lo,
                hi,
                child(ptr, "maxLength" if hi is not None else "minLength"),
                "maxLength" if hi is not None else "minLength",
            )
        if lo == 0 and hi is None:
            return body
        n = hi if hi is not None else lo
        if n > MAX_LENGTH_COUNT:
            kw = "maxLength" if hi is not None else "minLength"
            raise ConstraintTooComplex(
                f"{kw} {n} exceeds the bound on counted string lengths ({MAX_LENGTH_COUNT})",
                path=child(ptr, kw),
            )
        return intersect(body, jf.encoded_length(lo, hi))

    # ----------------------------------------------------------------- numbers
    def compile_number(self, s: dict, ptr: str, *, integer: bool) -> Expr:
        def dec_of(v: object) -> Decimal:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ConstraintError("multipleOf must be a number > 0", path=child(ptr, "not", "multipleOf"))
            return Decimal(str(v)) if isinstance(v, float) else Decimal(v)

        def dec(k: str) -> Decimal | None:
            v = s.get(k)
            if v is None or isinstance(v, bool):
                return None
            if not isinstance(v, (int, float)):
                raise ConstraintError(f"{k} must be a number", path=child(ptr, k))
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
            raise ConstraintError("multipleOf must be > 0", path=child(ptr, "multipleOf"))
        if mult is not None and mult == mult.to_integral_value() and not integer:
            integer, mult = True, mult  # a multiple of an integer is an integer
        native = "not" in s and self.native_not(s)
        not_mult = (
            dec_of(s["not"]["multipleOf"]) if native and "multipleOf" in constraining(s["not"]) else None
        )
        nonint = native and not_mult is None  # not {"type": "integer"}
        if nonint and integer:
            return NOTHING
        if integer and not_mult is not None:
            # integers that are not multiples of not_mult = p/q (lowest terms): not of p
            m2 = not_mult.as_integer_ratio()[0]
            s2 = {k: v for k, v in s.items() if k != "not"}
            pos = self.compile_number(s2, ptr, integer=True)
            neg = int_multiple(None, None, m2) if m2 > 1 else jn.int_range(None, None)
            if neg is None:
                raise ConstraintTooComplex(
                    f"the remainder automaton for multipleOf {m2} exceeds the bound",
                    path=child(ptr, "not", "multipleOf"),
                )
            return difference(pos, neg)
        if not_mult is not None:
            # numbers that are not multiples of an integer: the integers that are not, and
            # every non-integral number (native_not admits only an integral not_mult here)
            s2 = {k: v for k, v in s.items() if k != "not"}
            fracs = self.compile_number({**s2, "not": {"type": "integer"}}, ptr, integer=False)
            return alt(self.compile_number(s, ptr, integer=True), fracs)
        if integer:
            ilo = (
                None
                if lo is None
                else int(math.floor(lo)) + 1
                if lo_x and lo == lo.to_integral_value()
                else (None if lo is None else math.ceil(lo))
            )
            ihi = (
                None
                if hi is None
                else int(math.ceil(hi)) - 1
                if hi_x and hi == hi.to_integral_value()
                else (None if hi is None else math.floor(hi))
            )
            if ilo is not None and ihi is not None and ilo > ihi:
                return NOTHING
            if mult is not None and (mult == 1 or (1 / mult) == (1 / mult).to_integral_value()):
                mult = None
            if mult is None:
                return jn.int_range(ilo, ihi)
            m = mult.as_integer_ratio()[0]  # an integer is a multiple of p/q (lowest terms) iff of p
            out = int_multiple(ilo, ihi, m)
            if out is None:
                self.relax(
                    "multipleOf",
                    child(ptr, "multipleOf"),
                    f"the remainder automaton for multipleOf {m} exceeds the bound",
                )
                return jn.int_range(ilo, ihi)
            return out
        cap = None
        if mult is not None:
            inv = 1 / mult
            if inv == inv.to_integral_value() and str(int(inv)).rstrip("0") == "1":
                cap = len(str(int(inv))) - 1
            else:
                self.relax(
                    "multipleOf", child(ptr, "multipleOf"), "only powers of ten for non-integer numbers"
                )
        if lo is None and hi is None and cap is None:
            return jn.NONINT if nonint else jn.NUMBER
        out = jn.decimal_range(lo, hi, lo_excl=lo_x, hi_excl=hi_x, cap=cap)
        return intersect(out, jn.NONINT_PLAIN) if nonint else out
