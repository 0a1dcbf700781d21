"""Grammars shipped with DeepInfer, in Lark's EBNF syntax (and a few in llama.cpp's GBNF:
``person.gbnf``, ``arithmetic.gbnf``, loaded by their file names).

``load("json")`` returns a packaged grammar's text (``available()`` lists the names);
``load("path/to/my.lark")`` reads a file. Grammars can ``%import`` each other by name
(``%import json (object, _WS)``) when compiled by :mod:`deepinfer.constraints.ebnf`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["available", "load"]


def available() -> list[str]:
    """Names of the packaged grammars, sorted (``["arithmetic", "csv", "json", ...]``)."""
    return sorted(p.name[: -len(".lark")] for p in files(__name__).iterdir() if p.name.endswith(".lark"))


def load(name_or_path: str) -> str:
    """The text of a packaged grammar (by name, e.g. ``"sql"``; a GBNF one by its file name,
    ``"arithmetic.gbnf"``) or of a ``.lark`` / ``.gbnf`` file.

    Raises
    ------
    ValueError
        When ``name_or_path`` is neither a packaged grammar nor an existing file.
    """
    names = available()
    path = Path(name_or_path)
    if name_or_path not in names and path.is_file():  # a file wins over "x.lark" -> "x"
        return path.read_text(encoding="utf-8")
    if name_or_path.endswith(".gbnf") and files(__name__).joinpath(name_or_path).is_file():
        return files(__name__).joinpath(name_or_path).read_text(encoding="utf-8")  # a packaged GBNF grammar
    name = name_or_path.removesuffix(".lark")
    if name in names:
        return files(__name__).joinpath(name + ".lark").read_text(encoding="utf-8")
    raise ValueError(
        f"Unknown grammar {name_or_path!r}: not a packaged grammar ({', '.join(available())}) "
        "and not an existing file"
    )
