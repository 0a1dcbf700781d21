"""Async scheduling (deepinfer/step_ahead.py): a decode step launches the next one before its
tokens reach the host, and the engine's outputs are those of the engine without it, whatever
finishes, arrives, aborts or is preempted in between."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.dspark import DSpark
from deepinfer.sampling_params import SamplingParams as SP
from deepinfer.sequence import Sequence
from deepinfer.step_ahead import StepAhead, may_step_ahead, samples_ahead
from deepinfer.structured import MaskFiller

WORDS = "[a-z]{3,9}( [a-z]{2,6}){0,3}"


def _engine(folder, on: bool, **kw) -> LLM:
    # deterministic mode on the CPU: the fixed-shape decode in tiles, whose rows' bits do not
    # depend on the batch, so a step that ran more rows (one finished meanwhile) gives the same
    return LLM(folder, dtype="float32", device="cpu", seed=0, deterministic=True, max_num_seqs=4,
               async_scheduling=on, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def pair(tiny_folder, monkeypatch_session):
    return _engine(tiny_folder[0], True), _engine(tiny_folder[0], False)


def _key(o):
    return o.token_ids, o.finish_reason, o.stop_reason, o.text, o.error


def _requests():
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], "hello there", [1, 300, 301], [1, 42, 43, 44]]
    params = [
        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=5, max_tokens=25),  # may end on its EOS
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=11, max_tokens=30, ignore_eos=True, stop=["e"]),
    ]
    return prompts, params


def _ahead(llm) -> tuple[int, int]:
    m = llm.metrics()
    return m["decode_steps_ahead"], m["decode_steps_ahead_taken"]


def test_generate_equals_the_engine_without_it(pair):
    on, off = pair
    prompts, params = _requests()
    before = _ahead(on)
    got = on.generate(prompts, params, use_tqdm=False)
    want = off.generate(prompts, params, use_tqdm=False)
    assert [_key(o) for o in got] == [_key(o) for o in want]
    launched, taken = (a - b for a, b in zip(_ahead(on), before))
    assert taken > 10 and launched >= taken  # most decode steps ran ahead; some were dropped
    assert _ahead(off) == (0, 0)
    # rows finished at different steps: 3, 9, 14, stop strings and perhaps an EOS
    assert len({len(o.token_ids) for o in got}) >= 3


def _script(llm, prompts, params, events):
    """Run the engine step by step; ``events`` {step: ("add", i) | ("abort", i)} happen before
    that step. Returns {request index: output key}."""
    ids, got, step = {}, {}, 0
    while step <= max(events) or llm.has_unfinished_requests():
        for kind, i in events.get(step, []):
            if kind == "add":
                ids[llm.add_request(prompts[i], params[i])] = i
            else:
                llm.abort_request(next(r for r, j in ids.items() if j == i))
        for o in llm.step():
            got[ids[o.request_id]] = _key(o)
        step += 1
    return got


def test_arrivals_and_aborts_between_steps(pair):
    on, off = pair
    prompts, params = _requests()
    events = {0: [("add", 0), ("add", 1)], 4: [("add", 2)], 7: [("abort", 1)], 9: [("add", 3), ("add", 4)]}
    before = _ahead(on)
    got = _script(on, prompts, params, events)
    assert got == _script(off, prompts, params, events)
    assert got[1][1] == "abort"
    launched, taken = (a - b for a, b in zip(_ahead(on), before))
    assert taken > 10 and launched == taken  # an arrival waits for the step already launched


def test_preemption_in_a_small_pool(tiny_folder, monkeypatch_session):
    # 12 blocks of 16 positions for 4 requests of up to 60: the youngest is preempted, recomputed
    kw = dict(kv_cache_memory=12 * 2 * 2 * 2 * 16 * 16 * 4, block_size=16)
    on, off = _engine(tiny_folder[0], True, **kw), _engine(tiny_folder[0], False, **kw)
    prompts = [[1, 5 + i, 9, 10, 11] for i in range(4)]
    sp = SamplingParams(temperature=0.7, seed=2, max_tokens=55, ignore_eos=True)
    got = on.generate(prompts, sp, use_tqdm=False)
    want = off.generate(prompts, sp, use_tqdm=False)
    assert on.metrics()["preemptions"] > 0
    assert [_key(o) for o in got] == [_key(o) for o in want]
    assert all(len(o.token_ids) == 55 for o in got)
    assert on.metrics()["kv_blocks_used"] == 0  # every block given back


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "not-ahead"])
@pytest.mark.parametrize("inline", [False, True], ids=["mask-thread", "inline-masks"])
def test_constrained_and_logprob_rows(pair, inline, ahead):
    """Steps with a constrained row or one asking for logprobs give the outputs and logprobs
    of the engine with async scheduling off (inline: masks as on CUDA, each token's matcher
    work deferred behind the next forward). By default (``ahead``) their forward runs ahead
    and their tokens are sampled by the step that takes it, once the masks are filled. With
    ``host_rows_ahead`` off they launch nothing ahead, the masks filled behind each step's own
    forward; once only free rows are left, the steps run ahead again."""
    on, off = pair
    for llm in pair:
        llm.dspark = DSpark(False)
        llm.masks = MaskFiller(llm.config.vocab_size, pin=False, inline=inline)
    assert on.host_rows_ahead and on.metrics()["host_rows_ahead"]  # (the default)
    assert not off.metrics()["host_rows_ahead"]  # (async scheduling off)
    on.host_rows_ahead = ahead
    prompts = [[1, 5, 9], [1, 6], [1, 7, 8]]
    sp = [SamplingParams(temperature=0.9, seed=4, max_tokens=12, regex=WORDS),
          SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=0.5, seed=1, max_tokens=16, json_schema={"type": "object"})]  # fmt: skip
    try:
        before = _ahead(on)
        got, want = on.generate(prompts, sp, use_tqdm=False), off.generate(prompts, sp, use_tqdm=False)
        assert [_key(o) for o in got] == [_key(o) for o in want]
        assert [o.logprobs for o in got] == [o.logprobs for o in want]
        assert got[0].valid  # (the random model runs out of tokens inside the JSON object)
        if ahead:
            assert _ahead(on)[1] - before[1] > 5
            return
        assert _ahead(on) == before and not on.metrics()["host_rows_ahead"]
        free = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        got, want = (llm.generate(prompts, sp[:2] + [free], use_tqdm=False) for llm in pair)
        assert [_key(o) for o in got] == [_key(o) for o in want]
        assert _ahead(on)[1] - before[1] >= 3  # (the free row alone after the 12th token)
    finally:
        on.host_rows_ahead = True
        for llm in pair:
            llm.dspark = DSpark(True)
            llm.masks = MaskFiller(llm.config.vocab_size, pin=False)


def test_no_step_ahead_while_dspark_may_draft(pair):
    """Constrained rows under DSpark's fixed schedule draft every step: nothing is launched
    ahead (it would be dropped), and the outputs are the engine's without it."""
    on, off = pair
    for llm in pair:
        llm.dspark = DSpark({"schedule": "fixed"})
    sp = SamplingParams(temperature=0, max_tokens=12, regex="(alpha|beta) forced text, [0-9]{3}")
    try:
        before = _ahead(on)
        got, want = (
            on.generate([[1, 5, 9], [1, 6]], sp, use_tqdm=False),
            off.generate([[1, 5, 9], [1, 6]], sp, use_tqdm=False),
        )
        assert [_key(o) for o in got] == [_key(o) for o in want]
        assert on.dspark.stats.verify_steps > 0 and _ahead(on) == before
    finally:
        for llm in pair:
            llm.dspark = DSpark(True)


def test_default_mode_through_the_decode_graphs_path(tiny_folder, monkeypatch_session):
    """The default (not batch-invariant) mode, its fixed-shape decode run eagerly on the CPU:
    one request at a time (so every step has the same rows either way) gives the same tokens."""
    engines = []
    for on in (True, False):
        llm = LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0)
        llm.runner.static_decode = True  # (the CUDA graphs' fixed-shape step, without graphs)
        llm.async_scheduling = on
        engines.append(llm)
    sp = SamplingParams(temperature=0.8, seed=9, max_tokens=20, ignore_eos=True)
    got, want = (e.generate([[1, 2, 3, 4]], sp, use_tqdm=False) for e in engines)
    assert [_key(o) for o in got] == [_key(o) for o in want]
    assert _ahead(engines[0])[1] > 10


def test_needs_the_fixed_shape_decode(tiny_folder, monkeypatch_session):
    with pytest.raises(ValueError, match="async_scheduling=True needs the fixed-shape decode"):
        LLM(tiny_folder[0], dtype="float32", device="cpu", async_scheduling=True)
    assert not LLM(tiny_folder[0], dtype="float32", device="cpu").async_scheduling  # CPU: off by default


def _seq(i: int, outputs: int = 0, max_tokens: int = 10, **kw) -> Sequence:
    s = Sequence(i, None, [1, 2, 3], SP(max_tokens=max_tokens, **kw), seed=0, eos_token_ids=(2,), max_len=100)
    s.output_token_ids = [7] * outputs
    s.num_cached = len(s) - 1
    return s


def test_take_the_rows_it_ran_in_order_at_their_positions():
    rows = [_seq(i) for i in range(4)]
    logits = torch.arange(4.0)[:, None].repeat(1, 5)
    ahead = StepAhead(rows, [s.num_cached for s in rows], logits, torch.tensor([10, 11, 12, 13]))
    got, tokens = ahead.take(rows, True)
    assert got is logits and tokens.tolist() == [10, 11, 12, 13]
    got, tokens = ahead.take([rows[0], rows[2], rows[3]], True)  # row 1 finished
    assert got[:, 0].tolist() == [0, 2, 3] and tokens.tolist() == [10, 12, 13]
    got, tokens = StepAhead(rows, [s.num_cached for s in rows], logits, None).take(rows[1:], True)
    assert got[:, 0].tolist() == [1, 2, 3] and tokens is None  # not sampled ahead
    assert ahead.take(rows, False) is None  # not a decode step (a prompt chunk joined)
    assert ahead.take([rows[0], _seq(9)], True) is None  # a row it did not run
    rows[3].num_cached += 1
    assert ahead.take(rows, True) is None  # a row at another position


def test_may_step_ahead_and_sample_ahead():
    rows = [_seq(0), _seq(1)]
    never = lambda rows: False  # noqa: E731
    assert may_step_ahead(rows, 2, 0, never) and samples_ahead(rows)
    assert not may_step_ahead(rows, 3, 0, never)  # a running row outside the step
    assert not may_step_ahead(rows, 2, 1, never)  # a request waits for admission
    assert not may_step_ahead(rows, 2, 0, lambda rows: True)  # DSpark may draft for them
    assert not may_step_ahead([_seq(0, 9), _seq(1, 9)], 2, 0, never)  # every row at its last token
    assert may_step_ahead([_seq(0, 9), _seq(1, 8)], 2, 0, never)
    assert not samples_ahead([_seq(0), _seq(1, logprobs=1)])  # logprobs: sampled by the next step
    c = _seq(0)
    c.constraint = object()
    assert not samples_ahead([c, _seq(1)])  # a mask: sampled by the next step


@pytest.mark.gpu
@pytest.mark.parametrize("host_rows", [True, False], ids=["host-rows-ahead", "host-rows-not-ahead"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
def test_on_cuda_equals_the_engine_without_it(tiny_folder, monkeypatch_session, deterministic, host_rows):
    """On CUDA (on by default there; masks filled inline, each constrained token's matcher work
    deferred): deterministic mode, a batch whose rows finish at different steps; the default
    mode, whose bits may depend on the batch, one request at a time. ``host_rows``: steps with
    the constrained and logprob rows launched ahead (the default) or not."""
    kw = dict(dtype="float32", device="cuda", seed=0, max_num_seqs=4, max_model_len=512, dspark=False)
    kw["deterministic"] = deterministic
    on, off = LLM(tiny_folder[0], **kw), LLM(tiny_folder[0], async_scheduling=False, **kw)
    assert on.async_scheduling and not off.async_scheduling and on.masks.inline
    on.host_rows_ahead = host_rows
    prompts, params = _requests()
    prompts += [[1, 6, 7], [1, 8]]
    params.append(SamplingParams(temperature=0.9, seed=4, max_tokens=12, regex=WORDS))
    params.append(SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2))
    batches = [(prompts, params)] if deterministic else [([p], [sp]) for p, sp in zip(prompts, params)]
    for P, S in batches:
        got, want = on.generate(P, S, use_tqdm=False), off.generate(P, S, use_tqdm=False)
        assert [_key(o) for o in got] == [_key(o) for o in want]
        assert [o.logprobs for o in got] == [o.logprobs for o in want]
    assert _ahead(on)[1] > 0 and _ahead(off) == (0, 0)


def test_embedded_model_chat_and_extraction(monkeypatch_session):
    """The embedded SmolLM2-135M-Instruct in deterministic mode: a free chat answer, a
    JSON-Schema extraction and a seeded answer cut by a stop string, in one batch, with async
    scheduling on and off."""
    from deepinfer import LLM

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    msgs = [[{"role": "user", "content": "Name three colours."}],
            [{"role": "user", "content": "Extract as JSON: Ada Lovelace was 36."}],
            [{"role": "user", "content": "Write one sentence about rain."}]]  # fmt: skip
    params = [SamplingParams(temperature=0, max_tokens=24),
              SamplingParams(temperature=0, max_tokens=80, json_schema=schema),
              SamplingParams(temperature=0.8, seed=5, max_tokens=30, stop=["."])]  # fmt: skip
    got = {}
    for on in (True, False):
        llm = LLM(None, device="cpu", seed=0, deterministic=True, dspark=False, async_scheduling=on)
        got[on] = [_key(o) for o in llm.chat(msgs, params, use_tqdm=False)]
        if on:
            assert _ahead(llm)[1] > 5  # (the JSON answer's steps too)
    assert got[True] == got[False]
    assert got[True][1][1] == "stop" and got[True][1][4] is None  # the JSON answer is complete


def test_every_decode_step_is_taken_ahead(pair):
    """The step that ends the prompts launches the first decode step too, and a row's last
    step launches none: one request of 10 tokens runs 9 decode steps, all taken ahead."""
    on, _ = pair
    before = _ahead(on)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert len(on.generate([[1, 5, 9, 4]], sp, use_tqdm=False)[0].token_ids) == 10
    assert tuple(a - b for a, b in zip(_ahead(on), before)) == (9, 9)
