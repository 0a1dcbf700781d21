"""JSON strings as byte-level IR: characters, escapes, key sets and ``format`` languages.

Two views of a string:

- *raw*: the UTF-8 bytes of the decoded string (what a regex or a format describes);
- *encoded*: the bytes between the quotes in JSON text.

:func:`encode_raw` turns a raw language into its canonical JSON encoding: ``"`` and
``\\`` escaped, control characters as the short escape (``\\n``) or ``\\u00XX``, every
other character written as itself (``json.dumps(..., ensure_ascii=False)``). A plain
string with only length bounds accepts every escape form (:data:`CHAR`).
"""

from __future__ import annotations

import re

from ..errors import ConstraintError
from ..ir import (
    ALL_BYTES_MASK,
    ANY_CHAR,
    EMPTY,
    NOTHING,
    Alt,
    And,
    ByteSet,
    Diff,
    Expr,
    Ref,
    Repeat,
    Seq,
    alt,
    byte_range,
    byte_set,
    difference,
    intersect,
    lit,
    opt,
    rep,
    seq,
    star,
    utf8_class,
)
from ..memo import NodeMemo

HEX = alt(byte_range(0x30, 0x39), byte_range(0x41, 0x46), byte_range(0x61, 0x66))
_HEX_NOT_D = alt(
    byte_range(0x30, 0x39),
    byte_range(0x41, 0x43),
    byte_range(0x45, 0x46),
    byte_range(0x61, 0x63),
    byte_range(0x65, 0x66),
)
_D = byte_set(b"Dd")
_ESC_BMP = seq(lit("\\u"), alt(seq(_HEX_NOT_D, HEX, HEX, HEX), seq(_D, byte_range(0x30, 0x37), HEX, HEX)))
_ESC_PAIR = seq(
    lit("\\u"), _D, byte_set(b"89ABab"), HEX, HEX, lit("\\u"), _D, byte_set(b"CDEFcdef"), HEX, HEX
)
# one character of a JSON string (a surrogate pair counts as one; lone surrogates refused)
CHAR: Expr = alt(
    utf8_class([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]),
    seq(lit("\\"), byte_set(b'"\\/bfnrt')),
    _ESC_BMP,
    _ESC_PAIR,
)
QUOTE = lit('"')


def string_of(char: Expr, lo: int = 0, hi: int | None = None) -> Expr:
    return seq(QUOTE, rep(char, lo, hi), QUOTE)


_KEPT = NodeMemo(10_000)  # (function, expression) -> result of a top-level byte_bounds / encode_raw


def _kept(fn, e: Expr, compute):
    """``compute()``, kept per expression (formats and patterns recur across schemas)."""
    key = (fn, e)
    hit = _KEPT.get(key)
    if hit is None:
        hit = compute()
        _KEPT.put(key, hit, e._size + (hit._size if isinstance(hit, Expr) else 0))
    return hit


def byte_bounds(e: Expr, memo: dict | None = None) -> tuple[int, float]:
    """(fewest, most) bytes of a string of the Ref-free language ``e`` (most: inf if unbounded)."""
    if memo is None:
        return _kept("bounds", e, lambda: byte_bounds(e, {}))
    hit = memo.get(id(e))
    if hit is not None:
        return hit[1]
    if isinstance(e, ByteSet):
        out = (1, 1) if e.mask else (0, 0)
    elif isinstance(e, Seq):
        bs = [byte_bounds(x, memo) for x in e.items]
        out = (sum(b[0] for b in bs), sum(b[1] for b in bs))
    elif isinstance(e, Alt):
        bs = [byte_bounds(x, memo) for x in e.items] or [(0, 0)]
        out = (min(b[0] for b in bs), max(b[1] for b in bs))
    elif isinstance(e, Repeat):
        a, b = byte_bounds(e.item, memo)
        out = (a * e.min, float("inf") if e.max is None and b else b * (e.max or 0))
    elif isinstance(e, And):
        bs = [byte_bounds(x, memo) for x in e.items]
        out = (max(b[0] for b in bs), min(b[1] for b in bs))
    elif isinstance(e, Diff):
        out = byte_bounds(e.items[0], memo)
    else:
        out = (0, float("inf"))
    memo[id(e)] = (e, out)
    return out


_SHORT = {0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}


def _escaped(b: int) -> Expr:
    if b in _SHORT:
        return lit(_SHORT[b])
    return lit(f"\\u{b:04x}")


_SPECIAL_MASK = ((1 << 0x20) - 1) | (1 << 0x22) | (1 << 0x5C)


def encode_raw(e: Expr, memo: dict | None = None) -> Expr:
    """Map a raw-string language (UTF-8 bytes) to its canonical JSON-encoded language."""
    if memo is None:
        return _kept("encode", e, lambda: encode_raw(e, {}))
    if e is ANY_RAW:
        return _enc_any()
    key = id(e)
    if key in memo:
        return memo[key][1]
    if isinstance(e, ByteSet):
        special = e.mask & _SPECIAL_MASK
        if not special:
            out: Expr = e
        else:
            parts = [ByteSet(e.mask & ~_SPECIAL_MASK)] if e.mask & ~_SPECIAL_MASK else []
            parts += [_escaped(b) for b in ByteSet(special).bytes()]
            out = alt(*parts)
    elif isinstance(e, Seq):
        out = seq(*(encode_raw(x, memo) for x in e.items))
    elif isinstance(e, Alt):
        out = alt(*(encode_raw(x, memo) for x in e.items))
    elif isinstance(e, Repeat):
        out = rep(encode_raw(e.item, memo), e.min, e.max)
    elif isinstance(e, And):
        # the canonical encoding is injective, so it commutes with intersection and difference
        out = intersect(*(encode_raw(x, memo) for x in e.items))
    elif isinstance(e, Diff):
        out = difference(encode_raw(e.items[0], memo), encode_raw(e.items[1], memo))
    elif isinstance(e, Ref):
        raise ValueError("encode_raw: recursive raw languages are not supported")
    else:
        out = e
    memo[key] = (e, out)
    return out


ANY_RAW = star(ANY_CHAR)


_ENC_ANY: list[Expr] = []


def _enc_any() -> Expr:
    if not _ENC_ANY:
        _ENC_ANY.append(star(encode_raw(ANY_CHAR)))
    return _ENC_ANY[0]


def keys_except(declared: list[str], raw_patterns: list[Expr] = ()) -> Expr:
    """Canonical encodings of the strings that are neither a declared key nor match a raw
    pattern language: a product-DFA difference, linear in the declared keys' total length.

    Keys are written canonically (``json.dumps(..., ensure_ascii=False)``); a declared key
    is one string, so excluding its canonical encoding excludes every key equal to it.
    """
    minus = [lit(encode_key(k)) for k in declared] + [encode_raw(p) for p in raw_patterns]
    if not minus:
        return _enc_any()
    return difference(_enc_any(), alt(*minus))


def encode_key(key: str) -> str:
    """The canonical encoding of ``key`` between the quotes."""
    import json

    return json.dumps(key, ensure_ascii=False)[1:-1]


# code points, raw UTF-8: a lead byte (anything but a continuation byte) and its continuations
_RAW_UNIT = seq(alt(byte_range(0x00, 0x7F), byte_range(0xC0, 0xFF)), star(byte_range(0x80, 0xBF)))
# the same count over encodings: an escape (\\x, \\uXXXX, a surrogate pair) is one character
# (UTF-8 is not checked: the count is intersected with languages of valid encodings)
_ENC_UNIT = alt(
    seq(
        alt(byte_range(0x00, 0x5B), byte_range(0x5D, 0x7F), byte_range(0xC0, 0xFF)),
        star(byte_range(0x80, 0xBF)),
    ),
    seq(lit("\\"), byte_set(b'"\\/bfnrt')),
    _ESC_BMP,
    _ESC_PAIR,
)


def intersect_length(raw: Expr, lo: int, hi: int | None) -> Expr | None:
    """``raw`` restricted to strings of lo..hi characters (code points): a product DFA."""
    if lo == 0 and hi is None:
        return raw
    return intersect(raw, rep(_RAW_UNIT, lo, hi))


def encoded_length(lo: int, hi: int | None) -> Expr:
    """Encoded strings of lo..hi characters, counted cheaply (no UTF-8 checks): meant to
    be intersected with a language of valid encodings (:data:`CHAR` strings)."""
    return rep(_ENC_UNIT, lo, hi)


# ------------------------------------------------------------------------- formats


def _cls(spec: str) -> Expr:
    """A byte class from ``"a-zA-Z0-9_"``-style ASCII text."""
    m, i = 0, 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            m |= byte_range(ord(spec[i]), ord(spec[i + 2])).mask
            i += 3
        else:
            m |= 1 << ord(spec[i])
            i += 1
    return ByteSet(m & ALL_BYTES_MASK)


D = _cls("0-9")


def _d(n: int, m: int | None = None) -> Expr:
    return rep(D, n, n if m is None else m)


def _two(lo: int, hi: int) -> Expr:
    return alt(*(lit(f"{v:02d}") for v in range(lo, hi + 1)))


def _date() -> Expr:
    year = alt(
        seq(_cls("1-9"), _d(3)),
        seq(lit("0"), _cls("1-9"), _d(2)),
        seq(lit("00"), _cls("1-9"), D),
        seq(lit("000"), _cls("1-9")),
    )
    d31 = seq(alt(*(lit(f"{m:02d}") for m in (1, 3, 5, 7, 8, 10, 12))), lit("-"), _two(1, 31))
    d30 = seq(alt(*(lit(f"{m:02d}") for m in (4, 6, 9, 11))), lit("-"), _two(1, 30))
    feb = seq(lit("02-"), _two(1, 28))
    normal = seq(year, lit("-"), alt(d31, d30, feb))
    # Feb 29 on leap years; "0000" is not a year (datetime.date rejects it)
    leap_nonzero = alt(
        seq(
            _d(2),
            alt(seq(_cls("02468"), _cls("48")), seq(_cls("2468"), lit("0")), seq(_cls("13579"), _cls("26"))),
        ),
        seq(
            alt(seq(_cls("02468"), _cls("48")), seq(_cls("2468"), lit("0")), seq(_cls("13579"), _cls("26"))),
            lit("00"),
        ),
    )
    return alt(normal, seq(leap_nonzero, lit("-02-29")))


def _time() -> Expr:
    hms = seq(_two(0, 23), lit(":"), _two(0, 59), lit(":"), _two(0, 59))
    frac = opt(seq(lit("."), rep(D, 1, None)))
    offset = alt(_cls("Zz"), seq(_cls("+-"), _two(0, 23), lit(":"), _two(0, 59)))
    return seq(hms, frac, offset)


def _duration() -> Expr:
    n = rep(D, 1, None)

    def u(c: str) -> Expr:
        return seq(n, lit(c))

    second = u("S")
    minute = seq(u("M"), opt(second))
    hour = seq(u("H"), opt(minute))
    dtime = seq(lit("T"), alt(hour, minute, second))
    day = u("D")
    month = seq(u("M"), opt(day))
    year = seq(u("Y"), opt(month))
    ddate = seq(alt(day, month, year), opt(dtime))
    return seq(lit("P"), alt(ddate, dtime, u("W")))


_ATEXT = _cls("A-Za-z0-9!#$%&'*+/=?^_`{|}~-")
_LABEL_CH = _cls("A-Za-z0-9")
_LABEL_MID = _cls("A-Za-z0-9-")


def _label(max_len: int = 63) -> Expr:
    """A DNS label: letters, digits, inner hyphens; never "--" at positions 3-4 (A-labels)."""
    ch, mid = _LABEL_CH, _LABEL_MID
    p34 = alt(seq(ch, mid), seq(lit("-"), ch))
    return alt(
        ch,
        seq(ch, ch),
        seq(ch, mid, ch),
        seq(ch, mid, mid, ch),
        seq(ch, mid, p34, rep(mid, 0, max_len - 5), ch),
    )


def _hostname() -> Expr:
    # at most 4 labels, the last at most 61 characters: never longer than 253 (RFC 1123)
    return seq(rep(seq(_label(), lit(".")), 0, 3), _label(61))


def _email() -> Expr:
    local = seq(rep(_ATEXT, 1, None), star(seq(lit("."), rep(_ATEXT, 1, None))))
    domain = seq(_label(), rep(seq(lit("."), _label()), 1, 3))
    return seq(local, lit("@"), domain)


_OCTET = alt(
    D, seq(_cls("1-9"), D), seq(lit("1"), D, D), seq(lit("2"), _cls("0-4"), D), seq(lit("25"), _cls("0-5"))
)
_IPV4 = seq(_OCTET, rep(seq(lit("."), _OCTET), 3, 3))


def _ipv6() -> Expr:
    h16 = rep(HEX, 1, 4)
    h16c = seq(h16, lit(":"))
    ls32 = alt(seq(h16, lit(":"), h16), _IPV4)

    def upto(k: int) -> Expr:  # [ *k( h16 ":" ) h16 ]
        return opt(seq(rep(h16c, 0, k), h16)) if k >= 0 else EMPTY

    dc = lit("::")
    return alt(
        seq(rep(h16c, 6, 6), ls32),
        seq(dc, rep(h16c, 5, 5), ls32),
        seq(opt(h16), dc, rep(h16c, 4, 4), ls32),
        seq(upto(1), dc, rep(h16c, 3, 3), ls32),
        seq(upto(2), dc, rep(h16c, 2, 2), ls32),
        seq(upto(3), dc, h16c, ls32),
        seq(upto(4), dc, ls32),
        seq(upto(5), dc, h16),
        seq(upto(6), dc),
    )


def _uuid() -> Expr:
    def h(n: int) -> Expr:
        return rep(HEX, n, n)

    return seq(h(8), lit("-"), h(4), lit("-"), h(4), lit("-"), h(4), lit("-"), h(12))


def _uri() -> Expr:
    """RFC 3986 ``URI`` (absolute, optional query and fragment); hosts are reg-names or IPv4."""
    pct = seq(lit("%"), HEX, HEX)
    unres_sub = _cls("A-Za-z0-9._~!$&'()*+,;=-")
    pchar = alt(unres_sub, pct, _cls(":@"))
    segment = star(pchar)
    segment_nz = rep(pchar, 1, None)
    scheme = seq(_cls("A-Za-z"), star(_cls("A-Za-z0-9+.-")))
    userinfo = star(alt(unres_sub, pct, lit(":")))
    host = alt(_IPV4, star(alt(unres_sub, pct)))
    authority = seq(opt(seq(userinfo, lit("@"))), host, opt(seq(lit(":"), star(D))))
    abempty = star(seq(lit("/"), segment))
    hier = alt(
        seq(lit("//"), authority, abempty),
        seq(lit("/"), opt(seq(segment_nz, abempty))),
        seq(segment_nz, abempty),
        EMPTY,
    )
    tail = star(alt(pchar, _cls("/?")))
    return seq(scheme, lit(":"), hier, opt(seq(lit("?"), tail)), opt(seq(lit("#"), tail)))


_BUILDERS = {
    "date": _date,
    "time": _time,
    "date-time": lambda: seq(_date(), _cls("Tt"), _time()),
    "duration": _duration,
    "email": _email,
    "hostname": _hostname,
    "ipv4": lambda: _IPV4,
    "ipv6": _ipv6,
    "uuid": _uuid,
    "uri": _uri,
}
SUPPORTED_FORMATS = tuple(_BUILDERS)
_CACHE: dict[str, Expr] = {}


def format_raw(name: str) -> Expr | None:
    """The raw (ASCII) language of a supported ``format``, or None when not enforced."""
    if name not in _BUILDERS:
        return None
    if name not in _CACHE:
        _CACHE[name] = _BUILDERS[name]()
    return _CACHE[name]


__all__ = [
    "CHAR",
    "NOTHING",
    "SUPPORTED_FORMATS",
    "encode_raw",
    "encoded_length",
    "format_raw",
    "intersect_length",
    "keys_except",
    "string_of",
]


def pattern_end_inside(body: str, tail: bool) -> Expr:
    """A pattern branch with $ inside (``(a|b$)c?``), read as ECMA does ($ only at the end
    of the text); without a final $ the search's trailing text goes into the regex (after
    the match, where $ still means the end)."""
    from ..frontends.regex import regex_to_ir

    if tail:
        return regex_to_ir(body, end_only=True)
    try:
        verbose = bool(re.compile(body).flags & re.VERBOSE)
    except (re.error, RecursionError, OverflowError):
        return regex_to_ir(body, end_only=True)  # (raises the parser's error)
    if verbose:
        raise ConstraintError("verbose pattern with $ inside")  # (a comment would swallow the tail)
    return regex_to_ir(body + "(?s:.*)", end_only=True)
