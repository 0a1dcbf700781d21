"""MaskFiller: the worker-thread mode (CPU) and the inline mode (CUDA) write the same rows."""

from __future__ import annotations

import numpy as np

from deepinfer.constraints import Compiler, Matcher
from deepinfer.constraints.ir import Grammar, byte_range, lit, plus, seq
from deepinfer.sampling_params import SamplingParams
from deepinfer.sequence import Sequence
from deepinfer.structured import MaskFiller

from ..constraints.vocabs import small_vocab


def _seqs():
    vocab = small_vocab()
    compiled = Compiler(vocab).from_ir(
        Grammar({"start": seq(lit('{"n":'), plus(byte_range(48, 57)), lit("}"))})
    )
    out = []
    for i in range(5):
        s = Sequence(i, None, [3, 4], SamplingParams(max_tokens=8), seed=i, eos_token_ids=(1,), max_len=64)
        if i != 2:  # one unconstrained row in the batch
            s.constraint = Matcher(compiled)
            for t in [b'{"', b"n", b'":', b"1"][:i]:
                assert s.constraint.accept(vocab.token_bytes.index(t))
        out.append(s)
    return out, vocab


def test_thread_and_inline_modes_fill_the_same_rows():
    seqs, vocab = _seqs()
    results = []
    for inline in (False, True):
        filler = MaskFiller(vocab.vocab_size, pin=False, inline=inline)
        filler.start(seqs).launched()
        host, constrained = filler.wait()
        assert constrained == [0, 1, 3, 4]
        results.append(host.numpy().copy())
        for i in constrained:
            np.testing.assert_array_equal(
                results[-1][i, : len(seqs[i].constraint.mask_row())], seqs[i].constraint.mask_row()
            )
        assert filler.steps == 1 and filler.mask_seconds > 0
    np.testing.assert_array_equal(results[0][[0, 1, 3, 4]], results[1][[0, 1, 3, 4]])


def test_no_constrained_rows_means_no_mask():
    seqs, vocab = _seqs()
    for s in seqs:
        s.constraint = None
    for inline in (False, True):
        filler = MaskFiller(vocab.vocab_size, pin=False, inline=inline)
        assert filler.start(seqs).wait() == (None, [])


def test_empty_mask_error_names_unique_items():
    """A request whose mask went empty because every allowed token repeats an earlier array item
    fails with an error that says so."""
    vocab = small_vocab()
    compiled = Compiler(vocab).json_schema(
        {"type": "array", "uniqueItems": True, "items": {"type": "object"}}, whitespace="compact"
    )
    s = Sequence(0, None, [3, 4], SamplingParams(max_tokens=8), seed=0, eos_token_ids=(1,), max_len=64)
    s.constraint = Matcher(compiled)
    assert s.constraint.accept_bytes(b'[{"a":1},{"a":1}')

    class _Tok:
        def decode(self, ids, skip_special_tokens=True):
            return ""

    s.on_token(-1, _Tok())
    assert s.finish_reason == "error" and "empty mask" in s.error and "uniqueItems" in s.error


def _reference_rows(seqs, width: int) -> tuple[np.ndarray, list[int]]:
    """Every constrained row written afresh (``Sequence.fill_bitmask``): what a filler's
    buffer must hold for those rows."""
    rows = np.zeros((len(seqs), width), dtype=np.int32)
    return rows, [i for i, s in enumerate(seqs) if s.fill_bitmask(rows[i])]


def test_a_row_is_written_only_when_its_mask_changes():
    """A sequence whose matcher gives the same row again (the digits' loop here) leaves its row
    of the buffer as it is; a row whose mask changed is written again."""
    for inline in (False, True):
        seqs, vocab = _seqs()
        filler = MaskFiller(vocab.vocab_size, pin=False, inline=inline)
        host, constrained = filler.start(seqs).wait()
        rows = host.numpy()
        rows[4, 0] ^= 0x5A5A  # seqs[4] is in the digits' loop: another digit keeps its row
        rows[1, 0] ^= 0x5A5A  # seqs[1] (after '{"') moves on to the key's next byte
        assert seqs[4].constraint.accept(vocab.token_bytes.index(b"7"))
        assert seqs[1].constraint.accept(vocab.token_bytes.index(b"n"))
        host, constrained = filler.start(seqs).wait()
        rows = host.numpy()
        assert rows[4, 0] == seqs[4].constraint.mask_row()[0] ^ 0x5A5A  # not written
        want = seqs[1].constraint.mask_row()
        np.testing.assert_array_equal(rows[1, : len(want)], want)


def test_rows_equal_a_fresh_fill_over_random_batches():
    """Batches of changing size and order, matchers moving on, a matcher that fails: every
    constrained row of the buffer equals a fresh fill of it, in both modes."""
    import random

    rng = random.Random(0)
    vocab = small_vocab()
    compiled = Compiler(vocab).from_ir(
        Grammar({"start": seq(lit('{"n":'), plus(byte_range(48, 57)), lit("}"))})
    )
    text = b'{"n":' + b"0123456789" * 3 + b"}"
    pool = []
    for i in range(12):
        s = Sequence(i, None, [3, 4], SamplingParams(max_tokens=8), seed=i, eos_token_ids=(1,), max_len=64)
        s.constraint = Matcher(compiled) if i % 5 else None
        pool.append(s)

    class Broken:  # a matcher that fails to give a mask
        def mask_row(self):
            raise RuntimeError("no row")

    broken = Sequence(99, None, [3], SamplingParams(max_tokens=8), seed=0, eos_token_ids=(1,), max_len=64)
    broken.constraint = Broken()
    width = (vocab.vocab_size + 31) // 32
    for inline in (False, True):
        filler = MaskFiller(vocab.vocab_size, pin=False, inline=inline)
        for _ in range(300):
            seqs = rng.sample(pool, rng.randint(1, len(pool)))
            if rng.random() < 0.1:
                seqs.insert(rng.randrange(len(seqs) + 1), broken)
            host, constrained = filler.start(seqs).wait()
            want, want_rows = _reference_rows(seqs, width)
            assert constrained == want_rows
            if constrained:
                np.testing.assert_array_equal(host.numpy()[constrained], want[constrained])
            else:
                assert host is None
            for s in seqs:  # some matchers move on by a byte of the text (or start again)
                m = s.constraint
                if isinstance(m, Matcher) and rng.random() < 0.5:
                    n = m.num_accepted()
                    if n == len(text) or not m.accept_bytes(text[n : n + 1]):
                        m.reset()
