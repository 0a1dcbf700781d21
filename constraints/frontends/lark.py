"""Lark EBNF grammars to the byte-level grammar IR.

The grammar text is read by ``lark``'s own grammar loader (``lark.load_grammar``), which
resolves ``%import`` (lark's ``common`` library and the grammars packaged in
``deepinfer.grammars``), expands templates, ``~ n`` / ``~ n..m`` repeats and the EBNF
operators ``? * + [] ()`` into plain BNF rules with helper rules (``__start_star_0`` ...).
This module maps that BNF to :mod:`deepinfer.constraints.ir`:

- a rule becomes ``Alt`` of ``Seq`` of ``Ref`` (rules and terminals are both IR rules:
  lark names rules in lower case and terminals in upper case, so they never collide);
- a string terminal becomes its UTF-8 bytes (``"..."i``: each cased character matches
  its upper and lower case forms); a regex terminal goes through
  :func:`deepinfer.constraints.regex.regex_to_ir` with its flags;
- direct left recursion (``r: r x | y``, which is how lark expands ``x*`` and ``x+``)
  becomes ``y x*`` here, so those helper rules stay regular;
- a rule's alternatives are factored (shared prefixes and suffixes): lark turns each
  ``x?`` of an alternative into two alternatives, so ``k`` of them make ``2^k``; factoring
  gives most of that back (still, prefer a nullable rule ``_ws: WS?`` over many inline
  ``WS?`` in one alternative);
- ``%ignore T`` inserts ``(T1 | T2 ...)*`` after every terminal of every rule and at the
  start of the start rule, i.e. between any two terminals and at both ends of the text,
  never inside a terminal. Like lark's, the run of ignored text is unbounded (a note on
  the grammar says so); grammars meant for generation should spell out bounded
  whitespace instead of ``%ignore WS``.

Semantics: **scannerless**. The language compiled is the language of the grammar with
every terminal read as a regular set of strings, i.e. what lark's Earley parser with
``lexer="dynamic_complete"`` accepts. Lark's lexers (``basic``/``contextual``, and
``dynamic``, which tries only each regex's own greedy match) can reject some of those
texts because of longest match and terminal priorities; we do not model that. One
exception: ``common.ESCAPED_STRING`` (written with a lookbehind, which the regex front end
refuses) is read as lark's lexer reads it, ending at the first unescaped quote. Other
lookaround in a terminal is a ``ConstraintError``.
Priorities (``rule.2``, ``TERM.2``), aliases (``-> name``) and ``?rule`` inlining shape
lark's parse trees only and do not change the language, so they are accepted and ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import (
    EMPTY,
    NOTHING,
    Expr,
    Grammar,
    Ref,
    alt,
    lit,
    plus,
    seq,
    special_bytes,
    star,
    unproductive,
    utf8_class,
)
from ..limits import Limits, headroom, out_of_time, past_deadline

IGNORE_RULE = "%ignore"  # lark names cannot contain '%', so this never collides

_RE_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE, "u": re.UNICODE}
# Terminals of lark's common.lark written with lookaround, read as lark's lexer reads them.
# ESCAPED_STRING's regex, taken as a set of strings, also holds '"a"b"' (the lazy .*? may
# pass a quote); the lexer ends the string at the first unescaped quote, and so do we.
_KNOWN_PATTERNS = {
    r'".*?(?<!\\)(\\\\)*?"': r'"(?:[^"\\\n]|\\[^\n])*"',  # common.ESCAPED_STRING
}
_POSITION = re.compile(r"at line (\d+) column (\d+)")
_UNDEFINED = re.compile(r"(?:Rule|Terminal) '([^']+)' used but not defined(?: \(in rule ([^)]+)\))?")


def lark_to_grammar(
    text: str,
    start: str = "start",
    *,
    limits: Limits | None = None,
    deadline: float | None = None,
    specials: dict | None = None,
) -> Grammar:
    """Compile a Lark grammar to the byte-level grammar IR.

    Parameters
    ----------
    text:
        The grammar in Lark's EBNF syntax. ``%import common.X`` and
        ``%import <packaged grammar>.X`` (e.g. ``%import json.value``) resolve.
    start:
        The rule every output must match.
    limits:
        Bounds on the text (:class:`~..limits.Limits`: ``max_grammar_chars``,
        ``max_grammar_nesting``); default ``Limits()``.
    deadline:
        A ``time.monotonic()`` past which the mapping stops (:class:`ConstraintTooComplex`).
    specials:
        The special tokens a rule may name (see :func:`extensions`): ``{"names": {text:
        id}, "ids": set of special ids}``; None: none.

    Returns
    -------
    Grammar
        One IR rule per Lark rule and per terminal, plus ``"%ignore"`` when the grammar
        has ``%ignore`` directives; ``grammar.start == start``.

    Raises
    ------
    ConstraintError
        On a syntax error (with line and column), an undefined rule or terminal (named,
        with the line and column of its first use), a missing start rule, a
        ``%declare``-d terminal (it has no pattern to enforce), or a regex terminal the
        regex front end rejects.
    ConstraintTooComplex
        A text past the bounds of ``limits`` (named, with the line and column), or the
        deadline passed.
    """
    if not isinstance(text, str):
        raise ConstraintError(f"grammar must be a str, got {type(text).__name__}", line=1, column=1)
    limits = limits or Limits()
    check_text(text, limits)
    text, embedded = extensions(text, specials)
    with headroom():
        terminals, rules, ignore = _load(text, start)

    out: dict[str, Expr] = {}
    term_by_name = {t.name: t for t in terminals}
    used_terms = {str(s.name) for r in rules for s in r.expansion if s.is_term} | {str(n) for n in ignore}
    for name in sorted(used_terms):
        if past_deadline(deadline):
            raise out_of_time("Lark front end", limits, **rule_location(text, name, start))
        if name not in term_by_name:
            raise ConstraintError(
                f"terminal {name!r} is declared (%declare) but has no pattern to enforce",
                **_locate(text, name),
            )
        out[name] = _terminal_ir(term_by_name[name], text, limits)

    ign: Expr | None = None
    if ignore:
        out[IGNORE_RULE] = star(alt(*(Ref(n) for n in ignore)))
        ign = Ref(IGNORE_RULE)

    expansions: dict[str, list[list[Expr]]] = {}
    for r in rules:
        items: list[Expr] = []
        for s in r.expansion:
            items.append(Ref(str(s.name)))
            if s.is_term and ign is not None:
                items.append(ign)
        expansions.setdefault(str(r.origin.name), []).append(items)
    for name, alts in expansions.items():
        if past_deadline(deadline):
            raise out_of_time("Lark front end", limits, **rule_location(text, name, start))
        out[name] = _rule_ir(name, alts)
    if ign is not None:
        out[start] = seq(ign, out[start])
    ids = _embed(out, embedded, limits, deadline)
    dead = unproductive(out)
    if start in dead:
        raise ConstraintError(
            f"start rule {start!r} derives no finite text (every alternative recurses forever "
            f"through {', '.join(sorted(n for n in dead if not n.startswith('__'))) or start})",
            **rule_location(text, start, start),
        )

    notes = []
    if ignore:
        notes.append(
            f"%ignore {', '.join(ignore)}: unbounded runs of ignored text are allowed between "
            "terminals and at both ends (lark semantics); spell out bounded whitespace to limit them"
        )
    return Grammar(rules=out, start=start, notes=notes, specials=ids)


# ------------------------------------------------------------------- extensions

_SPECIAL = re.compile(r"<\|[^|\s\"]{1,64}\|>|<\[(\d{1,8})\]>")


def _past_literal(text: str, i: int) -> int:
    """The index just past the string, regex literal (to its closing quote or slash, or the
    line end) or comment that starts at ``i`` of grammar ``text``; ``i`` when none starts there."""
    n, c = len(text), text[i]
    if c == '"' or c == "/" and text[i + 1 : i + 2] != "/":
        j = i + 1
        while j < n and text[j] != c and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return j + 1
    if c == "/" or c == "#":
        j = text.find("\n", i)
        return n if j < 0 else j + 1
    return i


def extensions(text: str, specials: dict | None) -> tuple[str, list[tuple[str, object, dict]]]:
    """Replace what lark's loader does not read, outside strings, regexes and comments, by
    references to rules appended to the text, and return ``(text, [(rule, what, where)])``:

    - a special token, by its text ``<|im_end|>`` or its id ``<[128009]>`` (as llguidance's
      Lark writes them): ``what`` is the id (an unknown one is an error at its line and
      column);
    - ``%json { ... }``, a JSON Schema (as llguidance's Lark writes it): ``what`` is the schema.

    A reference takes the same columns as what it replaces (padded with spaces; a schema's
    line breaks are kept), so lark's positions stay those of the text as written."""
    if "<" not in text and "%json" not in text:
        return text, []
    names = (specials or {}).get("names", {})
    ids = (specials or {}).get("ids", frozenset())
    prefix = "_sp"
    while re.search(re.escape(prefix) + r"\d", text):
        prefix += "x"
    out: list[str] = []
    found: list[tuple[str, object, dict]] = []
    i = last = 0
    n = len(text)
    while i < n:
        c = text[i]
        k = _past_literal(text, i)
        if k != i:  # a string, a regex literal or a comment: nothing to read inside
            i = k
            continue
        m = _SPECIAL.match(text, i) if c == "<" else None
        if m is not None:
            where = _line_column(text, i)
            _no_terminal(text, i, m.group(), where)
            if m.group(1) is not None:
                tid = int(m.group(1))
                if tid not in ids:
                    raise ConstraintError(
                        f"token id {tid} in {m.group()} is not a special token of the vocabulary", **where
                    )
            else:
                tid = names.get(m.group())
                if tid is None:
                    known = ", ".join(sorted(names)[:8]) or "none"
                    raise ConstraintError(
                        f"unknown special token {m.group()} (special tokens: {known})", **where
                    )
            name = f"{prefix}{len(found)}"
            found.append((name, tid, where))
            out.append(text[last:i] + name.ljust(m.end() - i))
            i = last = m.end()
            continue
        if c == "%" and text.startswith("%json", i) and not text[i + 5 : i + 6].isalnum():
            where = _line_column(text, i)
            j = i + 5
            while j < n and text[j] in " \t":
                j += 1
            end = _json_end(text, j) if j < n and text[j] == "{" else -1
            if end < 0:
                raise ConstraintError("%json needs a JSON object (a schema) after it, on its line", **where)
            import json

            try:
                schema = json.loads(text[j:end])
            except ValueError as e:
                raise ConstraintError(f"%json: the schema is not valid JSON: {e}", **where) from None
            name = f"{prefix}{len(found)}"
            found.append((name, ("json", schema), where))
            blank = "".join(ch if ch == "\n" else " " for ch in text[i:end])
            out.append(
                text[last:i] + name + blank[len(name) :] if len(name) <= end - i else text[last:i] + name
            )
            i = last = end
            continue
        i += 1
    out.append(text[last:])
    defs = "".join(f'\n{name}: "x"' for name, _, _ in found)
    return "".join(out) + defs, found


def _json_end(text: str, i: int) -> int:
    """The index after the JSON object starting at ``text[i] == "{"`` (-1 if unbalanced)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _no_terminal(text: str, at: int, what: str, where: dict) -> None:
    """Refuse a special token inside a terminal's definition (terminals are text)."""
    line = text[text.rfind("\n", 0, at) + 1 : at]
    m = re.match(r"[ \t]*([A-Z_][A-Z_0-9]*)[ \t]*(?:\.[ \t]*-?\d+[ \t]*)?:", line)
    if m and m.group(1).lstrip("_"):
        raise ConstraintError(
            f"special token {what} in terminal {m.group(1)}: special tokens may be named in rules only",
            **where,
        )


def _embed(out: dict[str, Expr], embedded: list, limits: Limits, deadline: float | None) -> tuple[int, ...]:
    """Put the special tokens and JSON Schemas found by :func:`extensions` in their rules;
    returns the ids of the special tokens."""
    ids: set[int] = set()
    for name, what, where in embedded:
        if isinstance(what, int):
            out[name] = lit(special_bytes(what))
            ids.add(what)
            continue
        from ..json_schema.lowering import schema_to_grammar
        from .structural import embed

        try:
            sub = schema_to_grammar(what[1], runtime_unique=False, limits=limits, deadline=deadline)
        except ConstraintError as e:
            raise type(e)(f"%json: {e.message}" + (f" (at {e.path})" if e.path else ""), **where) from None
        out[name] = embed(out, sub, name + ":")
    return tuple(sorted(ids))


# ---------------------------------------------------------------------------- bounds


def check_text(text: str, limits: Limits) -> None:
    """Refuse a grammar text longer than ``limits.max_grammar_chars``, with a lone surrogate,
    or nesting ``( [ {`` deeper than ``limits.max_grammar_nesting`` (lark's loader recurses
    on nesting), naming the line and column; a linear scan that skips strings, regexes and
    comments."""
    if len(text) > limits.max_grammar_chars:
        at = limits.max_grammar_chars
        raise ConstraintTooComplex(
            f"grammar has {len(text):,} characters, over the bound of {at:,} (Limits.max_grammar_chars)",
            bound="max_grammar_chars",
            **_line_column(text, at),
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConstraintError(
                f"grammar holds a lone surrogate (U+{ord(text[e.start]):04X}), which is not valid UTF-8",
                **_line_column(text, e.start),
            ) from None
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        k = _past_literal(text, i)
        if k != i:  # a string, a regex literal or a comment: nothing to read inside
            i = k
            continue
        if c in "([{":
            depth += 1
            if depth > limits.max_grammar_nesting:
                raise ConstraintTooComplex(
                    f"grammar nests ( [ {{ over {limits.max_grammar_nesting} deep "
                    "(Limits.max_grammar_nesting)",
                    bound="max_grammar_nesting",
                    **_line_column(text, i),
                )
        elif c in ")]}":
            depth = max(0, depth - 1)
        i += 1


def _line_column(text: str, at: int) -> dict[str, int]:
    """1-based line and column of character ``at``."""
    return {"line": text.count("\n", 0, at) + 1, "column": at - (text.rfind("\n", 0, at) + 1) + 1}


_DEFINITION = r"^[ \t]*[?!]?{name}[ \t]*(?:\.[ \t]*-?\d+[ \t]*)?:"


def _locate_definition(text: str, name: str) -> dict[str, int]:
    """Line and column of the definition of rule or terminal ``name``, or {}."""
    m = re.search(_DEFINITION.format(name=re.escape(name)), text, re.M)
    if m is None:
        return {}
    return _line_column(text, m.start() + m.group().index(name))


def rule_location(text: str, rule: str | None, start: str = "start") -> dict[str, int]:
    """Where an error about ``rule`` (a rule, a terminal, or a helper lark made from one:
    ``__start_star_0``) is placed: its definition, else the start rule's, else line 1,
    column 1."""
    for name in (rule, (rule or "").lstrip("_").split("_star_")[0].split("_plus_")[0], start):
        if name:
            where = _locate_definition(text, name)
            if where:
                return where
    return {"line": 1, "column": 1}


# ---------------------------------------------------------------------------- loading


def _load(text: str, start: str):  # -> (terminals, rules, ignore) as lark compiles them
    from lark.exceptions import GrammarError, LarkError, UnexpectedInput
    from lark.load_grammar import FromPackageLoader, load_grammar

    try:
        grammar, _ = load_grammar(text, "<grammar>", [FromPackageLoader("deepinfer.grammars", ("",))], True)
        defined = [str(d[0]) for d in grammar.rule_defs]
        if start not in defined:
            public = [n for n in defined if not n.startswith("_")]
            raise ConstraintError(
                f"start rule {start!r} is not defined in the grammar (rules: {', '.join(public) or 'none'})"
            )
        return grammar.compile([start], set())
    except UnexpectedInput as e:
        line, column = getattr(e, "line", None), getattr(e, "column", None)
        where = (
            {"line": line, "column": column}
            if isinstance(line, int) and line > 0
            else _line_column(text, len(text))  # (at the end of the text)
        )
        raise ConstraintError(f"Lark grammar syntax error: {_first_line(str(e))}", **where) from None
    except GrammarError as e:
        raise _grammar_error(str(e), text) from None
    except RecursionError:
        raise ConstraintTooComplex("grammar nests too deeply for lark's loader", line=1, column=1) from None
    except LarkError as e:
        orig = getattr(e, "orig_exc", None)
        if isinstance(orig, RecursionError):
            raise ConstraintTooComplex(
                "grammar nests too deeply for lark's loader", line=1, column=1
            ) from None
        raise ConstraintError(f"invalid Lark grammar: {_first_line(str(e))}") from None
    except (OSError, ImportError) as e:
        raise ConstraintError(f"invalid Lark grammar: %import failed ({e})") from None
    except ConstraintError:
        raise
    except Exception as e:  # noqa: BLE001 - lark's loader failing on the text: the text is at fault
        raise ConstraintError(
            f"invalid Lark grammar: lark's loader failed ({type(e).__name__}: {e})"
        ) from None


def _first_line(msg: str) -> str:
    return msg.strip().split("\n")[0].rstrip(", ")


def _grammar_error(msg: str, text: str) -> ConstraintError:
    m = _POSITION.search(msg)
    if m:
        head = _first_line(msg[: m.start()]).rstrip(", ")
        return ConstraintError(
            f"Lark grammar syntax error: {head}", line=int(m.group(1)), column=int(m.group(2))
        )
    u = _UNDEFINED.search(msg)
    if u:
        name = u.group(1)
        kind = "terminal" if name.lstrip("_").isupper() else "rule"
        where = f" (used in rule {u.group(2)})" if u.group(2) else ""
        return ConstraintError(f"undefined {kind} {name!r}{where}", **_locate(text, name))
    return ConstraintError(f"invalid Lark grammar: {_first_line(msg)}")


def _locate(text: str, name: str) -> dict[str, int]:
    """Line and column (1-based) of the first use of ``name`` outside a definition."""
    word = re.compile(r"(?<![\w.])" + re.escape(name) + r"(?![\w])")
    for i, line in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(?:[^"\\]|\\.)*"|/(?:[^/\\\n]|\\.)+/|//.*', lambda m: " " * len(m.group()), line)
        for m in word.finditer(code):
            before = code[: m.start()].strip()
            after = code[m.end() :].lstrip()
            is_definition = before in ("", "?", "!") and (after.startswith(":") or after.startswith("."))
            if not is_definition and not before.startswith("%declare"):
                return {"line": i, "column": m.start() + 1}
    return {}


# --------------------------------------------------------------------------- mapping


def _rule_ir(name: str, alts: list[list[Expr]]) -> Expr:
    """``name: alt1 | alt2 ...`` as IR, with two rewrites that keep the language:

    - direct left recursion ``name: name beta | alpha`` becomes ``alpha beta*`` (``alpha+``
      when ``beta == alpha``, which is how lark expands ``x+`` and ``x*``);
    - alternatives are factored (shared prefixes, then shared suffixes), undoing most of
      lark's expansion of ``x?`` / ``[x]`` into one alternative with and one without
      ``x``: ``a x? b`` comes back as ``a (x b | b)`` instead of ``a x b | a b``, so
      nested rules are not copied once per alternative.
    """
    me = Ref(name)
    heads: list[tuple[Expr, ...]] = []
    tails: list[tuple[Expr, ...]] = []
    for items in alts:
        if items and items[0] == me:
            if len(items) > 1:  # `r: r` adds nothing
                tails.append(tuple(items[1:]))
        else:
            heads.append(tuple(items))
    head = _factor(heads) if heads else NOTHING
    if not tails:
        return head
    tail = _factor(tails)
    return plus(head) if tail == head else seq(head, star(tail))


def _factor(alts: list[tuple[Expr, ...]]) -> Expr:
    """``alt(*map(seq, alts))``, written with shared prefixes and suffixes factored out."""
    alts = list(dict.fromkeys(alts))
    if len(alts) == 1:
        return seq(*alts[0]) if alts[0] else EMPTY
    # common suffix of every alternative
    k = 0
    while all(len(a) > k for a in alts) and len({a[len(a) - 1 - k] for a in alts}) == 1:
        k += 1
    if k:
        suffix = alts[0][len(alts[0]) - k :]
        return seq(_factor([a[: len(a) - k] for a in alts]), *suffix)
    # group by first item (a prefix trie), keeping the order of first appearance
    groups: dict[Expr | None, list[tuple[Expr, ...]]] = {}
    for a in alts:
        groups.setdefault(a[0] if a else None, []).append(a[1:])
    if len(groups) == len(alts):  # nothing shared at the front
        return alt(*(seq(*a) if a else EMPTY for a in alts))
    out = []
    for first, rests in groups.items():
        if first is None:
            out.append(EMPTY)
        else:
            out.append(seq(first, _factor(rests)))
    return alt(*out)


def _terminal_ir(term, text: str, limits: Limits | None = None) -> Expr:
    from lark.lexer import PatternStr

    pattern = term.pattern
    flags = set(pattern.flags)
    unknown = flags - set(_RE_FLAGS)
    if unknown:
        raise ConstraintError(
            f"terminal {term.name!r}: unsupported regex flag(s) {''.join(sorted(unknown))!r}",
            **_locate_terminal(text, term),
        )
    if isinstance(pattern, PatternStr):
        return _caseless(pattern.value) if "i" in flags else lit(pattern.value)
    from .regex import regex_to_ir  # lazy: the regex front end is a sibling module

    bits = 0
    for f in flags:
        bits |= _RE_FLAGS[f]
    try:
        value = _KNOWN_PATTERNS.get(pattern.value, pattern.value)
        expr = regex_to_ir(value, flags=bits, limits=limits)  # (bounded: before re.compile)
        re.compile(value, bits)
        return expr
    except (ConstraintError, re.error, RecursionError, OverflowError, ValueError) as e:
        cls = type(e) if isinstance(e, ConstraintError) else ConstraintError
        err = cls(f"terminal {term.name!r} (/{pattern.value}/): {e}", **_locate_terminal(text, term))
        if isinstance(e, ConstraintTooComplex):
            err.bound = e.bound
        raise err from None


def _locate_terminal(text: str, term) -> dict[str, int]:
    """Where a terminal is written: its definition, or an anonymous /regex/ inline."""
    if term.name.startswith("__"):
        at = text.find("/" + term.pattern.value + "/")
    else:
        m = re.search(r"^[ \t]*" + re.escape(term.name) + r"\s*(?:\.\s*-?\d+\s*)?:", text, re.M)
        at = m.start() + m.group().index(term.name) if m else -1
    if at < 0:
        return _locate(text, term.name)
    return {"line": text.count("\n", 0, at) + 1, "column": at - (text.rfind("\n", 0, at) + 1) + 1}


def _caseless(value: str) -> Expr:
    """``"value"i``: every cased character matches its single-character case variants."""
    return seq(*(_char_variants(c) for c in value))


def _char_variants(c: str) -> Expr:
    forms: Iterable[str] = {c, c.lower(), c.upper(), c.casefold(), c.title()}
    cps = sorted(ord(f) for f in forms if len(f) == 1)
    if len(cps) == 1:
        return lit(c)
    return utf8_class([(cp, cp) for cp in cps])
