"""The grammars shipped in ``deepinfer.grammars``: each loads, compiles, accepts its valid
samples and rejects its invalid ones (verdicts checked against lark's own parser first),
and seeded random walks over allowed tokens end in texts that lark parses."""

from __future__ import annotations

import collections
import functools
import json
import random

import pytest

lark = pytest.importorskip("lark")

from deepinfer import grammars  # noqa: E402
from deepinfer.constraints.frontends.lark import lark_to_grammar  # noqa: E402

NAMES = ["arithmetic", "csv", "json", "sql", "tool_call", "yaml"]

YAML_DOC = """name: demo
version: 1.2
tags: [web, "api v2"]
server:
  port: 8080
  debug: false
  hosts:
    - alpha.example.com
    - beta
  limits:
    cpu: 0.5
    memory: 512Mi
"""
YAML_LIST = "- id: 1\n  ok: true\n  note: first one\n- id: 2\n  ok: null\n- plain item\n"

# grammar: (valid texts, invalid texts)
SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "json": (
        [
            '{"a": 1, "b": [true, false, null], "c": {"d": "x\\n\\u00e9"}}',
            "[]",
            "{}",
            "-0.5e+3",
            '"日本 😀"',
            '{\n  "a": [\n    1,\n    2\n  ],\n  "b": {}\n}',
            '[{"k":[[],[{}]]}]',
        ],
        [
            '{"a": 1,}',
            "[01]",
            "{'a': 1}",
            '"a\nb"',
            " {}",
            '{"a":' + " " * 17 + "1}",
            "tru",
            "NaN",
            '{"a" 1}',
        ],
    ),
    "arithmetic": (
        ["1+2*3", "-(4 - 2.5) / 3", " (1) ", "((1+2))*(3)", "2*-3", "10 / 2 - 1", "--1", "0.25"],
        ["1+", "(1", "1 ++ 2", "01", "1..2", "a+1", "1    + 2", "()", "1 2"],
    ),
    "sql": (
        [
            "SELECT * FROM users;",
            "SELECT name, age FROM users WHERE age >= 18 AND country = 'FR' ORDER BY age DESC LIMIT 10;",
            "select u.name AS n, COUNT(*) from users u where u.id IS NOT NULL "
            "or (a<b and c <> 'it''s') order by n, age asc limit 5;",
            "SELECT id\nFROM t\nWHERE x = -1.5;",
            "SELECT MAX(price) AS top FROM items AS i;",
        ],
        [
            "SELECT FROM users;",
            "SELECT * FROM users",
            "SELECT * FROM users WHERE age;",
            "SELECT * FROM users LIMIT -1;",
            "SELECT * users;",
            "SELECT * FROM users ORDER age;",
            'SELECT * FROM users WHERE name = "x";',
            "SELECT *, FROM t;",
        ],
    ),
    "csv": (
        [
            "name,age\nalice,30\nbob,25\n",
            'a,b\r\n"x, y","say ""hi"""\r\n',
            "a\n",
            "a,b,c\n1,,3",
            '"multi\nline",x\n1,2',
        ],
        ['a,"b\n', 'a,b"c"\n', '"a"b,c', 'a,"b""\n'],
    ),
    "tool_call": (
        [
            '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
            '<tool_call>\n{"name": "search", "arguments": {"q": "lark", "f": {"year": [2023, 2024]}}}'
            "\n</tool_call>",
            '<tool_call>\n{"name": "a.b-c", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name":"f","arguments":{"x":null}}\n</tool_call>',
            '{"name":"f","arguments":{}}',
        ],
        [
            '{"name": "get weather", "arguments": {}}',
            '{"arguments": {}, "name": "f"}',
            '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
            '{"name": "f", "arguments": []}',
            '{"name": "f", "arguments": {}}\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
            '{"name": "f", "arguments": {"a": 1,}}',
        ],
    ),
    "yaml": (
        [YAML_DOC, YAML_LIST, 'title: "Hello: world"', "a: [1, 2]\nb: []", "k:\n  - x\n  - 'y'\n"],
        [
            "server:\n   port: 1",
            "key:value",
            "a:\tb",
            "a: b\n    c: d",
            "a:\n  b:\n    c:\n      d: 1",
            "- x\n - y",
            "a: [1,2]",
        ],
    ),
}

CASES = [
    pytest.param(name, text, ok, id=f"{name}-{'valid' if ok else 'invalid'}-{i}")
    for name, (valid, invalid) in SAMPLES.items()
    for ok, texts in ((True, valid), (False, invalid))
    for i, text in enumerate(texts)
]


@functools.cache
def lark_parser(text: str, start: str = "start"):
    from lark.load_grammar import FromPackageLoader

    loader = FromPackageLoader("deepinfer.grammars", ("",))
    return lark.Lark(text, parser="earley", lexer="dynamic_complete", start=start, import_paths=[loader])


def lark_accepts(grammar_text: str, text: str) -> bool:
    try:
        lark_parser(grammar_text).parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@functools.cache
def automaton(name: str):
    from deepinfer.constraints.automaton import compile_grammar

    return compile_grammar(lark_to_grammar(grammars.load(name)))


# ----------------------------------------------------------------------------- loader


def test_available_lists_the_packaged_grammars():
    assert grammars.available() == NAMES


def test_load_by_name_path_and_errors(tmp_path):
    assert grammars.load("sql") == grammars.load("sql.lark")
    assert "start" in grammars.load("json")
    f = tmp_path / "mine.lark"
    f.write_text('start: "x"')
    assert grammars.load(str(f)) == 'start: "x"'
    with pytest.raises(ValueError, match=r"Unknown grammar 'nope': not a packaged grammar \(arithmetic, csv"):
        grammars.load("nope")


# ------------------------------------------------------------------------------ samples


@pytest.mark.parametrize("name", NAMES)
def test_grammar_loads_and_compiles(name):
    text = grammars.load(name)
    lark_parser(text)  # lark itself accepts the file
    g = lark_to_grammar(text)
    assert g.start == "start" and "start" in g.rules
    assert not g.notes  # no unbounded %ignore in a packaged grammar
    automaton(name)


@pytest.mark.parametrize(("name", "text", "ok"), CASES)
def test_sample_agrees_with_lark(name, text, ok):
    assert lark_accepts(grammars.load(name), text) == ok


@pytest.mark.parametrize(("name", "text", "ok"), CASES)
def test_sample_accepted_by_automaton(name, text, ok):
    assert automaton(name).accepts(text.encode("utf-8")) == ok


def test_valid_json_samples_are_json():
    for text in SAMPLES["json"][0]:
        json.loads(text)
    for text in SAMPLES["tool_call"][0]:
        for part in text.replace("<tool_call>", "").split("</tool_call>"):
            if part.strip():
                call = json.loads(part)
                assert set(call) == {"name", "arguments"} and isinstance(call["arguments"], dict)


def test_valid_yaml_samples_are_yaml():
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(YAML_DOC)
    assert doc["server"]["hosts"] == ["alpha.example.com", "beta"]
    assert doc["tags"] == ["web", "api v2"]
    assert yaml.safe_load(YAML_LIST)[0] == {"id": 1, "ok": True, "note": "first one"}
    for text in SAMPLES["yaml"][0]:
        yaml.safe_load(text)


def test_import_a_packaged_grammar():
    g = '%import json.value\nstart: "data=" value'
    from deepinfer.constraints.automaton import compile_grammar

    a = compile_grammar(lark_to_grammar(g))
    assert a.accepts(b'data={"a": [1]}') and not a.accepts(b"data={")
    assert lark_accepts(g, 'data={"a": [1]}')


# --------------------------------------------------------------------------- random walks


def _complete(a, cfg, rng: random.Random, max_nodes: int = 20_000) -> bytes | None:
    """Shortest bytes from ``cfg`` to a configuration that may end (BFS; ties random)."""
    if a.can_end(cfg):
        return b""
    seen = {cfg}
    queue = collections.deque([(cfg, b"")])
    while queue and len(seen) < max_nodes:
        c, path = queue.popleft()
        nb = a.next_bytes(c)
        rng.shuffle(nb)
        for b in nb:
            n = a.step_byte(c, b)
            if n is None or n in seen:
                continue
            if a.can_end(n):
                return path + bytes([b])
            seen.add(n)
            queue.append((n, path + bytes([b])))
    return None


WALKS_PER_GRAMMAR = 6


@pytest.mark.parametrize("name", NAMES)
def test_random_walks_parse_with_lark(name):
    """Walk random allowed tokens of a small vocabulary through the token-level matcher,
    close the text with the shortest completion, and check lark parses the result."""
    from deepinfer.constraints import Compiler, Matcher

    from .vocabs import small_vocab

    vocab = small_vocab()
    compiled = Compiler(vocab).grammar(grammars.load(name))
    a = compiled.automaton
    grammar_text = grammars.load(name)
    rng = random.Random(f"walk-{name}")
    eos = set(vocab.eos_ids)
    for walk in range(WALKS_PER_GRAMMAR):
        m = Matcher(compiled)
        out = bytearray()
        for _ in range(rng.randint(5, 40)):
            allowed = [int(t) for t in m.allowed_tokens() if int(t) not in eos]
            if not allowed:
                break
            tok = rng.choice(allowed)
            assert m.accept(tok)
            out += vocab.token_bytes[tok]
        tail = _complete(a, m.state, rng)
        assert tail is not None, f"walk {walk} of {name}: no completion from {bytes(out)!r}"
        assert m.accept_bytes(tail) or not tail
        assert m.can_end()
        text = (bytes(out) + tail).decode("utf-8")
        assert lark_accepts(grammar_text, text), f"walk {walk} of {name}: lark rejects {text!r}"
