"""Regex front end: the Unicode tables and case-insensitive sets equal what ``re`` does,
checked over every code point."""

from __future__ import annotations

import re
import unicodedata

import pytest

from deepinfer.constraints.frontends import regex_classes as rx

ALL_TEXT = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))


def _matched(pattern: str, flags: int = 0) -> tuple[tuple[int, int], ...]:
    """Runs of code points (surrogates excluded) that ``pattern`` matches as one char."""
    runs = []
    for m in re.finditer(f"(?:{pattern})+", ALL_TEXT, flags):
        lo, hi = m.start(), m.end() - 1  # indices; code point = index (+0x800 past the gap)
        if lo < 0xD800 <= hi:
            runs += [(lo, 0xD7FF), (0xE000, hi + 0x800)]
        else:
            runs.append((lo, hi) if hi < 0xD800 else (lo + 0x800, hi + 0x800))
    return rx._merge(runs)


def _ranges_of(op_av_pattern: str, flags: int) -> tuple[tuple[int, int], ...]:
    tree = rx._sre_parse.parse(op_av_pattern, flags)
    ((op, av),) = list(tree)
    fl = tree.state.flags
    ranges = rx._icase_ranges(op, av, fl) if fl & re.I else rx.plain_ranges(op, av, fl)
    return rx._subtract(ranges, ((0xD800, 0xDFFF),))


def test_regex_precomputed_tables_match_this_python() -> None:
    if unicodedata.unidata_version != rx._TABLES_UNIDATA:
        pytest.skip("tables are recomputed at run time for this Unicode version")
    assert rx._decode_tables(rx._TABLES_BLOB) == rx._compute_tables()


# single-character patterns whose set is compared with re over all code points
CHAR_PATTERNS = [
    (r"\d", 0),
    (r"\w", 0),
    (r"\s", 0),
    (r"\W", 0),
    (r"[^\d\s]", 0),
    (r"\w", re.A),
    (r"[^\s]", re.A),
    ("k", re.I),
    ("s", re.I),
    ("i", re.I),
    ("σ", re.I),
    ("\U00010400", re.I),
    ("[a-z]", re.I),
    ("[^a-z]", re.I),
    (r"[\w]", re.I),
    (r"[^\W\d_]", re.I),
    ("[A-Za-z]", re.I | re.A),
    ("[\u0100-\u024f]", re.I),
    ("[\U00010400-\U0001044f]", re.I),
    ("[^k]", re.I),
    (".", re.I),
]


@pytest.mark.parametrize("pattern,flags", CHAR_PATTERNS)
def test_regex_char_set_equals_re_over_all_code_points(pattern: str, flags: int) -> None:
    assert _ranges_of(pattern, flags) == _matched(pattern, flags)
