"""Errors raised by the constraint compiler.

Every error names what is wrong and where: a JSON pointer into the schema, a line and
column in a grammar, or a character position in a regex.
"""

from __future__ import annotations


class ConstraintError(ValueError):
    """A constraint that cannot be compiled (bad input or an unsupported feature).

    Attributes
    ----------
    path:
        JSON pointer of the offending schema node (``"#/properties/age"``), or None.
    line, column:
        1-based position in a grammar text, or None.
    position:
        0-based character offset in a regex, or None.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        position: int | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(f"at {path}")
        if line is not None:
            where.append(f"line {line}" + (f", column {column}" if column is not None else ""))
        if position is not None:
            where.append(f"position {position}")
        full = message if not where else f"{message} ({'; '.join(where)})"
        super().__init__(full)
        self.path = path
        self.line = line
        self.column = column
        self.position = position


class ConstraintTooComplex(ConstraintError):
    """A constraint whose automaton would exceed a state, memory or time bound."""
