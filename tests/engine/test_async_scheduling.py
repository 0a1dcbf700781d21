"""Async scheduling (deepinfer/step_ahead.py): a decode step launches the next one before its
tokens reach the host, and the engine's outputs are those of the engine without it, whatever
finishes, arrives, aborts or is preempted in between."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.sampling_params import SamplingParams as SP
from deepinfer.sequence import Sequence
from deepinfer.step_ahead import StepAhead, may_step_ahead


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
    assert taken > 0 and launched > taken  # the arrivals dropped the steps launched before them


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


def test_constrained_or_logprob_rows_do_not_run_ahead(pair):
    on, off = pair
    before = _ahead(on)
    sp = [SamplingParams(temperature=0, max_tokens=8, regex="[a-z]{8}"),
          SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)]  # fmt: skip
    prompts = [[1, 5, 9], [1, 6]]
    for p in sp:
        got, want = on.generate(prompts, p, use_tqdm=False), off.generate(prompts, p, use_tqdm=False)
        assert [_key(o) for o in got] == [_key(o) for o in want]
    assert _ahead(on) == before


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
    ahead = StepAhead(rows, [s.num_cached for s in rows], torch.tensor([10, 11, 12, 13]))
    assert ahead.take(rows, True).tolist() == [10, 11, 12, 13]
    assert ahead.take([rows[0], rows[2], rows[3]], True).tolist() == [10, 12, 13]  # row 1 finished
    assert ahead.take(rows, False) is None  # not a decode step (a prompt chunk joined)
    assert ahead.take([rows[0], _seq(9)], True) is None  # a row it did not run
    rows[3].num_cached += 1
    assert ahead.take(rows, True) is None  # a row at another position


def test_may_step_ahead():
    rows = [_seq(0), _seq(1)]
    never = lambda s: False  # noqa: E731
    assert may_step_ahead(rows, 2, 0, never)
    assert not may_step_ahead(rows, 3, 0, never)  # a running row outside the step
    assert not may_step_ahead(rows, 2, 1, never)  # a request waits for admission
    assert not may_step_ahead(rows, 2, 0, lambda s: True)  # DSpark drafts for them
    assert not may_step_ahead([_seq(0), _seq(1, logprobs=1)], 2, 0, never)
    assert not may_step_ahead([_seq(0, 9), _seq(1, 9)], 2, 0, never)  # every row at its last token
    assert may_step_ahead([_seq(0, 9), _seq(1, 8)], 2, 0, never)
    c = _seq(0)
    c.constraint = object()
    assert not may_step_ahead([c, _seq(1)], 2, 0, never)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "default"])
def test_on_cuda_equals_the_engine_without_it(tiny_folder, monkeypatch_session, deterministic):
    """On CUDA (on by default there): deterministic mode, a batch whose rows finish at different
    steps; the default mode, whose bits may depend on the batch, one request."""
    kw = dict(dtype="float32", device="cuda", seed=0, max_num_seqs=4, max_model_len=512)
    kw["deterministic"] = deterministic
    on, off = LLM(tiny_folder[0], **kw), LLM(tiny_folder[0], async_scheduling=False, **kw)
    assert on.async_scheduling and not off.async_scheduling
    prompts, params = _requests()
    if not deterministic:
        prompts, params = [prompts[4]], [params[4]]
    got, want = on.generate(prompts, params, use_tqdm=False), off.generate(prompts, params, use_tqdm=False)
    assert [_key(o) for o in got] == [_key(o) for o in want]
    assert _ahead(on)[1] > 0 and _ahead(off) == (0, 0)
