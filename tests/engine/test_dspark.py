"""DSpark end to end: outputs are identical with and without speculation (greedy and seeded
sampling, JSON Schema / regex / grammar / unconstrained) on the embedded model in float32 and on
a tiny random model; rollback leaves matchers as they were; deterministic mode (verify is
decode bit for bit, so DSpark stays on); warm-up before the first step (CUDA); the draft
sources, the scheduler and the settings."""

from __future__ import annotations

import random

import numpy as np
import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.cuda_graphs import t_bucket
from deepinfer.dspark import DSpark, DSparkConfig
from deepinfer.dspark import dspark as dspark_mod
from deepinfer.dspark.drafts import (
    FEW_ENDS,
    FORCED,
    K_COPY2,
    K_COPY_NEXT,
    K_FORCED,
    NGRAM,
    NgramIndex,
    propose,
)
from deepinfer.dspark.policy import CostModel, RequestStats, SourceStats, choose_positions
from deepinfer.dspark.verify import fill_position_masks

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome", "Madrid"]},
    },
    "required": ["name", "age", "tags", "city"],
    "additionalProperties": False,
}
# (user message, constraint): the seeded prompt set; extraction prompts hold what they ask for
PROMPTS = [
    (
        "Alice Smith is 31 years old and lives in Paris; she likes chess and tea. Record as JSON.",
        dict(json_schema=SCHEMA),
    ),
    (
        "Carla Rossi (age 27) from Rome enjoys opera, pasta and football. Record as JSON.",
        dict(json_schema=SCHEMA),
    ),
    ("When did the French revolution start? Answer as YYYY-MM-DD.", dict(regex=r"\d{4}-\d{2}-\d{2}")),
    ("Write a SQL query selecting name and age from the users table where age > 30.", dict(grammar="sql")),
    (
        "Repeat after me: the quick brown fox jumps over the lazy dog. "
        "the quick brown fox jumps over the lazy dog.",
        dict(speculative=True),
    ),
]
MODES = [False, True, {"schedule": "fixed"}]  # off, confidence-scheduled, verify every draft found


@pytest.fixture(scope="module")
def llm(embedded_gguf_path):
    # float32: the multi-position verify forward rounds like the one-token decode to ~5e-5
    return LLM(None, dtype="float32", device="cpu", seed=0)


def _chat(llm, mode, temperature, max_tokens=80):
    llm.dspark = DSpark(mode)
    params = [SamplingParams(temperature=temperature, top_p=0.9, seed=11 + i, max_tokens=max_tokens, **c)
              for i, (_, c) in enumerate(PROMPTS)]  # fmt: skip
    outs = llm.chat([[{"role": "user", "content": m}] for m, _ in PROMPTS], params, use_tqdm=False)
    return outs, llm.dspark.stats


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_embedded_outputs_identical_with_and_without_dspark(llm, temperature):
    base, _ = _chat(llm, False, temperature)
    assert base[0].parsed is not None and base[2].error is None  # the set produces valid outputs
    for mode in MODES[1:] if temperature == 0 else MODES[2:]:
        outs, st = _chat(llm, mode, temperature)
        for b, o in zip(base, outs):
            assert o.token_ids == b.token_ids, (mode, b.text, o.text)
            assert o.text == b.text and o.finish_reason == b.finish_reason
        assert st.verify_steps > 0 and sum(st.accepted) > 0, st  # speculation ran and paid
        assert st.accepted[FORCED] > 0 and st.accepted[NGRAM] > 0, st  # both sources


@pytest.mark.slow
def test_rollback_leaves_matcher_exactly_as_before(llm):
    compiled = llm.structured.compile(SamplingParams(json_schema=SCHEMA))
    m = llm.structured.matcher(compiled)
    for t in llm.tokenizer.encode('{"name":"Al', add_special_tokens=False):
        assert m.accept(t)
    before = (m.mask_row().copy(), m.num_accepted(), m.state, m.is_terminated())
    drafts = llm.tokenizer.encode('ice","age":3', add_special_tokens=False)
    W = compiled.n_words
    rows = np.zeros((len(drafts) + 1, W), dtype=np.int32)
    fill_position_masks(m, drafts, rows)
    after = (m.mask_row().copy(), m.num_accepted(), m.state, m.is_terminated())
    assert np.array_equal(before[0], after[0]) and before[1:] == after[1:]
    walk = m.copy()  # each position's row is the mask after the drafts before it
    for j, t in enumerate(drafts, 1):
        assert walk.accept(t)
        assert np.array_equal(rows[j], walk.mask_row()), j
    bad = [
        drafts[0],
        llm.tokenizer.encode("}", add_special_tokens=False)[0],
    ]  # '}' inside a string? no: rejected
    if not m.copy().accept(bad[0]) or m.copy().accept(bad[1]):
        bad = [drafts[0], 0]  # token 0 is special: never allowed inside a constraint
    with pytest.raises(RuntimeError, match="rejected by the constraint"):
        fill_position_masks(m, bad, rows)
    assert np.array_equal(m.mask_row(), before[0]) and m.num_accepted() == before[1]


@pytest.mark.slow
def test_drafts_alternate_forced_and_ngram(llm):
    """After '{' the schema forces '"name":"'; once the model has started the value, the n-gram
    index copies the rest of it from the prompt, and the next key is forced again. The matcher
    given to propose() is a copy, advanced only there."""
    tok = llm.tokenizer
    props = {"name": {"type": "string"}, "city": {"type": "string"}}
    compiled = llm.structured.compile(
        SamplingParams(
            json_schema={
                "type": "object",
                "properties": props,
                "required": ["name", "city"],
                "additionalProperties": False,
            },
            whitespace="compact",
        )
    )
    prompt = tok.encode('name: "Alice Smith", city: "Paris"')

    def drafts_after(text):
        m = llm.structured.matcher(compiled)
        tokens = prompt[:]
        for t in tok.encode(text, add_special_tokens=False):
            assert m.accept(t)
            tokens.append(t)
        d = propose(tokens, m.copy(), NgramIndex(1, 4), 12, forced=True, stop_ids=frozenset({2}))
        assert m.num_accepted() == len(tokens) - len(prompt)  # untouched
        return tok.decode(d.tokens), d.sources

    text, sources = drafts_after("{")
    assert text == '"name":"' and set(sources) == {FORCED}
    text, sources = drafts_after('{"name":"Alice')
    assert text.startswith(' Smith","city":"'), text
    assert sources[0] == NGRAM and FORCED in sources[sources.index(FORCED) :]
    off = propose(prompt, None, None, 12, forced=False, stop_ids=frozenset())
    assert len(off) == 0
    # the model's tokenization habit: where it rejected '":"' for '":' it is drafted next time
    colon = tok.encode('":"', add_special_tokens=False)
    m = llm.structured.matcher(compiled)
    for t in tok.encode('{"name', add_special_tokens=False):
        assert m.accept(t)
    plain = propose(prompt, m.copy(), None, 3, forced=True, stop_ids=frozenset())
    assert plain.tokens[:1] == colon and len(colon) == 1
    model = tok.encode('":', add_special_tokens=False)
    habit = propose(
        prompt, m.copy(), None, 3, forced=True, stop_ids=frozenset(), preferred={colon[0]: model[0]}
    )
    assert tok.decode(habit.tokens) == '":"' and habit.tokens[0] == model[0]


# -- tiny random model: fast checks of the engine paths ------------------------------------------
TINY_REGEX = r"(alpha|beta) forced text that is long enough, then [0-9]{3} and done"


@pytest.fixture(scope="module")
def tiny(tiny_folder, monkeypatch_session):
    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0)


def _tiny_run(llm, mode, params, prompts):
    llm.dspark = DSpark(mode)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.token_ids for o in outs], llm.dspark.stats


def test_tiny_many_seeds_identical(tiny):
    """Seeded sampling over 24 seeds (+ greedy rows) on a regex with long forced spans, where the
    random model often rejects the canonical tokenization, and unconstrained n-gram rows: the
    tokens per seed are the same with DSpark (so is their distribution)."""
    prompts = [[1, 5, 9, 5, 9, 5, 9]] * 32
    params = [SamplingParams(temperature=0.0 if i < 8 else 1.0, seed=i, max_tokens=40, regex=TINY_REGEX)
              if i % 2 == 0 else SamplingParams(temperature=0.0 if i < 8 else 0.9, top_k=50, seed=i,
                                                 max_tokens=12, ignore_eos=True, speculative=True)
              for i in range(32)]  # fmt: skip
    base, _ = _tiny_run(tiny, False, params, prompts)
    ragged = {"schedule": "fixed", "max_drafts": 5, "ragged": True}  # each row feeds its own drafts
    for mode in (True, {"schedule": "fixed", "max_drafts": 5}, ragged):
        got, st = _tiny_run(tiny, mode, params, prompts)
        assert got == base
        assert st.verify_steps > 0 and sum(st.accepted) > 0
        rejected = sum(n - a for (n, a), c in st.accept_hist.items() for _ in range(c) if a < n)
        assert rejected > 0  # rejections (and their bonus tokens) were exercised
        assert (st.ragged_steps > 0) == (mode is ragged)
    assert all(len(b) == 12 for b in base[1::2])


def test_tiny_kv_lengths_stops_and_mixed_batch(tiny):
    """max_tokens is exact with drafts pending, a stop string cuts like plain decoding, a
    non-speculating row shares the step, and num_cached is the accepted length."""
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], [1, 300, 301], [1, 42]]
    params = [
        SamplingParams(temperature=0, max_tokens=7, regex=TINY_REGEX),  # cut by length mid-forced-span
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX, stop="text"),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),  # plain row in the same step
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX, speculative=False),
    ]
    base, _ = _tiny_run(tiny, False, params, prompts)
    got, st = _tiny_run(tiny, {"schedule": "fixed"}, params, prompts)
    assert got == base and len(got[0]) == 7 and len(got[2]) == 9
    assert st.verify_steps > 0
    outs = tiny.generate(prompts[1:2], params[1], use_tqdm=False)
    assert outs[0].finish_reason == "stop" and outs[0].stop_reason == "text"

    seen = []  # every verify step leaves num_cached == len - 1 (the bonus token is not cached)
    step = DSpark.step

    def spy(self, plan, masks, **kw):
        done = step(self, plan, masks, **kw)
        seen.extend(s.num_cached == len(s) - 1 for s in plan.seqs if not s.is_finished)
        return done

    DSpark.step = spy
    try:
        _tiny_run(tiny, {"schedule": "fixed"}, params, prompts)
    finally:
        DSpark.step = step
    assert seen and all(seen)


@pytest.mark.parametrize("ahead", [False, True], ids=["first-plan", "behind-prefill"])
def test_prompts_indexed_behind_the_prefill(tiny, monkeypatch, ahead):
    """With ``index_ahead`` (the default on CUDA), the prefill step indexes the prompts of the
    requests that speculate, and their first drafting step takes that index (the prompt's every
    end already in it) instead of indexing the prompt itself; outputs are unchanged."""
    prompts = [[1, 5, 9, 5, 9, 5, 9] * 6, [1, 7, 7, 7, 7] * 5, [1, 42, 43]]
    params = [
        SamplingParams(temperature=0, max_tokens=20, regex=TINY_REGEX),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, speculative=True),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),  # (does not speculate)
    ]
    base, _ = _tiny_run(tiny, False, params, prompts)
    monkeypatch.setattr(DSpark, "index_ahead", ahead)
    given = {}  # request's prompt -> the index its first drafting step was handed
    init = dspark_mod._Request.__init__

    def spy(self, config, s, stop_ids, prior, index=None):
        given[tuple(s.prompt_token_ids)] = index and (index.indexed, [dict(d) for d in index.index])
        init(self, config, s, stop_ids, prior, index)

    monkeypatch.setattr(dspark_mod._Request, "__init__", spy)
    got, st = _tiny_run(tiny, {"schedule": "fixed"}, params, prompts)
    assert got == base and st.verify_steps > 0
    assert set(given) == {tuple(p) for p in prompts[:2]}  # the two that speculate
    for p in prompts[:2]:
        if not ahead:
            assert given[tuple(p)] is None
            continue
        want = NgramIndex(1, 4)
        want.lookup(p, 1)  # what the first lookup indexes of the prompt
        assert given[tuple(p)] == (len(p), want.index)
    assert not tiny.dspark._indexed  # every one taken


def test_finished_requests_are_freed_behind_the_next_forward(tiny, monkeypatch):
    """A request that finished leaves DSpark's state at the next drafting step, and that state
    (its n-gram index: thousands of tuples for a long prompt) is freed after the verify
    forward's launch, not before it."""
    prompts = [[1, 5, 9, 5, 9] * 4, [1, 7, 7, 7] * 4]
    params = [
        SamplingParams(temperature=0, max_tokens=3, regex=TINY_REGEX),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, speculative=True),
    ]
    at_launch, after = [], []
    step = DSpark.step

    def spy(self, plan, masks, *, forward, **kw):
        def launch(*a, **k):
            at_launch.append(len(self._retired))
            return forward(*a, **k)

        done = step(self, plan, masks, forward=launch, **kw)
        after.append(len(self._retired))
        return done

    monkeypatch.setattr(DSpark, "step", spy)
    _tiny_run(tiny, {"schedule": "fixed"}, params, prompts)
    assert max(at_launch) == 1 and set(after) == {0}  # the first request's, freed behind a forward


def test_index_prompts_skips_and_forgets():
    """``index_prompts`` indexes only computed prompts of requests that speculate and have no
    index, and drops the indexes of requests no longer running."""
    from types import SimpleNamespace as NS

    def seq(rid, prompt, cached, **kw):
        return NS(request_id=rid, prompt_token_ids=prompt, num_cached=cached, constraint=None,
                  params=NS(logprobs=None, speculative=kw.get("speculative", True)))  # fmt: skip

    d = DSpark(True)
    a, b, e = seq(1, [1, 2, 1, 2], 4), seq(2, [3, 4, 3], 2), seq(4, [7], 1)
    c = seq(3, [5, 6], 2, speculative=False)
    d.index_prompts([a, b, c, e])
    assert set(d._indexed) == {1, 4}  # 2: its prompt's last chunk not run yet; 3: does not speculate
    assert d._indexed[1].lookup([1, 2, 1, 2], 2) == ([1, 2], 2)
    first = d._indexed[1]
    b.num_cached = 3
    d.index_prompts([a, b])
    assert set(d._indexed) == {1, 2} and d._indexed[1] is first  # 4 gone; 1 not indexed again
    d._forget(frozenset({2}))
    assert set(d._indexed) == {2} and d._retired == [first]  # freed behind the next forward
    d.index_prompts([b])
    assert d._retired == []


@pytest.mark.parametrize("inline", [False, True], ids=["mask-thread", "inline"])
def test_verify_forward_does_not_wait_for_the_first_masks(tiny, monkeypatch, inline):
    """With masks filled inline (as on CUDA, on the step loop's thread), a verify step launches
    its forward before position 0's rows are filled: they are filled with the positions after
    the drafts while the forward runs, by DSpark's mask thread (the CPU's way) or, with the
    verifier inline (CUDA's way), on the step's own thread once the launch returned, with no
    thread of its own. Here each such fill waits (up to 1 s) for its step's forward; the
    outputs are plain decoding's."""
    import threading

    from deepinfer.dspark.verify import Verifier
    from deepinfer.structured import MaskFiller

    monkeypatch.setattr(Verifier, "inline", inline)

    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], [1, 42]]
    params = [SamplingParams(temperature=0, max_tokens=24, regex=TINY_REGEX)] * 3
    base, _ = _tiny_run(tiny, False, params, prompts)
    cond, launches, verifying, waited, on_step_thread = threading.Condition(), [0], [None], [], []
    fill, forward, step = MaskFiller._fill, tiny.runner.verify, DSpark.step

    def launch(*a, **kw):
        with cond:
            launches[0] += 1
            cond.notify_all()
        return forward(*a, **kw)

    def spy_step(self, plan, masks, **kw):
        verifying[0] = launches[0] + 1  # this step's forward
        try:
            return step(self, plan, masks, **kw)
        finally:
            verifying[0] = None

    def spy_fill(self, seqs, args):
        want = verifying[0]
        if want is not None:  # position 0 of a verify step: was its forward launched first?
            on_step_thread.append(threading.current_thread() is threading.main_thread())
            with cond:
                waited.append(cond.wait_for(lambda: launches[0] >= want, timeout=1.0))
        return fill(self, seqs, args)

    filler = tiny.masks
    tiny.masks = MaskFiller(tiny.config.vocab_size, pin=False, inline=True)
    tiny.runner.verify, DSpark.step, MaskFiller._fill = launch, spy_step, spy_fill
    try:
        got, st = _tiny_run(tiny, {"schedule": "fixed"}, params, prompts)
    finally:
        DSpark.step, MaskFiller._fill = step, fill
        del tiny.runner.verify
        tiny.masks = filler
    assert got == base
    assert st.verify_steps > 0 and len(waited) == st.verify_steps
    assert all(waited), waited
    assert on_step_thread == [inline] * st.verify_steps
    assert tiny.dspark._verifier.inline is inline and (tiny.dspark._verifier._pool is None) is inline


def _verify_equals_decode(llm, prompts=None, drafts=None, T=6):
    """Each position of a verify forward gives the bits a decode step there gives (K/V
    included), whatever the rows and their drafts: decode the same tokens one position at a
    time, in batches of other compositions, and compare with torch.equal."""
    import torch

    if prompts is None:
        prompts = [[1, *range(5 + i, 5 + i + 7 * i)] for i in range(10)]
        drafts = [[5, 6, 7, 8, 9], [], [8, 9], [10]] * 2 + [[11, 12, 13, 14], [15]]
    seqs = [llm._make_sequence(p, SamplingParams(max_tokens=20)) for p in prompts]
    runner, pool = llm.runner, llm.scheduler.pool
    for s in seqs:
        s.block_table = pool.allocate(-(-(len(s) + 8) // pool.block_size))
    runner.step(seqs, [len(s) for s in seqs])
    for s in seqs:
        s.output_token_ids.append(11)  # sampled, not cached yet
    verified = runner.verify(seqs, drafts, T).cpu()
    assert verified.shape == (len(prompts), T, llm.config.vocab_size)
    for t in range(T):  # position t: the rows with a token there, decoded as a batch
        rows = [i for i, d in enumerate(drafts) if t <= len(d)]
        decoded = runner.step([seqs[i] for i in rows], [1] * len(rows)).cpu()
        for j, i in enumerate(rows):
            assert torch.equal(decoded[j], verified[i, t]), (i, t)
            seqs[i].num_cached -= 1  # the next position feeds the next draft
            if t < len(drafts[i]):
                seqs[i].output_token_ids.append(drafts[i][t])
                seqs[i].num_cached += 1
    for s in seqs:
        pool.free(s.block_table)


@pytest.fixture(scope="module")
def int4_llm(embedded_gguf_path):
    """The CPU's default: the GGUF's int4 blocks, bfloat16 activations, the C kernels."""
    from deepinfer.kernels import decode_attention_c, quantized

    # (no prefix cache: a prompt's second prefill, its head cached, would round otherwise than
    # its first, and a near-tie may flip a greedy token whatever DSpark does)
    llm = LLM(None, device="cpu", seed=0, prefix_caching=False)
    if quantized._GEMV.fn is None or decode_attention_c.STATE.attention_rows is None:
        pytest.skip("the C kernels are not built (./build.sh install builds them with cc)")
    if llm.quantization != "gguf":
        pytest.skip(f"the CPU default here is {llm.dtype} without int4 planes (no native bf16, or "
                    "torch's int4 kernel reads another layout)")  # fmt: skip
    return llm


@pytest.mark.slow
def test_cpu_verify_of_a_few_tokens_is_decode_bit_for_bit(int4_llm):
    """The CPU default: a verify forward of at most GEMV_ROWS tokens runs decode's kernels
    (the C GEMV, each query row's attention as a decode row's), so each position gives the
    bits a decode step there gives, rows alone or together."""
    text = int4_llm.tokenizer.encode("Alice Smith is 31 years old and lives in Paris. Record as JSON.")
    _verify_equals_decode(int4_llm, [text], [[28, 1296, 4330]], T=4)
    _verify_equals_decode(int4_llm, [text, text[3:]], [[28], []], T=2)
    assert int4_llm.runner.verify_cap() == 4


@pytest.mark.slow
def test_cpu_default_keeps_outputs_identical_with_dspark(int4_llm):
    """Greedy requests one at a time on the CPU default (bfloat16, int4 blocks): DSpark verifies
    at most GEMV_ROWS tokens a step there (``ModelRunner.verify_cap``), so its outputs are the
    ones without it, token for token, and it still verifies and accepts drafts."""
    base, on, verified, accepted = [], [], 0, 0
    for message, c in PROMPTS[:2] + PROMPTS[4:]:
        for mode, out in ((False, base), (True, on)):
            int4_llm.dspark = DSpark(mode)
            params = SamplingParams(temperature=0, max_tokens=60, **c)
            out.append(int4_llm.chat([[{"role": "user", "content": message}]], params, use_tqdm=False)[0])
        st = int4_llm.dspark.stats
        verified, accepted = verified + st.verify_steps, accepted + sum(st.accepted)
    assert [o.token_ids for o in on] == [o.token_ids for o in base]
    assert verified > 0 and accepted > 0


def test_deterministic_verify_forward_is_decode_bit_for_bit(tiny_folder, monkeypatch_session):
    # bfloat16: a multi-position forward would round differently from decode here
    llm = LLM(tiny_folder[0], dtype="bfloat16", device="cpu", seed=0, deterministic=True)
    _verify_equals_decode(llm)


def test_deterministic_mode_keeps_dspark_on_bit_identical(tiny_folder, monkeypatch_session):
    """deterministic=True promises bit-identical tokens; DSpark stays on there (its verify
    forward is decode's arithmetic), and outputs equal DSpark off bit for bit, in bfloat16."""
    det = LLM(tiny_folder[0], dtype="bfloat16", device="cpu", seed=0, deterministic=True)
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], [1, 5, 9, 5, 9, 5, 9]]
    params = [
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX),
        SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, speculative=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=30, regex=TINY_REGEX),
    ]
    off, _ = _tiny_run(det, False, params, prompts)
    on, st = _tiny_run(det, {"schedule": "fixed"}, params, prompts)
    assert st.verify_steps > 0 and sum(st.accepted) > 0
    assert on == off


@pytest.mark.gpu
def test_deterministic_verify_forward_is_decode_bit_for_bit_cuda(tiny_folder, monkeypatch_session):
    # (16 rows: the 10 of _verify_equals_decode; fewer batch buckets, so fewer graphs and kernel
    # variants to capture and compile than the default 64)
    llm = LLM(tiny_folder[0], dtype="bfloat16", device="cuda", seed=0, deterministic=True, max_num_seqs=16)
    assert llm.runner.invariant and llm.runner.cuda_graphs
    _verify_equals_decode(llm)
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], [1, 5, 9, 5, 9, 5, 9]] * 3
    params = [
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX),
        SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, speculative=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=30, regex=TINY_REGEX),
    ] * 3
    off, _ = _tiny_run(llm, False, params, prompts)
    on, st = _tiny_run(llm, {"schedule": "fixed"}, params, prompts)
    assert st.verify_steps > 0 and on == off


def _fixed_shape_vs_eager(llm, capture: bool):
    """The bucketed, padded verify forward (what the CUDA graphs replay) gives the eager
    forward's logits on the real rows and positions."""
    import torch

    prompts = ([1, 5, 9], [1, 7, 7, 7, 7, 7, 7], [1, 300])
    seqs = [llm._make_sequence(p, SamplingParams(max_tokens=20)) for p in prompts]
    runner, pool = llm.runner, llm.scheduler.pool
    for s in seqs:  # the engine's own pool: blocks for 16 positions each
        s.block_table = pool.allocate(-(-16 // pool.block_size))
    runner.step(seqs, [len(s) for s in seqs])
    for s in seqs:
        s.output_token_ids.append(11)  # sampled, not cached yet
    drafts = [[5, 6], [], [7, 8]]
    eager = runner.verify_eager(seqs, drafts, 3)
    graphs = runner.graphs  # the decode graphs' class (captured on CUDA, run eagerly on the CPU)
    assert graphs.capture == capture and graphs._outs == []
    assert t_bucket(3) == 3 and t_bucket(4) == 5
    fixed = runner.verify_static(seqs, drafts, 3)
    assert fixed.shape == eager.shape == (3, 3, llm.config.vocab_size)
    torch.testing.assert_close(fixed.cpu(), eager.cpu(), rtol=1e-4, atol=1e-4)
    again = runner.verify_static(seqs[:1], drafts[:1], 4).cpu()  # T bucketed to 5, rows to a smaller bucket
    torch.testing.assert_close(again[0, :3], eager[0].cpu(), rtol=1e-4, atol=1e-4)
    mixed = runner.verify_static([seqs[2], seqs[0]], [drafts[2], drafts[0]], 3).cpu()  # rows in any order
    assert mixed.shape == (2, 3, llm.config.vocab_size)
    torch.testing.assert_close(mixed, eager[[2, 0]].cpu(), rtol=1e-4, atol=1e-4)
    # every shape writes its logits into the front of one shared buffer
    assert len(graphs._outs) == 1 and graphs._outs[0].shape[:2] == (graphs.max_rows, 9)
    # ragged: each row feeds only its own drafts, every position a row of the decode graphs
    ragged = runner.verify(seqs, drafts, 3, ragged=True).cpu()
    assert ragged.shape == eager.shape
    for b, d in enumerate(drafts):
        n = len(d) + 1
        torch.testing.assert_close(ragged[b, :n], eager[b, :n].cpu(), rtol=1e-4, atol=1e-4)
    for s in seqs:
        pool.free(s.block_table)


def test_fixed_shape_verify_forward_equals_eager(tiny):
    _fixed_shape_vs_eager(tiny, capture=False)


@pytest.mark.gpu
def test_verify_cuda_graphs_equal_eager(tiny_folder, monkeypatch_session):
    llm = LLM(tiny_folder[0], dtype="float32", device="cuda", seed=0, max_num_seqs=4)  # 3 rows at most
    _fixed_shape_vs_eager(llm, capture=True)
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7]]
    params = [
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX),
        SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, speculative=True),
    ]
    base, _ = _tiny_run(llm, False, params, prompts)
    got, st = _tiny_run(llm, {"schedule": "fixed"}, params, prompts)
    assert got == base and st.verify_steps > 0
    got, st = _tiny_run(llm, {"schedule": "fixed", "ragged": True}, params, prompts)  # the decode graphs
    assert got == base and st.ragged_steps == st.verify_steps > 0


@pytest.mark.gpu
def test_capture_graphs_up_front_leaves_nothing_to_capture(tiny_folder, monkeypatch_session):
    llm = LLM(tiny_folder[0], dtype="float32", device="cuda", seed=0, max_num_seqs=4, max_model_len=512,
              dspark={"default": "all", "schedule": "fixed", "max_drafts": 4})  # fmt: skip
    n = llm.capture_graphs(300)
    graphs = llm.runner.graphs.graphs
    decode, verify = [{k for k in graphs if (k.positions > 1) == v} for v in (False, True)]
    # decode: batch buckets 1, 2, 4, and 20, 36, 68, 132, 260 for the mixed steps (4 rows and
    # up to MIXED_TOKENS prompt tokens) x key buckets 256, 512; verify: 1, 2, 4 x widths 2, 3, 5
    assert llm.runner.buckets() == [1, 2, 4, 20, 36, 68, 132, 260]
    assert n == len(decode) + len(verify) == 16 + 18
    keys = (set(decode), set(verify))
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], [1, 300, 301], [1, 2]]
    params = [
        SamplingParams(temperature=0, max_tokens=30, regex=TINY_REGEX),
        SamplingParams(temperature=0.8, seed=3, max_tokens=20, ignore_eos=True),
    ] * 2
    base, _ = _tiny_run(llm, False, params, prompts)
    got, st = _tiny_run(llm, {"default": "all", "schedule": "fixed", "max_drafts": 4}, params, prompts)
    assert got == base and st.verify_steps > 0
    assert set(graphs) == keys[0] | keys[1] and llm.capture_graphs(300) == 0
    assert len(llm.runner.graphs._outs) == 1  # 18 verify graphs, one logits buffer


def test_capture_graphs_is_a_no_op_without_cuda(tiny):
    assert tiny.capture_graphs() == 0


# -- units -------------------------------------------------------------------------------------
def test_ngram_index_longest_suffix_most_recent():
    idx = NgramIndex(1, 3)
    toks = [1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3]
    assert idx.lookup(toks, 2) == ([5, 7], 2)  # suffix (2, 3): most recent earlier end
    assert idx.lookup(toks, 2, context=[4]) == ([9, 2], 3)  # suffix (2, 3, 4) with a draft
    assert idx.lookup(toks + [8], 1) == ([], 0)  # (8) never occurred before
    assert NgramIndex(1, 3).lookup([1, 2], 3) == ([], 0)  # nothing earlier


def test_ngram_index_matches_its_definition_on_random_text():
    # NgramIndex._extend builds its dicts key by key for a few new ends and with zip for many
    # (FEW_ENDS); the definition is the plain loop below, index[n][tokens[e-n:e]] = e for every
    # end e >= max(n, 1), later ends overwriting
    rng = random.Random(7)
    for trial in range(300):
        n_min, n_max = rng.choice([(1, 4), (2, 4), (1, 1), (3, 5)])
        toks = [rng.randrange(6) for _ in range(rng.randrange(0, 120))]
        idx = NgramIndex(n_min, n_max)
        upto = 0
        while upto < len(toks):  # extended in random pieces, as a prompt then a growing output are
            upto = min(len(toks), upto + rng.choice([rng.randrange(1, 9), rng.randrange(FEW_ENDS, 40)]))
            idx._extend(toks, upto)
        want = [{} for _ in range(n_max + 1)]
        for e in range(1, len(toks)):
            for n in range(n_min, min(n_max, e) + 1):
                want[n][tuple(toks[e - n : e])] = e
        assert idx.index == want, (trial, n_min, n_max, toks)


def test_scheduler_verifies_where_it_pays():
    cheap, costly = CostModel(0.001), CostModel(0.5)
    certain = [[1.0] * 6, [1.0] * 6]
    assert choose_positions(certain, cheap, 1000) == 7
    assert choose_positions([[0.05, 0.01], []], costly, 1000) == 1  # doubtful drafts: plain decode
    assert choose_positions(certain, cheap, 8) == 4  # B * T within the token budget
    assert choose_positions([[], []], cheap, 1000) == 1
    m = CostModel(0.1)
    for n in (1, 2, 4, 8, 16, 4, 2):
        m.observe("verify", n, 0.1 + 0.02 * n)
    assert abs(m.predict("verify", 10) - 0.3) < 0.01  # the data outweighs the prior
    assert m.predict("decode", 10) == m.predict("verify", 10)  # no decode data: the verify fit


def test_source_switches_off_and_probes_again():
    s = SourceStats(0.5)
    for _ in range(6):
        s.observe(False)
    assert not s.enabled(10, 0.15)
    assert not s.enabled(17, 0.15) and s.enabled(18, 0.15)  # back-off of 8 steps, then a probe
    s.observe(False)
    assert not s.enabled(18, 0.15) and s.enabled(18 + 16, 0.15)  # a failed probe: doubled
    r = RequestStats()
    r.observe([FORCED, FORCED, NGRAM], [K_FORCED, K_FORCED, K_COPY2], 1)  # one accepted, one rejected
    assert r.kinds[K_FORCED].seen == 2 and r.kinds[K_COPY2].seen == 0  # drafts after a rejection: unseen
    g = r.confidence([K_FORCED, K_COPY2, K_COPY_NEXT])
    assert g[0] == r.kinds[K_FORCED].rate < 0.9 and g[2] < g[1] < g[0]
    assert RequestStats(prior=r).kinds[K_FORCED].rate == r.kinds[K_FORCED].rate  # new requests start there


def test_settings():
    assert DSparkConfig.parse(True).default == "constrained" and DSparkConfig.parse(False).default == "off"
    assert DSparkConfig.parse({"max_drafts": 4}).max_drafts == 4
    with pytest.raises(ValueError, match=r"unknown keys \['k'\]"):
        DSparkConfig.parse({"k": 1})
    with pytest.raises(ValueError, match="max_drafts must be an int >= 1"):
        DSparkConfig(max_drafts=0)
    with pytest.raises(ValueError, match="default must be one of"):
        DSparkConfig(default="sometimes")
    with pytest.raises(ValueError, match="speculative must be a bool or None"):
        SamplingParams(speculative="yes")


# -- the device benchmark's replay harness (benchmarks/bench_dspark.py) ----------------------------
PEOPLE = [
    ("Alice Smith", 31, ["chess", "tea"], "Paris"),
    ("Carla Rossi", 27, ["opera", "pasta", "football"], "Rome"),
    ("Bruno Keller", 45, ["hiking"], "Berlin"),
    ("Dana Ortiz", 38, ["tennis", "jazz music"], "Madrid"),
]


def _replay_setup(llm, n):
    import json
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import bench_dspark

    tasks, prompts = [], []
    for i in range(n):
        name, age, tags, city = PEOPLE[i % len(PEOPLE)]
        data = {"name": name, "age": age, "tags": tags, "city": city}
        tasks.append({"name": f"p{i}", "data": data})
        text = f"name: {name}\nage: {age}\ntags:\n" + "".join(f"- {t}\n" for t in tags) + f"city: {city}\n"
        prompts.append(llm.tokenizer.encode(f"Record as JSON.\n{text}"))
    scripts = bench_dspark.scripts_for(tasks, n, llm.tokenizer, llm.tokenizer.eos_token_ids[0])
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=60, json_schema=SCHEMA) for i in range(n)]
    want = [json.dumps(t["data"], separators=(",", ":")) for t in tasks]
    return bench_dspark, scripts, prompts, params, want


def test_replay_writes_the_scripts_and_accepts_drafts(tiny):
    """The random model writes each request's script (the extraction answer) in plain decoding;
    with acceptance by the script, the replayed DSpark emits exactly the same tokens (drafts
    checked against the text, bonus = the text's token), with drafts of both sources accepted."""
    bench, scripts, prompts, params, want = _replay_setup(tiny, 8)
    replay = bench.Replay(scripts, accept="script")
    replay.install(tiny)
    try:
        base, _ = _tiny_run(tiny, False, params, prompts)
        assert [tiny.tokenizer.decode(b) for b in base] == want and replay.fallback_tokens == 0
        tiny.dspark = replay.dspark({"schedule": "fixed"})
        outs = tiny.generate(prompts, params, use_tqdm=False)
        st = tiny.dspark.stats
    finally:
        bench.Replay.uninstall(tiny)  # the class's sampler and DSpark's clock again
    assert [o.token_ids for o in outs] == base and all(o.parsed is not None for o in outs)
    assert st.accepted[FORCED] > 20 and st.accepted[NGRAM] > 10, st
    assert st.tokens_per_row_step > 1.5, st.tokens_per_row_step


def test_replay_verify_reads_nothing_back_from_the_device(tiny, monkeypatch):
    """The replayed verify decides its rows on the host: it never reads the kernel's constrained
    row indices back (on CUDA that read waits for the verify forward, and its host seconds,
    which the cost model's clock leaves out, would then hold the forward's time)."""
    import torch

    from deepinfer.dspark.verify import Verifier

    class DeviceOnly(torch.Tensor):
        def tolist(self):
            raise AssertionError("the harness read the kernel's indices back")

    inputs = Verifier.inputs
    given = []

    def device_only_indices(self, *a, **kw):
        out = inputs(self, *a, **kw)
        if out["indices"] is not None:
            out["indices"] = out["indices"].as_subclass(DeviceOnly)
            given.append(True)
        return out

    monkeypatch.setattr(Verifier, "inputs", device_only_indices)
    bench, scripts, prompts, params, _ = _replay_setup(tiny, 4)
    replay = bench.Replay(scripts, accept="script")
    replay.install(tiny)
    try:
        tiny.dspark = replay.dspark({"schedule": "fixed"})
        outs = tiny.generate(prompts, params, use_tqdm=False)
    finally:
        bench.Replay.uninstall(tiny)
    assert given and all(o.error is None for o in outs) and tiny.dspark.stats.verify_steps > 0


def test_replay_clock_leaves_the_harness_out(tiny):
    """Under the replay, DSpark times its steps on perf_counter less the harness's own host
    seconds (work a real model's step does not have); uninstall gives it the real clock back."""
    import time

    from deepinfer.dspark import dspark as dspark_module

    bench, scripts, _, _, _ = _replay_setup(tiny, 1)
    replay = bench.Replay(scripts)
    replay.install(tiny)
    try:
        replay.host["verify"][0] += 5.0  # as if the harness had worked 5 s
        assert abs(time.perf_counter() - dspark_module.time.perf_counter() - 5.0) < 0.5
    finally:
        bench.Replay.uninstall(tiny)
    assert dspark_module.time is time and "_sample" not in tiny.__dict__


def test_replay_accepts_drafts_at_the_configured_rates(tiny):
    """accept="rates": each proposed draft is accepted with its confidence class's rate (the
    H200 run accepted none: random text left nothing to draft, fixed by the scripts); the
    requests still end valid, and the KV / matcher bookkeeping holds (num_cached == len - 1)."""
    bench, scripts, prompts, params, _ = _replay_setup(tiny, 16)
    rates = [0.9, 0.5, 0.6, 0.7, 0.8]
    replay = bench.Replay(scripts, rates, accept="rates", seed=1)
    replay.install(tiny)
    dspark = replay.dspark({"schedule": "fixed"})
    seen = []
    step = type(dspark).step

    def spy(self, plan, masks, **kw):
        done = step(self, plan, masks, **kw)
        seen.extend(s.num_cached == len(s) - 1 for s in plan.seqs if not s.is_finished)
        return done

    type(dspark).step = spy
    try:
        tiny.dspark = dspark
        outs = tiny.generate(prompts, params, use_tqdm=False)
    finally:
        bench.Replay.uninstall(tiny)  # the class's sampler and DSpark's clock again
        type(dspark).step = step
    st = dspark.stats
    assert seen and all(seen)
    assert all(o.error is None for o in outs) and sum(o.parsed is not None for o in outs) >= 12
    for kind, rate in enumerate(rates):
        a, r = st.kind_accepted[kind], st.kind_rejected[kind]
        if a + r >= 40:
            assert abs(a / (a + r) - rate) < 0.12, (kind, a, r, rate)
    assert st.kind_accepted[K_FORCED] + st.kind_rejected[K_FORCED] >= 40
    assert st.verify_steps > 0 and st.tokens_per_row_step > 1.5, st
