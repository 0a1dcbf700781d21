"""Regex front end, randomized: seeded random regexes x random strings, IR == re.fullmatch.

Both directions: random strings over an alphabet chosen to hit the constructs (ASCII,
multi-byte, astral, case-folding specials) check that the IR rejects what ``re`` rejects
and accepts what it accepts; strings sampled from the IR check that everything the IR
generates is matched by ``re``.
"""

from __future__ import annotations

import random
import re

import pytest

from deepinfer.constraints.frontends.regex import regex_to_ir
from tests.constraints.test_regex_oracle import ir_accepts, ir_sample

ALPHABET = [
    "a",
    "b",
    "A",
    "k",
    "K",
    "\u212a",
    "s",
    "ſ",
    "1",
    "٣",
    "_",
    " ",
    "\n",
    "-",
    "é",
    "É",
    "€",
    "😀",
    "\U00010428",
]
ATOMS = [
    "a",
    "b",
    "k",
    "s",
    "é",
    "😀",
    "€",
    r"\d",
    r"\w",
    r"\s",
    r"\D",
    r"\W",
    r"\S",
    ".",
    "[ab]",
    "[^a]",
    "[a-k]",
    "[^a-z]",
    r"[\d_]",
    r"[^\w\s]",
    "[é-😀]",
    r"\u00e9",
    r"\x41",
    r"\-",
]
QUANTS = ["?", "*", "+", "{2}", "{1,2}", "{0,3}", "{2,}", "??", "*?", "+?", "{1,2}?"]
FLAG_PREFIXES = ["", "", "", "(?i)", "(?s)", "(?a)", "(?ia)"]


def random_regex(rng: random.Random, depth: int = 0) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.2 and depth < 2:
            inner = "|".join(random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            atom = rng.choice(["(", "(?:", f"(?P<g{rng.randint(0, 10**6)}>", "(?i:", "(?-i:"]) + inner + ")"
        else:
            atom = rng.choice(ATOMS)
        if rng.random() < 0.35:
            atom += rng.choice(QUANTS)
        parts.append(atom)
    body = "".join(parts)
    if depth == 0:
        if rng.random() < 0.15:
            body = "^" + body
        if rng.random() < 0.15:
            body += rng.choice(["$", r"\Z"])
    return body


def _cases(seed: int, n_regex: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    out = []
    while len(out) < n_regex:
        pattern = rng.choice(FLAG_PREFIXES) + random_regex(rng)
        try:
            re.compile(pattern)
        except re.error:
            continue
        strings = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 5))) for _ in range(25)]
        out.append((pattern, strings))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_regex_random_strings_agree_with_re(seed: int) -> None:
    for pattern, strings in _cases(seed, 40):
        expr = regex_to_ir(pattern)
        for s in strings:
            assert ir_accepts(expr, s.encode()) is bool(re.fullmatch(pattern, s)), (pattern, s)


@pytest.mark.parametrize("seed", range(8))
def test_regex_random_samples_are_matched_by_re(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for pattern, _ in _cases(seed, 40):
        expr = regex_to_ir(pattern)
        for _ in range(10):
            data = ir_sample(expr, rng)
            if data is None:
                continue
            text = data.decode("utf-8")  # the IR only generates valid UTF-8
            assert re.fullmatch(pattern, text), (pattern, text)
