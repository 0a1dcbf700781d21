"""Regex front end: Python ``re`` syntax to the byte-level grammar IR.

:func:`regex_to_ir` returns one non-recursive :class:`~..ir.Expr` that matches exactly
the strings (as UTF-8 bytes) that ``re.fullmatch(pattern, s, flags)`` matches.

The pattern is parsed by Python's own parser (``re._parser``), so the syntax is exactly
Python's. Single-character sets follow ``re``'s Unicode semantics for ``str`` patterns:
``\\d`` is ``str.isdecimal``, ``\\w`` is ``str.isalnum`` or ``_``, ``\\s`` is what
``re`` treats as whitespace (ASCII versions under ``re.ASCII``). Case-insensitive sets
are computed exactly: outside the ~3k code points whose case can matter, ignoring case
changes nothing, and inside them ``re``'s own engine decides each code point.

Refused with :class:`~.errors.ConstraintError` (naming the construct and its position):
backreferences, lookaround, ``\\b``/``\\B``, conditional groups, atomic groups and
possessive quantifiers (they change the language), and ``^`` not at the start. An end
anchor inside the pattern (``(a|b$)c?``) is exact: the strings that reach it, with the rest
matching empty (for ``$``, where no newline can follow it, or with ``end_only``).
Repeats that would expand past :data:`MAX_EXPANDED_CHARS` character positions raise
:class:`~.errors.ConstraintTooComplex`.
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python 3.11+
    from re import _constants as _c
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

import _sre

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import (
    EMPTY,
    NOTHING,
    Expr,
    alt,
    rep,
    seq,
)
from ..limits import Limits, headroom
from .regex_classes import BYTES, FLAG_A, FLAG_I, FLAG_S, FLAG_U, char_node, plain_ranges

__all__ = ["regex_to_ir", "leading_anchor", "MAX_EXPANDED_CHARS"]

# A repeat is expanded by the automaton builder: bound the total number of character
# positions (a literal character or a class counts as one) the pattern expands to.
MAX_EXPANDED_CHARS = 50_000


# ------------------------------------------------------------------- error positions

_GROUP_PREFIXES = (
    ("(?P=", "backreference"),
    ("(?<=", "(?<="),
    ("(?<!", "(?<!"),
    ("(?=", "(?="),
    ("(?!", "(?!"),
    ("(?(", "(?("),
    ("(?>", "(?>"),
)
_BRACE = re.compile(r"\{\d*(?:,\d*)?\}")


def _scan(pattern: str, verbose: bool) -> list[tuple[int, str]]:
    """(position, construct) for the constructs errors name, in text order."""
    out: list[tuple[int, str]] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt in ("b", "B", "A", "Z"):
                out.append((i, "\\" + nxt))
            elif nxt and nxt in "123456789":
                octal = all(c in "01234567" for c in pattern[i + 1 : i + 4]) and i + 4 <= n
                if not octal:
                    out.append((i, "backreference"))
            i += 2
            continue
        if ch == "[":
            i = _after_class(pattern, i)
            continue
        if verbose and ch == "#":
            j = pattern.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if ch == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?#", i):
                j = pattern.find(")", i)
                i = n if j < 0 else j + 1
                continue
            for prefix, name in _GROUP_PREFIXES:
                if pattern.startswith(prefix, i):
                    out.append((i, name))
                    break
            i += 2
            continue
        if ch in "^$":
            out.append((i, ch))
        elif ch in "*+?{":
            end = i + 1
            if ch == "{":
                m = _BRACE.match(pattern, i)
                if m is None:
                    i += 1
                    continue
                end = m.end()
                out.append((i, "{"))
            if pattern[end : end + 1] == "+":
                out.append((i, "possessive"))
                end += 1
            elif pattern[end : end + 1] == "?":
                end += 1
            i = end
            continue
        i += 1
    return out


# ------------------------------------------------------------------------- translator

_AT_NAMES = {
    _c.AT_BEGINNING: "^",
    _c.AT_BEGINNING_STRING: "\\A",
    _c.AT_END: "$",
    _c.AT_END_STRING: "\\Z",
    _c.AT_BOUNDARY: "\\b",
    _c.AT_NON_BOUNDARY: "\\B",
}
_AT_START = (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING)
_AT_END = (_c.AT_END, _c.AT_END_STRING)
_CHAR_OPS = (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN, _c.CATEGORY)
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT)
_POSSESSIVE = getattr(_c, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(_c, "ATOMIC_GROUP", None)
_TYPE_FLAGS = FLAG_A | int(re.LOCALE) | FLAG_U


def _combine_flags(flags: int, add: int, delete: int) -> int:
    if add & _TYPE_FLAGS:
        flags &= ~_TYPE_FLAGS
    return (flags | add) & ~delete


def _empty_only(op: Any, av: Any) -> bool:
    """Whether a node can only match the empty string without consuming (anchors)."""
    if op is _c.AT:
        return True
    if op is _c.SUBPATTERN:
        return all(_empty_only(o, a) for o, a in av[-1])
    if op is _c.BRANCH:
        return all(all(_empty_only(o, a) for o, a in b) for b in av[1])
    if op in _REPEATS:
        return av[1] == 0 or all(_empty_only(o, a) for o, a in av[2])
    return False


def _has_end(op: Any, av: Any, kinds: tuple = _AT_END) -> bool:
    """Whether a node holds an end anchor (of ``kinds``: $, \\Z)."""
    if op is _c.AT:
        return av in kinds
    if op is _c.SUBPATTERN:
        return any(_has_end(o, a, kinds) for o, a in av[-1])
    if op is _c.BRANCH:
        return any(_has_end(o, a, kinds) for b in av[1] for o, a in b)
    if op in _REPEATS:
        return any(_has_end(o, a, kinds) for o, a in av[2])
    return False


def _min_width(op: Any, av: Any, flags: int) -> int:
    state = _sre_parse.State()
    state.flags = flags
    return int(_sre_parse.SubPattern(state, [(op, av)]).getwidth()[0])


def _may_newline(items: Any, flags: int) -> bool:
    """Whether some character node can match a newline (where Python's ``$`` also
    matches before a final newline)."""
    for op, av in items:
        if op in _CHAR_OPS:
            if op is _c.ANY and not flags & FLAG_S:
                continue
            if any(lo <= 10 <= hi for lo, hi in plain_ranges(op, av, flags)):
                return True
        elif op is _c.SUBPATTERN:
            if _may_newline(av[-1], _combine_flags(flags, int(av[1]), int(av[2]))):
                return True
        elif op is _c.BRANCH:
            if any(_may_newline(b, flags) for b in av[1]):
                return True
        elif op in _REPEATS and _may_newline(av[2], flags):
            return True
        elif op not in _CHAR_OPS and op not in (_c.SUBPATTERN, _c.BRANCH, *_REPEATS, _c.AT):
            return True  # (refused elsewhere)
    return False


class _Translator:
    def __init__(self, pattern: str, flags: int) -> None:
        self.pattern = pattern
        self.verbose = bool(flags & re.VERBOSE)
        self.seen: dict[str, int] = {}  # construct -> occurrences met so far
        self._tokens: list[tuple[int, str]] | None = None

    # -- errors
    def position(self, name: str, index: int) -> int | None:
        if self._tokens is None:
            self._tokens = _scan(self.pattern, self.verbose)
        hits = [p for p, t in self._tokens if t == name]
        if not hits:
            return None
        return hits[index] if index < len(hits) else hits[0]

    def count(self, name: str) -> int:
        k = self.seen.get(name, 0)
        self.seen[name] = k + 1
        return k

    def unsupported(self, what: str, name: str) -> ConstraintError:
        pos = self.position(name, self.count(name))
        return ConstraintError(f"unsupported regex construct: {what}", position=pos)

    # -- translation: each returns (expr, expanded character positions)
    def seq(self, items: Any, flags: int, at_start: bool, at_end: bool) -> tuple[Expr, int]:
        items = list(items)
        n = len(items)
        tail_empty = [True] * (n + 1)
        if at_end:
            for i in range(n - 1, -1, -1):
                tail_empty[i] = tail_empty[i + 1] and _empty_only(*items[i])
        parts: list[Expr] = []
        cost = 0
        run: list[int] = []  # pending literal code points (no IGNORECASE)
        icase = flags & FLAG_I
        for i, (op, av) in enumerate(items):
            if op is _c.LITERAL and (not icase or not self._cased(av, flags)) and not 0xD800 <= av <= 0xDFFF:
                run.append(av)
                at_start = False
                continue
            if run:
                parts.extend(BYTES[b] for b in "".join(map(chr, run)).encode())
                cost += len(run)
                run = []
            e, c = self.node(op, av, flags, at_start, at_end and tail_empty[i + 1])
            parts.append(e)
            cost += c
            if e != EMPTY:
                at_start = False
        if run:
            parts.extend(BYTES[b] for b in "".join(map(chr, run)).encode())
            cost += len(run)
        return seq(*parts), cost

    @staticmethod
    def _cased(cp: int, flags: int) -> bool:
        return bool(_sre.ascii_iscased(cp) if flags & FLAG_A else _sre.unicode_iscased(cp))

    def node(self, op: Any, av: Any, flags: int, at_start: bool, at_end: bool) -> tuple[Expr, int]:
        if op in _CHAR_OPS:
            if op is _c.LITERAL and 0xD800 <= av <= 0xDFFF:
                return NOTHING, 1  # a lone surrogate is never valid UTF-8 text
            return char_node(op, av, flags), 1
        if op is _c.SUBPATTERN:
            _group, add, delete, sub = av
            return self.seq(sub, _combine_flags(flags, int(add), int(delete)), at_start, at_end)
        if op is _c.BRANCH:
            exprs, cost = [], 0
            for branch in av[1]:
                e, c = self.seq(branch, flags, at_start, at_end)
                exprs.append(e)
                cost += c
            return alt(*exprs), cost
        if op in _REPEATS:
            lo, hi, sub = av
            hi = None if hi == _c.MAXREPEAT else hi
            once = hi is not None and hi <= 1
            empty = all(_empty_only(o, a) for o, a in sub)
            e, c = self.seq(sub, flags, at_start and (once or empty), at_end and (once or empty))
            copies = max(hi if hi is not None else lo + 1, 1)
            cost = c * copies
            if cost > MAX_EXPANDED_CHARS:
                text = f"{{{lo}}}" if lo == hi else f"{{{lo},{'' if hi is None else hi}}}"
                pos = self.position("{", self.seen.get("{", 0))
                raise ConstraintTooComplex(
                    f"regex repeat {text} expands to {cost:,} character positions "
                    f"(limit {MAX_EXPANDED_CHARS:,})",
                    position=pos,
                )
            return rep(e, lo, hi), cost
        if op is _c.AT:
            name = _AT_NAMES.get(av, str(av))
            if av in _AT_START and at_start or av in _AT_END and at_end:
                self.count(name)
                return EMPTY, 0
            if av in (_c.AT_BOUNDARY, _c.AT_NON_BOUNDARY):
                return self._raise(f"word boundary {name}", name)
            where = "start" if av in _AT_START else "end"
            return self._raise(f"anchor {name} not at the {where} of the pattern", name)
        if op is _c.GROUPREF:
            return self._raise("backreference", "backreference")
        if op is _c.GROUPREF_EXISTS:
            return self._raise("conditional group (?(...)...)", "(?(")
        if op is _c.ASSERT or op is _c.ASSERT_NOT:
            direction, _sub = av
            kind = "lookahead" if direction == 1 else "lookbehind"
            neg = op is _c.ASSERT_NOT
            name = ("(?!" if neg else "(?=") if direction == 1 else ("(?<!" if neg else "(?<=")
            return self._raise(f"{'negative ' if neg else ''}{kind} {name}...)", name)
        if _ATOMIC is not None and op is _ATOMIC:
            return self._raise("atomic group (?>...)", "(?>")
        if _POSSESSIVE is not None and op is _POSSESSIVE:
            return self._raise("possessive quantifier (*+, ++, ?+, {m,n}+)", "possessive")
        raise ConstraintError(f"unsupported regex construct: {op}")

    def _raise(self, what: str, name: str) -> tuple[Expr, int]:
        raise self.unsupported(what, name)

    # -- end anchors anywhere: (N, E, Z) per node, N the strings matched without passing an
    # end anchor, E those after which an end anchor is passed and the rest of the node
    # matches empty, Z whether the node matches empty once the end is reached
    def ends(self, items: Any, flags: int, at_start: bool) -> tuple[Expr, Expr, bool, int]:
        n_acc, e_acc, z_acc, cost = EMPTY, NOTHING, True, 0
        for op, av in items:
            n, e, z, c = self.end_node(op, av, flags, at_start)
            e_acc = alt(e_acc if z else NOTHING, seq(n_acc, e))
            n_acc, z_acc, cost = seq(n_acc, n), z_acc and z, cost + c
            if not _empty_only(op, av):
                at_start = False
        return n_acc, e_acc, z_acc, cost

    def end_node(self, op: Any, av: Any, flags: int, at_start: bool) -> tuple[Expr, Expr, bool, int]:
        if op is _c.AT and av in _AT_END:
            self.count(_AT_NAMES[av])
            return NOTHING, EMPTY, True, 0
        if not _has_end(op, av):
            e, c = self.node(op, av, flags, at_start, False)
            return e, NOTHING, _min_width(op, av, flags) == 0, c
        if op is _c.SUBPATTERN:
            _group, add, delete, sub = av
            return self.ends(sub, _combine_flags(flags, int(add), int(delete)), at_start)
        if op is _c.BRANCH:
            parts = [self.ends(b, flags, at_start) for b in av[1]]
            return (
                alt(*(p[0] for p in parts)),
                alt(*(p[1] for p in parts)),
                any(p[2] for p in parts),
                sum(p[3] for p in parts),
            )
        lo, hi, sub = av  # a repeat
        hi = None if hi == _c.MAXREPEAT else hi
        n, e, z, c = self.ends(sub, flags, at_start and hi is not None and hi <= 1)
        if c * max(hi if hi is not None else lo + 1, 1) > MAX_EXPANDED_CHARS:
            raise ConstraintTooComplex(
                f"regex repeat with an end anchor expands past {MAX_EXPANDED_CHARS:,} character positions"
            )
        if hi == 0:
            return EMPTY, NOTHING, True, 0
        # k whole iterations, then the one that reaches the end; the later ones match empty
        before = rep(n, 0 if z else max(lo - 1, 0), None if hi is None else hi - 1)
        return rep(n, lo, hi), seq(before, e), lo == 0 or z, c * max(hi if hi is not None else lo + 1, 1)


# ----------------------------------------------------------------------------- public


def _leads(items: list) -> set[bool]:
    """For each way into ``items``: does it open with a start anchor (^, \\A) before any
    character, group contents and branches included?"""
    if not items:
        return {False}
    (op, av), rest = items[0], items[1:]
    if op is _c.AT:
        return {True} if av in _AT_START else _leads(rest)
    if op is _c.SUBPATTERN:
        return _leads(list(av[-1]) + rest)
    if op is _c.BRANCH:
        return set().union(*[_leads(list(b) + rest) for b in av[1]])
    return {False}


def leading_anchor(pattern: str) -> bool | None:
    """Does every match of ``pattern`` open with a start anchor (``^a``, ``(^a|^b)c``):
    True; none of them: False; some (``(^a|b)``): None. (False where ``re`` cannot parse it:
    :func:`regex_to_ir` says why.)"""
    try:
        tree = _sre_parse.parse(pattern)
    except (re.error, RecursionError, ValueError, TypeError):
        return False
    try:
        leads = _leads(list(tree))
    except RecursionError:
        return False
    return True if leads == {True} else False if leads == {False} else None


def _too_deep(pattern: str, verbose: bool, bound: int) -> int | None:
    """Position of the first group opened more than ``bound`` deep, or None."""
    depth, i, n = 0, 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            i = _after_class(pattern, i)
            continue
        if verbose and ch == "#":
            j = pattern.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if ch == "(":
            depth += 1
            if depth > bound:
                return i
        elif ch == ")":
            depth -= 1
        i += 1
    return None


def regex_to_ir(
    pattern: str | re.Pattern[str], *, flags: int = 0, end_only: bool = False, limits: Limits | None = None
) -> Expr:
    """Compile a Python regex to an IR expression with ``re.fullmatch`` semantics.

    Parameters
    ----------
    pattern:
        Python ``re`` syntax (a ``str``, or a compiled ``re.Pattern`` whose flags are
        added to ``flags``).
    flags:
        ``re`` flags: IGNORECASE, DOTALL, VERBOSE, ASCII, MULTILINE, UNICODE.
    end_only:
        ``$`` matches only at the end of the text (ECMA-262, as JSON Schema reads it), not
        also before a final newline; matters only for ``$`` inside the pattern.

    Returns
    -------
    Expr
        Non-recursive IR matching exactly the UTF-8 encodings of the strings ``s`` for
        which ``re.fullmatch(pattern, s, flags)`` succeeds.

    Raises
    ------
    ConstraintError
        Invalid syntax (with ``re``'s position) or an unsupported construct (named, with
        its character position).
    ConstraintTooComplex
        Repeats expanding past :data:`MAX_EXPANDED_CHARS` character positions, a pattern
        longer than ``limits.max_regex_chars`` or with groups nested deeper than
        ``limits.max_regex_nesting`` (:class:`~..limits.Limits`, default ``Limits()``).
    """
    if isinstance(pattern, re.Pattern):
        flags |= pattern.flags
        pattern = pattern.pattern
    if not isinstance(pattern, str):
        raise ConstraintError(f"regex must be a str, got {type(pattern).__name__}", position=0)
    limits = limits or Limits()
    if len(pattern) > limits.max_regex_chars:
        raise ConstraintTooComplex(
            f"regex has {len(pattern):,} characters, over the bound of {limits.max_regex_chars:,} "
            "(Limits.max_regex_chars)",
            bound="max_regex_chars",
            position=limits.max_regex_chars,
        )
    try:
        verbose = bool(int(flags) & re.VERBOSE) or bool(re.match(r"\(\?[a-zA-Z]*x", pattern))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConstraintError(f"invalid regex flags: {exc}", position=0) from None
    deep = _too_deep(pattern, verbose, limits.max_regex_nesting)
    if deep is not None:
        raise ConstraintTooComplex(
            f"regex nests groups over {limits.max_regex_nesting} deep (Limits.max_regex_nesting)",
            bound="max_regex_nesting",
            position=deep,
        )
    with headroom():
        return _to_ir(pattern, int(flags), end_only)


def _to_ir(pattern: str, flags: int, end_only: bool) -> Expr:
    try:
        tree = _sre_parse.parse(pattern, flags)
    except re.error as exc:
        raise ConstraintError(f"invalid regex: {exc.msg}", position=exc.pos or 0) from None
    except RecursionError:
        raise ConstraintTooComplex("regex nests too deeply to parse", position=0) from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ConstraintError(f"invalid regex flags: {exc}", position=0) from None
    global_flags = int(tree.state.flags)
    tr = _Translator(pattern, global_flags)
    try:
        try:
            expr, _cost = tr.seq(tree, global_flags, True, True)
        except ConstraintError as err:
            # an end anchor inside: exact where $ can only mean the end of the text (ECMA
            # reading, or no newline that Python's "$ before a final newline" could leave)
            if "anchor $ not at the end" not in str(err) and "anchor \\Z not at the end" not in str(err):
                raise
            if (
                not end_only
                and _may_newline(tree, global_flags)
                and any(_has_end(o, a, (_c.AT_END,)) for o, a in tree)
            ):
                raise
            n, e, _z, _cost = _Translator(pattern, global_flags).ends(tree, global_flags, True)
            expr = alt(n, e)
    except RecursionError:
        raise ConstraintTooComplex("regex nests too deeply", position=0) from None
    return expr


def _after_class(pattern: str, i: int) -> int:
    """The index just past the character class that opens at ``pattern[i] == "["``."""
    j, n = i + 1, len(pattern)
    if pattern[j : j + 1] == "^":
        j += 1
    if pattern[j : j + 1] == "]":
        j += 1
    while j < n and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1
