"""Constraints that hold on part of the output: structural tags and reasoning blocks.

Both lower to one grammar IR, so the trigger and marker checks are part of the automaton
(a token whose bytes hold a trigger enters the segment at the right byte, by the ordinary
trie walk), and every mask stays a memoised row:

- **structural tags**: free text, in which a *trigger* string starts a tagged segment. A
  tag ``{"begin", <content>, "end", "then"}`` whose ``begin`` starts with a trigger says
  what follows the trigger: the rest of ``begin``, the content (a JSON Schema, regex, Lark
  grammar or choice, lowered by the compiler; none: any text up to the first ``end``), then
  ``end``. After a segment the free text resumes (``then="text"``) or the output ends
  (``then="end"``). Free text never holds a trigger: its first occurrence starts a segment.
  The segments number ``min_segments..max_segments``.

  ``start: (P_t seg_t){min,max} F | (P_t seg_t){min-1,max-1} P_t last_t`` where ``F`` is
  text holding no trigger, ``P_t`` text that ends at the first occurrence of a trigger
  (``t``), ``seg_t`` a ``then="text"`` segment begun by ``t`` and ``last_t`` a
  ``then="end"`` one.
- **reasoning**: ``begin``, text holding no ``end``, ``end``, then the constraint (or any
  text). The token budget of the block is a run-time count (:mod:`..reasoning`).

Sub-grammars keep their own rules, renamed under a prefix (``tag0:start``), so recursive
JSON Schemas and grammars embed as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConstraintError
from ..ir import (
    ANY_CHAR,
    EMPTY,
    Expr,
    Grammar,
    Ref,
    alt,
    difference,
    lit,
    plus,
    rename_refs,
    rep,
    seq,
    special_id,
    star,
)

TEXT: Expr = star(ANY_CHAR)  # any UTF-8 text
THEN = ("text", "end")


@dataclass(frozen=True)
class Tag:
    """One lowered tag: ``begin`` content ``end`` (content None: text up to the first ``end``);
    ``path``: its JSON pointer in the request (``#/structural_tags/0``), for errors."""

    begin: str
    end: str
    content: Grammar | None
    then: str = "text"
    path: str = "#"


def free_text(stops: list[str] | list[bytes]) -> Expr:
    """UTF-8 text in which no string of ``stops`` occurs."""
    if not stops:
        return TEXT
    return difference(TEXT, seq(TEXT, alt(*(lit(s) for s in stops)), TEXT))


def through_first(t: str, stops: list[str]) -> Expr:
    """Text that ends with ``t`` and holds no string of ``stops`` ending earlier: the free
    text up to and including the first trigger (``t`` must be one of ``stops``)."""
    return difference(seq(TEXT, lit(t)), seq(TEXT, alt(*(lit(s) for s in stops)), plus(ANY_CHAR)))


def embed(rules: dict[str, Expr], sub: Grammar, prefix: str) -> Expr:
    """Add ``sub``'s rules to ``rules`` as ``prefix + name``; returns a reference to its start."""
    names = {n: prefix + n for n in sub.rules}
    memo: dict[int, Expr] = {}
    for n, e in sub.rules.items():
        rules[names[n]] = rename_refs(e, names, memo)
    return Ref(names[sub.start])


def check_markers(name: str, text: object, path: str) -> str:
    if not isinstance(text, str) or not text:
        raise ConstraintError(f"{name} must be a non-empty str, got {text!r}", path=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConstraintError(f"{name} holds a lone surrogate, which is not valid UTF-8", path=path) from None
    return text


def check_triggers(triggers: list[str], tags: list[Tag]) -> None:
    """Refuse a trigger that can never occur or begins no tag, and a tag no trigger begins."""
    for j, t in enumerate(triggers):
        where = f"#/triggers/{j}"
        check_markers("a trigger", t, where)
        if t in triggers[:j]:
            raise ConstraintError(f"trigger {t!r} is given twice", path=where)
        for u in triggers:
            if u != t and u in t:
                raise ConstraintError(
                    f"trigger {t!r} can never occur: trigger {u!r} occurs inside it and starts a "
                    "segment first (triggers must not hold one another)",
                    path=where,
                )
        if not any(tag.begin.startswith(t) for tag in tags):
            begins = ", ".join(repr(tag.begin) for tag in tags)
            raise ConstraintError(f"trigger {t!r} begins no tag (tag begins: {begins})", path=where)
    for tag in tags:
        if not any(tag.begin.startswith(t) for t in triggers):
            raise ConstraintError(
                f"tag begin {tag.begin!r} starts with no trigger ({', '.join(map(repr, triggers))}): "
                "the segment could never be entered",
                path=f"{tag.path}/begin",
            )


def tags_grammar(
    tags: list[Tag], triggers: list[str] | None = None, min_segments: int = 0, max_segments: int | None = None
) -> Grammar:
    """The grammar of free text with the tagged segments of ``tags`` (see the module's
    docstring); ``triggers`` default to the tags' ``begin`` strings."""
    if not tags:
        raise ConstraintError("structural tags need at least one tag", path="#/structural_tags")
    if triggers is None:
        triggers = list(dict.fromkeys(tag.begin for tag in tags))
    if not isinstance(triggers, list) or not triggers:
        raise ConstraintError("triggers must be a non-empty list of strings", path="#/triggers")
    if not isinstance(min_segments, int) or isinstance(min_segments, bool) or min_segments < 0:
        raise ConstraintError(
            f"min_segments must be an int >= 0, got {min_segments!r}", path="#/min_segments"
        )
    if max_segments is not None and (
        not isinstance(max_segments, int)
        or isinstance(max_segments, bool)
        or max_segments < max(1, min_segments)
    ):
        raise ConstraintError(
            f"max_segments must be None or an int >= max(1, min_segments), got {max_segments!r}",
            path="#/max_segments",
        )
    check_triggers(triggers, tags)
    rules: dict[str, Expr] = {}
    notes: list[str] = []
    specials: set[int] = set()
    by_trigger: dict[str, tuple[list[Expr], list[Expr]]] = {t: ([], []) for t in triggers}
    for i, tag in enumerate(tags):
        t = next(t for t in triggers if tag.begin.startswith(t))  # one only (check_triggers)
        body = content_expr(rules, tag, f"tag{i}:", notes, specials)
        seg = seq(lit(tag.begin[len(t) :]), body, lit(tag.end))
        by_trigger[t][0 if tag.then == "text" else 1].append(seg)
    go_on = alt(*(seq(through_first(t, triggers), alt(*segs)) for t, (segs, _) in by_trigger.items() if segs))
    last = alt(*(seq(through_first(t, triggers), alt(*segs)) for t, (_, segs) in by_trigger.items() if segs))
    text = free_text(triggers)
    hi = max_segments
    start = seq(rep(go_on, min_segments, hi), text)
    if any(segs for _, segs in by_trigger.values()):
        start = alt(start, seq(rep(go_on, max(min_segments - 1, 0), None if hi is None else hi - 1), last))
    rules["start"] = start
    g = Grammar(rules=rules, start="start", notes=notes, specials=tuple(sorted(specials)))
    if any(tag.content is not None and tag.content.fallback is not None for tag in tags):
        # (a segment's JSON keys in any order: where the check cannot be kept, every such
        # segment in schema order, as its notes say)
        def fallback() -> Grammar:
            return tags_grammar([_fallen(tag) for tag in tags], triggers, min_segments, max_segments)

        g.fallback = fallback
    return g


def _fallen(tag: Tag) -> Tag:
    """``tag`` with its content's fallback grammar (keys in schema order), if it has one."""
    if tag.content is None or tag.content.fallback is None:
        return tag
    return Tag(tag.begin, tag.end, tag.content.fallback(), tag.then, tag.path)


def content_expr(rules: dict[str, Expr], tag: Tag, prefix: str, notes: list[str], specials: set[int]) -> Expr:
    """A tag's content as IR (its sub-grammar's rules added to ``rules``)."""
    if tag.content is None:
        return free_text([tag.end])
    sub = tag.content
    if sub.unique:
        raise ConstraintError(
            "uniqueItems checked at run time is not supported inside a tagged segment or after a "
            "reasoning block (only uniqueItems the grammar can express: enums, consts, booleans)",
            path=tag.path,
        )
    notes.extend(f"{n} (in {tag.path})" for n in sub.notes)
    specials.update(sub.specials)
    return embed(rules, sub, prefix)


def check_then(then: object, path: str) -> str:
    if then not in THEN:
        raise ConstraintError(f"then must be 'text' or 'end', got {then!r}", path=path)
    return then  # type: ignore[return-value]


def reasoning_grammar(begin: str | bytes, end: str | bytes, after: Grammar | None) -> Grammar:
    """``begin`` (may be empty: the block was opened by the prompt), text without ``end``,
    ``end``, then ``after`` (None: any text). A marker given as bytes is taken as it is (a
    special token's :func:`~..ir.special_bytes`)."""
    if isinstance(end, str):
        end = check_markers("the reasoning end marker", end, "#/reasoning/1").encode("utf-8")
    if isinstance(begin, str):
        begin = (
            check_markers("the reasoning begin marker", begin, "#/reasoning/0") if begin else ""
        ).encode()
    if not end:
        raise ConstraintError("the reasoning end marker must not be empty", path="#/reasoning/1")
    if begin and any(begin.endswith(end[:k]) for k in range(1, len(end) + 1)):
        raise ConstraintError(
            f"reasoning markers overlap: begin {begin!r} ends with the start of end {end!r}",
            path="#/reasoning",
        )
    rules: dict[str, Expr] = {}
    notes: list[str] = []
    specials: set[int] = {i for m in (begin, end) if (i := special_id(m)) is not None and len(m) == 5}
    tail: Expr = TEXT
    if after is not None:
        tail = content_expr(rules, Tag("", "", after, path="#"), "after:", notes, specials)
    inside = free_text([end]) if special_id(end) is None else TEXT  # (text never holds a special token)
    rules["start"] = seq(lit(begin) if begin else EMPTY, inside, lit(end), tail)
    g = Grammar(rules=rules, start="start", notes=notes, specials=tuple(sorted(specials)))
    if after is not None and after.fallback is not None:  # (see tags_grammar)
        g.fallback = lambda: reasoning_grammar(begin, end, after.fallback())
    return g
