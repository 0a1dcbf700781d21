"""Warm-up at construction (CUDA): no step compiles a sampling kernel mid-run, and the
variants compile on threads at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.warmup import SAMPLE_KINDS, run_calls


def test_run_calls_runs_each_call_once_and_raises_a_calls_error():
    """Off CUDA the calls run in order on this thread (nothing is compiled there)."""
    seen = []

    def call(i):
        seen.append((i, threading.current_thread() is threading.main_thread()))
        if i == 2:
            raise RuntimeError("variant 2 failed")

    calls = [lambda i=i: call(i) for i in range(4)]
    run_calls(calls[:2] + calls[3:], torch.device("cpu"), workers=8)
    assert seen == [(0, True), (1, True), (3, True)]
    with pytest.raises(RuntimeError, match="variant 2 failed"):
        run_calls(calls, torch.device("cpu"), workers=8)


_THREADED = """
import os, sys, tempfile
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # nothing compiled yet
import torch
from deepinfer.warmup import run_calls, sampling_calls, verify_calls
dev = torch.device("cuda")
calls = sampling_calls(1000, dev) + verify_calls(1000, dev)
got = []
run_calls([lambda c=c: got.append(c()) for c in calls], dev, workers=4)
again = [c() for c in calls]  # compiled now: the kernels the threads built, launched again
assert len(got) == len(calls)
key = lambda out: [t.tolist() if isinstance(t, torch.Tensor) else t for t in out]
assert sorted(map(str, map(key, got))) == sorted(map(str, map(key, again)))
print("ok", len(calls))
"""


@pytest.mark.gpu
def test_variants_compile_on_threads_in_a_fresh_cache():
    """Every variant compiles on four threads at once with an empty Triton cache, and the
    kernels they built give the same outputs when launched again."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    out = subprocess.run(
        [sys.executable, "-c", _THREADED], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "ok"


@pytest.mark.gpu
def test_a_call_failing_on_a_thread_runs_again_in_turn(caplog):
    """A call that fails on a thread (here its first time only) makes every call run again
    one after another, with a warning; one that fails in turn too raises."""
    import logging

    tries = {i: 0 for i in range(6)}

    def call(i):
        tries[i] += 1
        if i == 3 and tries[i] == 1:
            raise RuntimeError("variant 3 failed once")

    dev = torch.device("cuda")
    with caplog.at_level(logging.WARNING, logger="deepinfer"):
        run_calls([lambda i=i: call(i) for i in tries], dev, workers=3)
    assert tries == {0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2}
    assert (
        "compiling 6 kernel variants on 3 threads failed (RuntimeError: variant 3 failed once)" in caplog.text
    )

    def broken():
        raise RuntimeError("variant broken")

    with pytest.raises(RuntimeError, match="variant broken"):
        run_calls([broken, lambda: None], dev, workers=2)


@pytest.mark.gpu
def test_no_sampling_kernel_compiles_after_construction(tiny_folder, monkeypatch_session):
    from triton import knobs

    llm = LLM(tiny_folder[0], dtype="float32", device="cuda", seed=0, max_num_seqs=4, max_model_len=512)
    compiled = []

    def hook(*, fn, **_):
        compiled.append(f"{fn.module}.{fn.name}")

    old, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        # every kind of row set, alone and beside constrained rows, and a constrained row alone
        for t, k, p, mp in SAMPLE_KINDS.values():
            free = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=mp, seed=1, max_tokens=3)
            regex = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=mp, seed=1, max_tokens=3,
                                   regex="[ab]{3}")  # fmt: skip
            for params in ([free, free], [regex, regex], [free, regex]):
                llm.generate([[1, 5, 9], [1, 7]], params, use_tqdm=False)
    finally:
        knobs.runtime.jit_cache_hook = old
    assert [c for c in compiled if ".sample" in c] == []


@pytest.mark.gpu
def test_step_times_cover_every_graph_a_verify_step_may_replay(tiny_folder, monkeypatch_session, caplog):
    """Warm-up times the decode graph at every row count, those past the largest batch too (a
    ragged verify step replays them), and each verify width at every batch bucket; it logs
    each phase (INFO, the ``deepinfer`` logger)."""
    import logging

    from deepinfer.cuda_graphs import batch_buckets
    from deepinfer.warmup import verify_widths

    with caplog.at_level(logging.INFO, logger="deepinfer"):
        llm = LLM(tiny_folder[0], dtype="float32", device="cuda", seed=0, max_num_seqs=4, max_model_len=512)
    said = " | ".join(r.getMessage() for r in caplog.records)
    for phase in ("CUDA graphs at batch 1: ", "captured ", "compiled the sampler's and verifier's variants",
                  f"timed {len(llm.step_times)} step shapes"):  # fmt: skip
        assert phase in said, said
    runner = llm.runner
    assert runner.graph_rows > runner.max_rows and llm._ragged_tokens() == runner.graph_rows
    decode = {rows for path, rows, _ in llm.step_times if path == "decode"}
    assert decode == set(runner.buckets()) and max(decode) == runner.graph_rows
    widths = verify_widths(llm.dspark.config.max_drafts)
    verify = {(rows, T) for path, rows, T in llm.step_times if path == "verify"}
    assert verify == {(rows, T) for rows in batch_buckets(runner.max_rows) for T in widths}
    assert all(t > 0 for t in llm.step_times.values())
