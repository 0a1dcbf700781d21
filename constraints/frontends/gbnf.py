"""GBNF grammars (llama.cpp's dialect) to the byte-level grammar IR.

A second grammar front end beside :mod:`.lark`, lowered to the same IR
(:mod:`deepinfer.constraints.ir`): one IR rule per GBNF rule, ``root`` the start rule.
The syntax read is llama.cpp's (``grammars/README.md`` there):

- ``name ::= alternatives``; names are letters, digits, ``-`` and ``_``; a rule ends at a
  line break outside parentheses, except right after ``::=`` or ``|`` (so a rule may go on
  over several lines inside ``( ... )`` or after a trailing ``|``); ``#`` starts a comment;
- ``a b`` sequence, ``a | b`` alternatives (an empty alternative is the empty string),
  ``( ... )`` grouping, postfix ``*`` ``+`` ``?`` and ``{m}`` ``{m,}`` ``{m,n}`` ``{,n}``
  (stacked postfixes apply one after the other: ``x*?`` is ``(x*)?``);
- ``"..."`` literals, ``[...]`` / ``[^...]`` character classes with ranges ``a-z`` (a ``-``
  first or last is literal), ``.`` any character; escapes ``\\n \\r \\t \\\\ \\" \\[ \\]
  \\- \\^ \\xNN \\uNNNN \\UNNNNNNNN`` (``\\x`` names a code point, as in llama.cpp, not a
  byte). Characters are Unicode code points, matched as UTF-8; a negated class and ``.``
  are every valid code point but those listed (surrogates are never text).

Refused with a :class:`ConstraintError` naming the construct and its line and column:
token references (``<[128000]>``, ``<|im_end|>``, ``!<[...]>``: llama.cpp's token-level
matching), lookahead assertions ``(= ...)`` (xgrammar's extension), a rule defined twice,
a rule used but not defined (at its first use), a missing ``root``, any other syntax error.
"""

from __future__ import annotations

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import (
    ANY_CHAR,
    EMPTY,
    MAX_CODE_POINT,
    Expr,
    Grammar,
    Ref,
    alt,
    lit,
    rep,
    seq,
    unproductive,
)
from ..limits import Limits, headroom, out_of_time, past_deadline
from .regex_classes import char_node

try:  # Python 3.11+
    from re import _constants as _sre
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _sre  # type: ignore[no-redef]

MAX_REPEAT = 10_000  # the largest m or n of a {m,n} repetition
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_SIMPLE_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "\\": "\\",
    '"': '"',
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def gbnf_to_grammar(
    text: str, start: str = "root", *, limits: Limits | None = None, deadline: float | None = None
) -> Grammar:
    """Compile a GBNF grammar to the byte-level grammar IR.

    Parameters
    ----------
    text:
        The grammar in llama.cpp's GBNF syntax.
    start:
        The rule every output must match (GBNF's is ``root``).
    limits:
        Bounds on the text (``max_grammar_chars``, ``max_grammar_nesting``); default ``Limits()``.
    deadline:
        A ``time.monotonic()`` past which the mapping stops (:class:`ConstraintTooComplex`).

    Returns
    -------
    Grammar
        One IR rule per GBNF rule; ``grammar.start == start``.

    Raises
    ------
    ConstraintError
        A syntax error, an unsupported construct (named), an undefined rule (named, at its
        first use), a rule defined twice, a missing start rule: each with line and column.
    ConstraintTooComplex
        A text past the bounds of ``limits``, a repetition count over :data:`MAX_REPEAT`, or
        the deadline passed.
    """
    if not isinstance(text, str):
        raise ConstraintError(f"grammar must be a str, got {type(text).__name__}", line=1, column=1)
    limits = limits or Limits()
    if len(text) > limits.max_grammar_chars:
        at = limits.max_grammar_chars
        raise ConstraintTooComplex(
            f"grammar has {len(text):,} characters, over the bound of {at:,} (Limits.max_grammar_chars)",
            bound="max_grammar_chars",
            **line_column(text, at),
        )
    with headroom():
        p = _Parser(text, limits, deadline)
        rules = p.parse()
    if start not in rules:
        names = ", ".join(rules) or "none"
        raise ConstraintError(f"GBNF grammar has no start rule {start!r} (rules: {names})", line=1, column=1)
    for name, at in p.uses:
        if name not in rules:
            raise ConstraintError(f"GBNF rule {name!r} is used but not defined", **line_column(text, at))
    dead = unproductive(rules)
    if start in dead:
        raise ConstraintError(
            f"GBNF start rule {start!r} derives no finite text (every alternative recurses forever "
            f"through {', '.join(sorted(dead))})",
            **line_column(text, p.defined[start]),
        )
    return Grammar(rules=rules, start=start)


def line_column(text: str, at: int) -> dict[str, int]:
    """1-based line and column of character ``at`` of ``text``."""
    return {"line": text.count("\n", 0, at) + 1, "column": at - (text.rfind("\n", 0, at) + 1) + 1}


def rule_location(text: str, rule: str | None, start: str = "root") -> dict[str, int]:
    """Where an error about ``rule`` is placed: its definition, else the start rule's, else
    line 1, column 1 (a linear scan of the rule heads)."""
    heads: dict[str, int] = {}
    at = 0
    for line in text.splitlines(keepends=True):
        head = line.lstrip(" \t")
        name = head.split("::=", 1)[0].strip() if "::=" in head else ""
        if name and all(c in _NAME_CHARS for c in name):
            heads.setdefault(name, at + len(line) - len(head))
        at += len(line)
    for name in (rule, start):
        if name and name in heads:
            return line_column(text, heads[name])
    return {"line": 1, "column": 1}


class _Parser:
    """Recursive descent over llama.cpp's GBNF syntax (positions are character offsets)."""

    def __init__(self, text: str, limits: Limits, deadline: float | None) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.limits = limits
        self.deadline = deadline
        self.depth = 0
        self.uses: list[tuple[str, int]] = []  # (rule name, offset) in order of use
        self.defined: dict[str, int] = {}  # rule name -> offset of its definition

    # ------------------------------------------------------------------ helpers

    def error(self, message: str, at: int | None = None) -> ConstraintError:
        return ConstraintError(
            f"GBNF syntax error: {message}", **line_column(self.text, self.i if at is None else at)
        )

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < self.n else ""

    def space(self, newline_ok: bool) -> None:
        """Skip blanks and comments; line breaks too where ``newline_ok``."""
        t, n = self.text, self.n
        while self.i < n:
            c = t[self.i]
            if c == " " or c == "\t" or (newline_ok and (c == "\n" or c == "\r")):
                self.i += 1
            elif c == "#":
                while self.i < n and t[self.i] not in "\r\n":
                    self.i += 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while self.i < self.n and self.text[self.i] in _NAME_CHARS:
            self.i += 1
        if self.i == j:
            raise self.error(f"expected a rule name, got {self._shown()}")
        return self.text[j : self.i]

    def _shown(self) -> str:
        c = self.peek()
        return "the end of the text" if not c else "a line break" if c in "\r\n" else repr(c)

    # -------------------------------------------------------------------- rules

    def parse(self) -> dict[str, Expr]:
        rules: dict[str, Expr] = {}
        self.space(True)
        while self.i < self.n:
            if past_deadline(self.deadline):
                raise out_of_time("GBNF front end", self.limits, **line_column(self.text, self.i))
            at = self.i
            if self.peek() in "<!":
                self.refuse_token_reference()
            if self.peek() == "|":
                raise self.error(
                    "'|' at the start of a line: a rule goes on over a line break only after '::=', "
                    "after a trailing '|' or inside parentheses"
                )
            name = self.name()
            self.space(False)
            if not self.text.startswith("::=", self.i):
                raise self.error(f"expected '::=' after rule name {name!r}, got {self._shown()}")
            if name in self.defined:
                first = line_column(self.text, self.defined[name])
                raise ConstraintError(
                    f"GBNF rule {name!r} is defined twice (first at line {first['line']})",
                    **line_column(self.text, at),
                )
            self.defined[name] = at
            self.i += 3
            self.space(True)
            rules[name] = self.alternatives(nested=False)
            if self.i < self.n and self.peek() not in "\r\n":
                c = self.peek()
                what = "')' without '('" if c == ")" else f"unexpected {self._shown()}"
                raise self.error(what)
            self.space(True)
        return rules

    def alternatives(self, nested: bool) -> Expr:
        items = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            items.append(self.sequence(nested))
        return alt(*items)

    def sequence(self, nested: bool) -> Expr:
        items: list[Expr] = []
        t = self.text
        while self.i < self.n:
            c = t[self.i]
            at = self.i
            if c == '"':
                items.append(self.literal())
            elif c == "[":
                items.append(self.char_class())
            elif c == ".":
                self.i += 1
                items.append(ANY_CHAR)
            elif c in _NAME_CHARS:
                name = self.name()
                j = self.i
                while j < self.n and t[j] in " \t":
                    j += 1
                if t.startswith("::=", j):
                    raise self.error(
                        f"rule {name!r} defined inside another rule (a rule definition starts a new line)", at
                    )
                self.uses.append((name, at))
                items.append(Ref(name))
            elif c == "(":
                if self.peek(1) == "=":
                    raise ConstraintError(
                        "GBNF lookahead assertion '(= ...)' is not supported", **line_column(t, at)
                    )
                self.depth += 1
                if self.depth > self.limits.max_grammar_nesting:
                    raise ConstraintTooComplex(
                        f"grammar nests ( ) over {self.limits.max_grammar_nesting} deep "
                        "(Limits.max_grammar_nesting)",
                        bound="max_grammar_nesting",
                        **line_column(t, at),
                    )
                self.i += 1
                self.space(True)
                inner = self.alternatives(nested=True)
                if self.peek() != ")":
                    raise self.error(
                        f"expected ')' to close the '(' at line {line_column(t, at)['line']}, "
                        f"got {self._shown()}"
                    )
                self.i += 1
                self.depth -= 1
                items.append(inner)
            elif c in "*+?":
                if not items:
                    raise self.error(f"'{c}' with nothing before it to repeat")
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                items[-1] = rep(items[-1], lo, hi)
            elif c == "{":
                if not items:
                    raise self.error("'{' with nothing before it to repeat")
                lo, hi = self.bounds()
                items[-1] = rep(items[-1], lo, hi)
            elif c in "<!":
                self.refuse_token_reference()
            else:
                break
            self.space(nested)
        return seq(*items) if items else EMPTY

    def refuse_token_reference(self) -> None:
        at = self.i
        j = self.text.find(">", at)
        shown = self.text[at : j + 1] if 0 <= j - at < 40 else self.text[at : at + 12]
        if self.peek() == "!" and self.peek(1) != "<":
            raise self.error("unexpected '!'")
        raise ConstraintError(
            f"GBNF token reference {shown!r} is not supported (llama.cpp's token-level matching: "
            "write the token's text as a string literal instead)",
            **line_column(self.text, at),
        )

    def bounds(self) -> tuple[int, int | None]:
        at = self.i
        self.i += 1
        self.space(False)
        lo = self.integer()
        self.space(False)
        hi: int | None
        if self.peek() == ",":
            self.i += 1
            self.space(False)
            hi = self.integer()
            self.space(False)
        else:
            if lo is None:
                raise self.error("expected a number in '{m,n}'")
            hi = lo
        if self.peek() != "}":
            raise self.error(f"expected '}}' to close the repetition, got {self._shown()}")
        self.i += 1
        lo = lo or 0
        if hi is not None and hi < lo:
            raise ConstraintError(
                f"GBNF repetition {{{lo},{hi}}}: the maximum is below the minimum",
                **line_column(self.text, at),
            )
        if max(lo, hi or 0) > MAX_REPEAT:
            raise ConstraintTooComplex(
                f"GBNF repetition count over {MAX_REPEAT:,}",
                bound="gbnf_max_repeat",
                **line_column(self.text, at),
            )
        return lo, hi

    def integer(self) -> int | None:
        j = self.i
        while self.i < self.n and self.text[self.i].isascii() and self.text[self.i].isdigit():
            self.i += 1
        return int(self.text[j : self.i]) if self.i > j else None

    # --------------------------------------------------------------- characters

    def char(self, in_class: bool) -> int:
        """One character of a literal or a class (an escape read), as a code point."""
        t = self.text
        at = self.i
        c = t[self.i]
        if c != "\\":
            self.i += 1
            if 0xD800 <= ord(c) <= 0xDFFF:
                raise ConstraintError(
                    "GBNF text holds a lone surrogate, not valid UTF-8", **line_column(t, at)
                )
            return ord(c)
        e = self.peek(1)
        if e in _SIMPLE_ESCAPES:
            self.i += 2
            return ord(_SIMPLE_ESCAPES[e])
        if e in _HEX_ESCAPES:
            k = _HEX_ESCAPES[e]
            digits = t[self.i + 2 : self.i + 2 + k]
            if len(digits) != k or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"'\\{e}' takes {k} hexadecimal digits")
            cp = int(digits, 16)
            if cp > MAX_CODE_POINT or 0xD800 <= cp <= 0xDFFF:
                raise ConstraintError(
                    f"GBNF escape '\\{e}{digits}' is not a Unicode scalar value", **line_column(t, at)
                )
            self.i += 2 + k
            return cp
        if not e:
            raise self.error("escape '\\' at the end of the text")
        raise self.error(f"unknown escape '\\{e}'")

    def literal(self) -> Expr:
        open_at = self.i
        self.i += 1
        out: list[str] = []
        while True:
            c = self.peek()
            if not c or c in "\r\n":
                raise self.error("string literal not closed before the end of the line", open_at)
            if c == '"':
                self.i += 1
                return lit("".join(out))
            out.append(chr(self.char(in_class=False)))

    def char_class(self) -> Expr:
        open_at = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            c = self.peek()
            if not c or c in "\r\n":
                raise self.error("character class not closed before the end of the line", open_at)
            if c == "]":
                self.i += 1
                break
            lo = self.char(in_class=True)
            hi = lo
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                at = self.i
                hi = self.char(in_class=True)
                if hi < lo:
                    raise ConstraintError(
                        f"GBNF character range {chr(lo)!r}-{chr(hi)!r} is reversed",
                        **line_column(self.text, at),
                    )
            ranges.append((lo, hi))
        if not ranges and not negate:
            raise self.error("empty character class '[]'", open_at)
        # one character of the class, as the regex front end writes one (UTF-8, left-factored)
        items = [(_sre.NEGATE, None)] if negate else []
        items += [(_sre.RANGE, r) if r[0] < r[1] else (_sre.LITERAL, r[0]) for r in ranges]
        return char_node(_sre.IN, items, 0)
