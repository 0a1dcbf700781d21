"""The engine core API on the tiny random-weight model: add_request / step / abort_request /
has_unfinished_requests, against generate()."""

from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.dspark import DSpark

REGEX = r"(alpha|beta) forced text, then [0-9]{3} and done"


@pytest.fixture(scope="module")
def llm(tiny_folder, monkeypatch_session):
    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0, max_num_seqs=4)


def _requests():
    prompts = [[1, 5, 9], [1, 7, 7, 7, 7], "hello there", [1, 300, 301], [1, 42], [1, 8, 8]]
    params = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, regex=REGEX),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=7, max_tokens=20, regex=REGEX),
        SamplingParams(regex="(unclosed"),  # fails to compile: this request only
    ]
    return prompts, params


def _key(o):
    return o.token_ids, o.finish_reason, o.text, o.error, o.stop_reason


def _drain(llm) -> dict:
    got = {}
    while llm.has_unfinished_requests():
        for o in llm.step():
            assert o.finished and o.request_id not in got
            got[o.request_id] = o
    return got


@pytest.mark.parametrize("dspark", [False, {"schedule": "fixed"}], ids=["plain", "dspark"])
def test_step_loop_equals_generate(llm, dspark):
    prompts, params = _requests()
    llm.dspark = DSpark(dspark)
    want = llm.generate(prompts, params, use_tqdm=False)
    assert want[-1].finish_reason == "error" and want[2].error is None
    llm.dspark = DSpark(dspark)
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    assert len(set(ids)) == len(ids) and llm.has_unfinished_requests()
    got = _drain(llm)
    assert sorted(got, key=ids.index) == ids
    assert [_key(got[i]) for i in ids] == [_key(o) for o in want]
    assert not llm.has_unfinished_requests() and llm.step() == []


def test_requests_added_between_steps_join_the_running_batch(llm):
    prompts, params = _requests()
    llm.dspark = DSpark(False)
    want = llm.generate(prompts[:5], params[:5], use_tqdm=False)
    first = [llm.add_request(p, sp) for p, sp in zip(prompts[:2], params[:2])]
    got = {}
    for o in llm.step() + llm.step() + llm.step():  # a prefill, then decode steps
        got[o.request_id] = o
    assert len(llm.scheduler.running) == 2
    later = [llm.add_request(p, sp) for p, sp in zip(prompts[2:5], params[2:5])]
    outs = llm.step()  # admits two of the three (max_num_seqs=4) while the first two run
    assert not outs and len(llm.scheduler.running) == 4 and len(llm.scheduler.waiting) == 1
    got.update(_drain(llm))
    assert [_key(got[i]) for i in first + later] == [_key(o) for o in want]


def test_abort_waiting_and_running(llm):
    prompts, params = _requests()
    llm.dspark = DSpark(False)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ids = [llm.add_request([1, 5, 9 + i], long) for i in range(6)]  # 4 run, 2 wait
    llm.step()
    llm.step()
    running = [s.request_id for s in llm.scheduler.running]
    assert running == ids[:4]
    used = llm.metrics()["kv_blocks_used"]
    llm.abort_request(ids[1])  # running: its blocks are free at once
    assert llm.metrics()["kv_blocks_used"] < used
    llm.abort_request(ids[5])  # waiting
    llm.abort_request("no such request")  # no-op
    outs = {o.request_id: o for o in llm.step()}  # request 4 is admitted
    assert set(outs) == {ids[1], ids[5]}
    assert (
        outs[ids[1]].finish_reason == "abort" and len(outs[ids[1]].token_ids) == 2 and not outs[ids[1]].valid
    )
    assert outs[ids[5]].finish_reason == "abort" and outs[ids[5]].token_ids == []
    assert ids[4] in [s.request_id for s in llm.scheduler.running]
    rest = _drain(llm)
    assert sorted(rest) == [ids[0], ids[2], ids[3], ids[4]]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 40 for o in rest.values())
    # the survivors' tokens are those they get alone
    alone = llm.generate([[1, 5, 9], [1, 5, 13]], long, use_tqdm=False)
    assert rest[ids[0]].token_ids == alone[0].token_ids and rest[ids[4]].token_ids == alone[1].token_ids


def test_streamed_partial_outputs_and_request_ids(llm):
    llm.dspark = DSpark(False)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    rid = llm.add_request([1, 5, 9], sp, request_id="mine", stream=True)
    assert rid == "mine"
    with pytest.raises(ValueError, match="already in use"):
        llm.add_request([1, 2], sp, request_id="mine")
    with pytest.raises(RuntimeError):
        llm.generate([[1, 2]], sp, use_tqdm=False)  # generate() runs its own requests only
    seen = []
    while llm.has_unfinished_requests():
        seen += llm.step()
    assert [o.finished for o in seen] == [False] * 5 + [True]
    assert [len(o.token_ids) for o in seen] == [1, 2, 3, 4, 5, 6]
    assert all(o.finish_reason is None for o in seen[:-1]) and seen[-1].finish_reason == "length"
    assert seen[-1].token_ids[:5] == seen[-2].token_ids
    assert llm.generate([[1, 5, 9]], sp, use_tqdm=False)[0].token_ids == seen[-1].token_ids


def test_generate_interrupted_leaves_nothing_behind(llm, monkeypatch):
    llm.dspark = DSpark(False)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    calls = {"n": 0}
    step = llm.runner.step

    def failing(seqs, counts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return step(seqs, counts)

    monkeypatch.setattr(llm.runner, "step", failing)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 5, 9], [1, 7]], sp, use_tqdm=False)
    assert not llm.has_unfinished_requests() and not llm.scheduler.has_unfinished()
    assert llm.metrics()["kv_blocks_used"] == 0  # the interrupted requests' blocks are back
    monkeypatch.undo()
    assert len(llm.generate([[1, 5, 9]], sp, use_tqdm=False)[0].token_ids) == 8


def test_metrics_count_constraint_compiles_and_mask_time(llm):
    before = llm.metrics()
    llm.generate(["a", "b"], SamplingParams(max_tokens=3, regex="[ab]{3}"), use_tqdm=False)
    after = llm.metrics()
    assert after["constraints_compiled"] - before["constraints_compiled"] == 2
    assert after["constraint_compile_seconds"] > before["constraint_compile_seconds"]
    assert after["mask_seconds"] > before["mask_seconds"]


def test_construction_freezes_what_it_built(tiny_folder, monkeypatch_session):
    """The model's tensors, the tokenizer and the engine's tables are out of the collector's
    walks once the LLM is built."""
    import gc

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    llm = LLM(tiny_folder[0], seed=0)
    assert gc.get_freeze_count() > 0
    walked = {id(o) for o in gc.get_objects()}  # what collections walk: not the frozen
    assert id(llm.scheduler) not in walked and id(llm.runner) not in walked
    after = LLM.__new__(LLM)  # made later: walked as usual
    assert id(after) in {id(o) for o in gc.get_objects()}


def test_construction_logs_its_phases(tiny_folder, monkeypatch_session, caplog):
    """Construction says, on the ``deepinfer`` logger at INFO, where the model went and how big
    the KV cache is (on CUDA also each warm-up phase: see test_warmup.py)."""
    import logging

    with caplog.at_level(logging.INFO, logger="deepinfer"):
        LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0, max_num_seqs=2, block_size=16)
    lines = [r.getMessage() for r in caplog.records if r.name == "deepinfer.llm"]
    assert any(m.startswith("model on cpu in ") and m.endswith("blocks of 16 tokens") for m in lines), lines


def test_metrics_count_steps_by_kind(llm):
    before = llm.metrics()
    llm.generate([[1, 5, 9], [1, 7]], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    after = llm.metrics()
    # both prompts in one prefill step (their first token sampled there), then 3 decode steps
    assert after["prefill_steps"] - before["prefill_steps"] == 1
    assert after["decode_steps"] - before["decode_steps"] == 3
    assert after["verify_steps"] == before["verify_steps"]
    for kind in ("prefill", "decode"):
        assert after[f"{kind}_step_seconds"] > before[f"{kind}_step_seconds"]


def test_prepare_constraints_builds_the_compiler_before_any_request(tiny_folder, monkeypatch_session):
    """``prepare_constraints`` builds the vocabulary's constraint compiler at once (``deepinfer
    serve`` calls it before it says it is ready), so the first constrained request does not:
    the set-up is counted once, before it."""
    llm = LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0)
    assert llm.metrics()["constraint_setup_seconds"] == 0.0
    llm.prepare_constraints()
    setup = llm.metrics()["constraint_setup_seconds"]
    compiler = llm.structured.compiler
    assert setup > 0.0
    llm.generate(["a"], SamplingParams(max_tokens=3, regex="[ab]{3}"), use_tqdm=False)
    assert llm.metrics()["constraint_setup_seconds"] == setup
    assert llm.structured.compiler is compiler
