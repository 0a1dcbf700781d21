"""StepTrace: the step-by-step record of an engine loop (deepinfer/server/step_trace.py), on the
tiny model offline and in the server's engine process (``DEEPINFER_STEP_TRACE``)."""

import asyncio
import functools

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.server.step_trace import StepTrace, describe, replacement_gaps, summary


def test_trace_rows_match_the_engines_step_counters(tiny_llm):
    llm = tiny_llm
    m0 = llm.metrics()
    trace = StepTrace()
    for n in (4, 6, 9):
        llm.add_request(
            [1, 2, 3, 4, 5][: n % 5 + 1], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        )
        trace.arrived()
    done = 0
    while llm.has_unfinished_requests():
        for o in trace.step(llm):
            if o.finished:
                trace.finished()
                done += 1
                if done == 1:  # a closed-loop client: the next request right after a finish
                    llm.add_request([7, 8], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
                    trace.arrived()
    m1 = llm.metrics()
    kinds = {r[2] for r in trace.rows}
    for kind in ("decode", "prefill", "verify"):
        assert sum(r[2] == kind for r in trace.rows) == m1[kind + "_steps"] - m0[kind + "_steps"]
    assert kinds <= {"decode", "prefill", "verify"}
    assert sum(r[3] for r in trace.rows) == m1["prefill_tokens"] - m0["prefill_tokens"]
    assert sum(r[5] for r in trace.rows) == 4 and len(trace.finishes) == 4
    assert trace.rows[0][5] == 3  # the first three arrived before the first step
    s = summary(trace)
    assert 0 < s["busy"] <= s["wall"] and s["idle"] == pytest.approx(s["wall"] - s["busy"])
    assert sum(n for _, n, _, _ in s["prefill"]) == s["kinds"]["prefill"][0]
    assert s["replacement"] is not None and 0 <= s["replacement"] < s["wall"]
    assert "rows a step" in describe(trace)
    assert trace.posted == trace.arrivals and s["wait"] == 0.0  # offline: sent is taken
    later = trace.since(2)
    assert later.rows == trace.rows[2:] and len(later.arrivals) == len(later.posted) == 1  # the replacement
    assert trace.since(0).rows == trace.rows


def test_since_leaves_the_warm_ups_last_finishes_out():
    """The finishes of the warm-up's last step are recorded after it ended, beside the run's
    first arrivals: they belong to the warm-up (in the run they would have no replacement and
    shift every match of ``replacement_gaps``)."""
    trace = StepTrace()
    trace.rows = [(0.0, 1.0, "decode", 0, 2, 0), (2.0, 3.0, "prefill", 8, 2, 2)]
    trace.rows.append((4.0, 5.0, "decode", 0, 2, 0))
    trace.arrivals = trace.posted = [-1.0, 1.6, 1.7, 3.6]
    trace.finishes = [1.5, 1.5, 3.5, 5.5]  # two after step 0 (the warm-up), one after each run step
    run = trace.since(1)
    assert run.rows == trace.rows[1:] and run.arrivals == [1.6, 1.7, 3.6] and run.finishes == [3.5, 5.5]
    assert replacement_gaps(run.posted, run.finishes) == pytest.approx([0.1])
    assert trace.since(3).finishes == [5.5] and trace.since(0).finishes == trace.finishes


def test_replacement_gaps_match_each_finish_to_the_next_arrival():
    # arrivals at 0 and 1 come before any finish; the finish at 2 is answered at 2.5, the
    # finishes at 3 and 3.1 at 4 and 6 (oldest first); the finish at 7 never
    assert replacement_gaps([0, 1, 2.5, 4, 6], [2, 3, 3.1, 7]) == pytest.approx([0.5, 1.0, 2.9])
    assert replacement_gaps([], [1.0]) == [] and replacement_gaps([1.0], []) == []


def test_server_engine_writes_its_trace(tiny_folder, tmp_path, monkeypatch):
    from deepinfer.server.engine_loop import EngineLoop

    path = tmp_path / "trace.json"
    monkeypatch.setenv("DEEPINFER_STEP_TRACE", str(path))  # the spawned engine process reads it
    loop = EngineLoop(functools.partial(LLM, tiny_folder[0], dtype="float32", device="cpu", seed=0))
    loop.start(timeout=300)

    async def run():
        q: asyncio.Queue = asyncio.Queue()
        for n in (3, 5):
            loop.submit(
                ("prompt", [1, 2, 3]), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), q
            )
        finals = [await asyncio.wait_for(q.get(), 120) for _ in range(2)]
        return finals

    try:
        finals = asyncio.run(run())
    finally:
        loop.stop()
    assert sorted(o.num_tokens for o in finals) == [3, 5]
    trace = StepTrace.load(str(path))
    assert len(trace.arrivals) == len(trace.posted) == len(trace.finishes) == 2
    # the server's send times, on the clock the engine process shares: before the engine took them
    assert all(0 <= a - p < 60 for a, p in zip(trace.arrivals, trace.posted))
    assert summary(trace)["wait"] >= 0
    assert sum(r[5] for r in trace.rows) == 2
    assert {r[2] for r in trace.rows} <= {"decode", "prefill", "verify"} and trace.rows[0][2] == "prefill"
