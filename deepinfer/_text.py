"""Small text helpers shared by the engine's input checks."""

from __future__ import annotations


def clip_repr(x: object, n: int = 80) -> str:
    """``repr(x)``, cut to ``n`` characters (an error message quotes bad input, never all of it)."""
    r = repr(x)
    return r if len(r) <= n else r[: n - 3] + "..."


def lone_surrogate(text: str) -> int | None:
    """Index of the first lone surrogate in ``text`` (not encodable as UTF-8), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None
