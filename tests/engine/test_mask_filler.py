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
