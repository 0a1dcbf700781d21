"""Errors raised by the constraint compiler.

Every error names what is wrong and where: a JSON pointer into the schema, a line and
column in a grammar, or a character position in a regex. The compiler raises nothing
else: whatever the input, a constraint compiles or raises :class:`ConstraintError`.
"""

from __future__ import annotations


class ConstraintError(ValueError):
    """A constraint that cannot be compiled (bad input or an unsupported feature).

    Attributes
    ----------
    message:
        The message without its location.
    path:
        JSON pointer of the offending schema node (``"#/properties/age"``), or None.
    line, column:
        1-based position in a grammar text, or None.
    position:
        0-based character offset in a regex, or None.
    rule:
        The grammar rule being compiled when the automaton stage refused it (the compiler
        turns it into a location), or None.
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
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        self.position = position
        self.rule: str | None = None

    @property
    def located(self) -> bool:
        """Does the error name a location (pointer, line or position)?"""
        return self.path is not None or self.line is not None or self.position is not None

    def at(
        self,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        position: int | None = None,
    ) -> ConstraintError:
        """This error (same class, message and attributes) with the location given, where it
        names none yet; itself where it does."""
        if self.located:
            return self
        new = ConstraintError.__new__(type(self))
        ConstraintError.__init__(new, self.message, path=path, line=line, column=column, position=position)
        for k, v in self.__dict__.items():
            if k not in ("message", "path", "line", "column", "position"):
                new.__dict__[k] = v
        return new


class ConstraintTooComplex(ConstraintError):
    """A constraint past one of the compiler's bounds: size, nesting, states or time.

    ``bound`` names the bound (a field of :class:`~.automaton.nfa.Limits` or a constant of
    the front end, such as ``"max_properties"``), where known.
    """

    def __init__(self, message: str, *, bound: str | None = None, **where) -> None:
        super().__init__(message, **where)
        self.bound = bound


def is_recursion_error(e: BaseException) -> bool:
    """Python's recursion limit, raised as it is or as the panic of a Rust extension whose
    callback hit it (``pyo3_runtime.PanicException``, a BaseException: jsonschema's
    ``referencing`` uses one)."""
    return isinstance(e, RecursionError) or (
        type(e).__name__ == "PanicException" and "RecursionError" in str(e)
    )


def is_interrupt(e: BaseException) -> bool:
    """An exception that must pass through the compiler untouched (Ctrl-C, exit)."""
    return isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))
