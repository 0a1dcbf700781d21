"""Warm-up at construction (CUDA): no step compiles a sampling kernel mid-run."""

from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.warmup import SAMPLE_KINDS

pytestmark = pytest.mark.gpu


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
