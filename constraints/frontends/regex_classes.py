"""Character classes for the regex front end (:mod:`.regex`): the code point tables of
``\\d \\w \\s`` and of the case-sensitive code points (precomputed for one Unicode version),
range arithmetic, and one ``re`` character item (literal, class, category, ``.``) with its
flags to a byte-level :class:`~..ir.Expr` over UTF-8.
"""

from __future__ import annotations

import binascii
import re
import unicodedata
import zlib
from typing import Any

try:  # Python 3.11+
    from re import _compiler as _sre_compile
    from re import _constants as _c
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - older Pythons
    import sre_compile as _sre_compile  # type: ignore[no-redef]
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

import _sre

from ..errors import ConstraintError
from ..ir import ANY_CHAR, MAX_CODE_POINT, Alt, ByteSet, Expr, Seq, alt, seq, utf8_class
from ..memo import NodeMemo

# plain ints: RegexFlag's enum operators cost microseconds on this path
FLAG_I = int(re.IGNORECASE)
FLAG_S = int(re.DOTALL)
FLAG_A = int(re.ASCII)
FLAG_U = int(re.UNICODE)

BYTES = [ByteSet(1 << b) for b in range(256)]
Ranges = tuple[tuple[int, int], ...]

# ------------------------------------------------------------------ code point tables
# Runs of code points for \d \w \s (Unicode) and for the code points whose case can
# matter under IGNORECASE ("cased" ones, their simple lowercase, re's extra cases).
# Precomputed for one Unicode version; any other version recomputes them once.
_TABLES_UNIDATA = "14.0.0"
_TABLES_BLOB = (
    "eNqtWFmS5UQMvJA/SkttPachgBPMB9dHmVLZ7qYDCILoeX5+di1aUqms+e3D17Uv6bPjy3jdO64uhnvZ/+G65307JS4671tZ"
    "A+saHljjE+XEgTmctzBgzdse3FlXTh9cibPTTL0He8NVJQeKS+fPXC2d4U4jX/fbLvPHU8s4NLuvrs/97NzS5+3NHrTlZa3O"
    "OfrlsGzsZ/7gl3OFH39k1Nel/epXuxQ38ajFI4lf7XJ+8w8XwxjvM0aLRLbi/eK8FrtitMZ4iz88mbki7+N5WHIt/BJjqsO6"
    "WHDGYAz1uMTLESvb5SPMxY4bG8WwvXKPEb/CNOckqQ2QwGvFYw7pmCpxQ49GRJ438QT2xQTHv4UHA1lTbLECZleEpBvHhK0I"
    "AXaH1YLowFD4prBnVHBqOAyREyqGxuhH4xL98zy5P6YVKWyFu1honXC/h/tjFUOQ2MAv/atdzwST26TNl5Kp6EyU0no56eG9"
    "c27YrzA+EiBM3HxjgFmPl5MrNG6PDXZFpX8evh9zjt8VVYT9uOvtSem4ch7zAmsHnnsmK4Fg8cyURRpYzsXwTBoL8PaKflr9"
    "qE0b53sCqjHy8WdlIMqHDkQR6WIwEoycOZnOzLoTi8w3MF1bTEBa6QW3YZwto20Vobz3c/PtW4GBfZw3A2EP45zfAZNOiHmw"
    "CByQkbU7rolYCwt4EpOrZgjtZAKjyAIxg7mCH0ltJIaJQlpEtln5MTYR3ZiknaiJ0GJ/RbJjt6hoZdX1eHEWFERpO6o5rJjc"
    "yFmv8aZ3IAhBJjmBdezi1lkU9dULmrBDtlwgjTmrvOzczArc+RhC3/VVqHlPt7IitWA2mOAs2JEpRjqbVnSMsGmE8Py8yUWP"
    "M3Fe/BnUOMOvoJIJ0r9G1CAcFkRTF6vVHxR+wkqEZGUNZCxH2f/9ZwmsmmTAcZ2kwY51KnBtmpn4vbZxBFIp6AsBCGMLFA4H"
    "qVpVT9zC9l4BVwkgjtgAsVbcsPqFmZ0Z7cmZSCJiF5uyHJ8y7NhPi3ZIDQABrOnZSHYigZ3Ii5LYH8BG9FHp5GA82TKwjid5"
    "aKZ4XtmoVatEfd9tLN2v7LH3ZJ2wePt1Pq/Ae3YrQAKVlLgWkUm2URJp2OTRNWx0rtdRIQOvnVkt1tHiovbm/9AJFiYNss4g"
    "Mg19CJ01CS/WiWs7LXoyjIoS9ZfFiKcNxikdI21K5RS2GKbRlShOeMuKjBFeJOeki+y+DIHCiwo+GbIXrzsKP2TalWzB53lB"
    "9jojIy33fvW7L08CQyakX6W/M/OucB8cP1v1T/LMoQDG3BJvNhkV38dbNoRkJEEpkS4pJaK+7XSkhd0W4EIpE9i3pI8ANEIe"
    "UeisEWVPHbC3YzgLbpKSOyukAztOfwHdXtoIvgiqgfGAdwQ844tOxbrJXHTuqrtEE1d1ViEFClGObAz2wlZ6wkoMGJYToq7i"
    "29JnoY5gaaz+6imVgJ1FJNzgb+VD6g3yFaSRZkBHNXqQCJ3JIj/aOaUb85OvKVIYDtdsCRRWnRWtJAAUzBoEFlpb1Vxqi1km"
    "KZtcSc2euhdjbB0dSNA28ttOVaq5OUDe0h9KTGfRG2NAQRXZGcXSdwhs1vxGnPfzmGRVik0oYWS3Wqax91EpwJWWb+Ep0Eog"
    "RtGjjwZ4evgZZ5AA0gCv2ZEPc9UNDNpM8swq3pUhZTMMm4PfF5Zk10dwBpvX6Id4ccjIo5QiH2yw27IcjqMa5vtI1sgTURhs"
    "bXNdSkZnd4mcTbiFFzh7hEVRE0DUbDeC7Zb/crifZOqlY+ZxYRYkveiZiKK40JvWGZJ/cceeGmbNTW7wRQ0ipIRTOqonnpbq"
    "WXvWhj1UCYAPqhDHAY8YItJ2lP26m1fID/ecgeRaNmCtmNtN+nZrhVla4tEO+mX81895dxJlr/V2SriUL156bpFodK7kDRRn"
    "nD83yCQOoJTNZLQ+BxE8fQLMLeAHDuvRi3zb+vHzozQmRKSkzA/jR2s8OllKnka+bXlU9IaBP3795efvH6PffapXMT7nxkH9"
    "bqcfilVzKm8j1JpnoPkO6DmaPIE5bTwht+4gCrviyG2FbNSQ79zC6yT6zanUqQzvcObB4hxPwScRvRVh+qrsmZ1pR4xrIPAt"
    "YcFp7XVABGD6aWsi/6+K1b1K59BBMtsiSeOYErdozQuHANFbhCwmeR1N+lmPth3odraUAAF4hMkaFK9oVXWCrCpkr5SUI9AW"
    "a0hSEIRw03XLokCnP2oG7Dn5PzVHSiAy/6wgZKLdn06sO5YBvmSFNIGWCnYKjM4/AW8GfLo="
)  # _encode_tables(_compute_tables()) on Python 3.11
_tables: dict[str, Ranges] | None = None


def _runs(cps: list[int]) -> Ranges:
    out: list[list[int]] = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return tuple((a, b) for a, b in out)


def _compute_tables() -> dict[str, Ranges]:
    """Compute the tables from the running Python (about 0.3 s)."""
    out: dict[str, Ranges] = {}
    # re's own engine over every code point: exactly its notion of \d \w \s
    for name, pat in (("d", r"\d+"), ("w", r"\w+"), ("s", r"\s+")):
        rx = re.compile(pat)
        runs = []
        for lo, hi in ((0, 0xD7FF), (0xE000, MAX_CODE_POINT)):
            text = "".join(map(chr, range(lo, hi + 1)))
            runs += [(m.start() + lo, m.end() - 1 + lo) for m in rx.finditer(text)]
        out[name] = _merge(runs)
    cased = [i for i in range(MAX_CODE_POINT + 1) if _sre.unicode_iscased(i)]
    rel = set(cased) | {_sre.unicode_tolower(i) for i in cased}
    for k, v in _extra_cases().items():
        rel.add(k)
        rel.update(v)
    out["case"] = _runs(sorted(rel))
    return out


def _extra_cases() -> dict[int, tuple[int, ...]]:
    extra = getattr(_sre_compile, "_EXTRA_CASES", None)
    if extra is None:  # pragma: no cover - older Pythons
        extra = _sre_compile._ignorecase_fixes
    return extra


def _encode_tables(tables: dict[str, Ranges]) -> str:
    """Compact text for :data:`_TABLES_BLOB` (run once when Unicode changes)."""
    parts = []
    for name in ("d", "w", "s", "case"):
        prev, nums = 0, []
        for lo, hi in tables[name]:
            nums += [lo - prev, hi - lo]
            prev = hi
        parts.append(name + ":" + ",".join(map(str, nums)))
    return binascii.b2a_base64(zlib.compress(";".join(parts).encode(), 9), newline=False).decode()


def _decode_tables(blob: str) -> dict[str, Ranges]:
    out: dict[str, Ranges] = {}
    for part in zlib.decompress(binascii.a2b_base64(blob)).decode().split(";"):
        name, _, body = part.partition(":")
        nums = [int(x) for x in body.split(",")] if body else []
        prev, runs = 0, []
        for k in range(0, len(nums), 2):
            lo = prev + nums[k]
            hi = lo + nums[k + 1]
            runs.append((lo, hi))
            prev = hi
        out[name] = tuple(runs)
    return out


def _get_tables() -> dict[str, Ranges]:
    global _tables
    if _tables is None:
        if _TABLES_BLOB and unicodedata.unidata_version == _TABLES_UNIDATA:
            _tables = _decode_tables(_TABLES_BLOB)
        else:
            _tables = _compute_tables()
    return _tables


_ASCII_CATEGORY: dict[str, Ranges] = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x09, 0x0D), (0x20, 0x20)),
}

_CATEGORY = {
    _c.CATEGORY_DIGIT: ("d", False),
    _c.CATEGORY_NOT_DIGIT: ("d", True),
    _c.CATEGORY_SPACE: ("s", False),
    _c.CATEGORY_NOT_SPACE: ("s", True),
    _c.CATEGORY_WORD: ("w", False),
    _c.CATEGORY_NOT_WORD: ("w", True),
}

# ------------------------------------------------------------------- range arithmetic


def _merge(ranges: Any) -> Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def _complement(ranges: Ranges) -> Ranges:
    out, prev = [], 0
    for lo, hi in ranges:
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CODE_POINT:
        out.append((prev, MAX_CODE_POINT))
    return tuple(out)


def _subtract(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_merge(_complement(a) + b))


# ------------------------------------------------------------------ character classes

_CLASS_CACHE = NodeMemo(40_000)  # a class node's key -> its expression (mostly held below too)
_UTF8_CACHE = NodeMemo(40_000)  # code point ranges -> one character of them as UTF-8
_NOT_NEWLINE: Ranges = ((0, 9), (11, MAX_CODE_POINT))


def _left_factor(paths: list[tuple[Expr, ...]]) -> Expr:
    """Alternation of byte paths with common leading byte sets shared (a byte trie)."""
    groups: dict[Expr, list[tuple[Expr, ...]]] = {}
    for path in paths:
        groups.setdefault(path[0], []).append(path[1:])
    out = []
    for head, rests in groups.items():
        tails = [r for r in rests if r]
        if len(tails) < len(rests):  # UTF-8 paths are prefix-free, but stay exact anyway
            out.append(head)
        if tails:
            out.append(seq(head, _left_factor(tails)))
    return alt(*out)


def _class_expr(ranges: Ranges) -> Expr:
    """One character from ``ranges`` as UTF-8, left-factored.

    ``utf8_class`` lists one byte path per UTF-8 range (~1,500 for ``\\w``); sharing the
    leading bytes cuts the IR ~3x and the automaton's subset construction far more.
    """
    e = _UTF8_CACHE.get(ranges)
    if e is None:
        e = utf8_class(ranges)
        if isinstance(e, Alt) and all(
            isinstance(it, ByteSet) or isinstance(it, Seq) and all(isinstance(b, ByteSet) for b in it.items)
            for it in e.items
        ):
            e = _left_factor([it.items if isinstance(it, Seq) else (it,) for it in e.items])
        _UTF8_CACHE.put(ranges, e, e._size)
    return e


def _category(code: Any, flags: int) -> Ranges:
    name, neg = _CATEGORY[code]
    table = _ASCII_CATEGORY[name] if flags & FLAG_A else _get_tables()[name]
    return _complement(table) if neg else table


def plain_ranges(op: Any, av: Any, flags: int) -> Ranges:
    """Code points one character node matches, ignoring IGNORECASE."""
    if op is _c.LITERAL:
        return ((av, av),)
    if op is _c.NOT_LITERAL:
        return _complement(((av, av),))
    if op is _c.ANY:
        return ((0, MAX_CODE_POINT),) if flags & FLAG_S else _NOT_NEWLINE
    if op is _c.CATEGORY:
        return _category(av, flags)
    # IN
    negate, parts = False, []
    for iop, iav in av:
        if iop is _c.NEGATE:
            negate = True
        elif iop is _c.LITERAL:
            parts.append((iav, iav))
        elif iop is _c.RANGE:
            parts.append(iav)
        elif iop is _c.CATEGORY:
            parts.extend(_category(iav, flags))
        else:  # pragma: no cover - the parser emits nothing else in a class
            raise ConstraintError(f"unsupported character class item {iop}")
    merged = _merge(parts)
    return _complement(merged) if negate else merged


def _icase_ranges(op: Any, av: Any, flags: int) -> Ranges:
    """Code points one character node matches under IGNORECASE, exactly as ``re``.

    Outside the case-relevant code points ignoring case changes nothing (their lowercase
    is themselves and no other code point lowercases to them); inside them, ``re``'s own
    engine, compiled for this one node, decides.
    """
    relevant = _get_tables()["case"]
    state = _sre_parse.State()
    state.flags = flags
    sub = _sre_parse.SubPattern(state, [(op, av)])
    rx = _sre_compile.compile(sub, 0)
    hits = [ord(ch) for ch in rx.findall(_relevant_text())]
    return _merge(_subtract(plain_ranges(op, av, flags), relevant) + tuple((c, c) for c in hits))


_relevant_str: str | None = None


def _relevant_text() -> str:
    global _relevant_str
    if _relevant_str is None:
        _relevant_str = "".join(chr(c) for lo, hi in _get_tables()["case"] for c in range(lo, hi + 1))
    return _relevant_str


def char_node(op: Any, av: Any, flags: int) -> Expr:
    """IR for one single-character node (LITERAL, NOT_LITERAL, ANY, IN, CATEGORY)."""
    flags &= FLAG_I | FLAG_S | FLAG_A | FLAG_U
    if op is _c.ANY:
        return ANY_CHAR if flags & FLAG_S else _class_expr(_NOT_NEWLINE)
    flags &= ~FLAG_S
    key = (op, repr(av) if op is _c.IN else av, flags)
    e = _CLASS_CACHE.get(key)
    if e is None:
        if flags & FLAG_I:
            ranges = _icase_ranges(op, av, flags)
        else:
            ranges = plain_ranges(op, av, flags)
        e = _class_expr(ranges)
        _CLASS_CACHE.put(key, e, e._size)
    return e
