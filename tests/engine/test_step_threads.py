"""The CPU's threads step by step (deepinfer/_threads.py, StepThreads): every core while no
other process keeps one busy and the step's mask work is a small share of it; the base count
otherwise; fixed where the user set it. The machine's load is fed in through its reading, the
clock stepped."""

from __future__ import annotations

import re

import pytest
import torch

from deepinfer import _threads


class Machine:
    """A fake /proc/stat and clocks: ``run(seconds, others, ours)`` advances them."""

    def __init__(self, monkeypatch):
        self.busy, self.now, self.own = 100.0, 0.0, 1.0
        monkeypatch.setattr(_threads, "_busy_seconds", lambda: self.busy)
        monkeypatch.setattr(_threads, "cpu_count", lambda: 2)

    def run(self, seconds: float, others: float, ours: float = 1.0) -> None:
        """``others``, ``ours``: cores busy on average (other processes, this one)."""
        self.now += seconds
        self.own += ours * seconds
        self.busy += (others + ours) * seconds


@pytest.fixture
def machine(monkeypatch):
    monkeypatch.delenv("DEEPINFER_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    m = Machine(monkeypatch)
    yield m
    torch.set_num_threads(threads)


def _policy(m: Machine) -> _threads.StepThreads:
    p = _threads.StepThreads(window=0.25)
    p.base = p.current = 1
    p.enabled = True
    p._clock, p._cpu = (lambda: m.now), (lambda: m.own)
    p._t, p._own, p._busy = m.now, m.own, m.busy
    return p


def test_every_core_while_the_other_is_idle(machine):
    p = _policy(machine)
    assert p.for_step(False) == 1  # no window measured yet: the base count
    machine.run(0.3, others=0.02)
    assert p.for_step(False) == 2 and torch.get_num_threads() == 2
    assert p.for_step(True) == 1  # a step with masks to fill leaves a core to them
    assert p.for_step(False, small=True) == 1  # a decode step of a few rows: one thread
    assert p.for_step(False) == 2
    machine.run(0.3, others=0.6, ours=1.8)  # a neighbour starts
    assert p.for_step(False) == 1 and torch.get_num_threads() == 1
    machine.run(0.3, others=0.2)  # below a quarter core but not below a tenth: still theirs
    assert p.for_step(False) == 1
    machine.run(0.3, others=0.05)
    assert p.for_step(False) == 2


def test_a_window_shorter_than_its_length_is_not_measured(machine):
    """The first window (from the policy's making, which spans the model's load) is
    ``first_window`` long; the later ones ``window``."""
    p = _policy(machine)
    machine.run(0.05, others=0.0)
    assert p.for_step(False) == 1  # no window yet: the spare core is the neighbours'
    machine.run(0.05, others=0.0)
    assert p.for_step(False) == 2  # the first window, 0.1 s of an idle machine
    machine.run(0.1, others=1.0)
    assert p.for_step(False) == 2  # 0.1 s of a busy neighbour: not a window any more
    machine.run(0.2, others=1.0)
    assert p.for_step(False) == 1


def test_fixed_where_the_user_set_threads(machine, monkeypatch):
    monkeypatch.setenv("DEEPINFER_NUM_THREADS", "1")
    p = _threads.StepThreads()
    assert not p.enabled
    machine.run(1.0, others=0.0)
    assert p.for_step(False) == p.current


def test_host_work_needs_a_core_only_as_a_share_of_the_step():
    assert not _threads.host_needs_core(0.0, 0.0)  # nothing measured: a prefill, every core
    assert not _threads.host_needs_core(0.1e-3, 45e-3)  # warm rows beside an 8-row step
    assert _threads.host_needs_core(5e-3, 45e-3)  # cold rows: a ninth of the step
    assert _threads.host_needs_core(0.2e-3, 1e-3)  # a step of a millisecond


def test_engine_leaves_every_core_to_a_step_whose_masks_are_light(tiny_llm):
    """The engine leaves every core to a process's first constrained step (its prefill, with no
    mask fill measured yet), then weighs the masks' recent time against the step's: warm rows
    of a small regex cost microseconds beside a step of milliseconds, so later steps get every
    core too, but for a step after a cold row where it is a large share."""
    from deepinfer import SamplingParams

    llm = tiny_llm
    policy = llm._step_threads
    seen = []
    real = policy.for_step

    def spy(host_work, small=False):
        seen.append((host_work, llm.masks.recent, llm._recent_step))
        return real(host_work, small)

    llm.masks.recent = llm._recent_step = 0.0
    policy.for_step = spy
    try:
        params = SamplingParams(regex="[ab]{60}", max_tokens=60, temperature=0, speculative=False)
        outs = llm.generate([[1, 5 + i, 9] for i in range(6)], [params] * 6, use_tqdm=False)
    finally:
        del policy.for_step
    assert all(re.fullmatch("[ab]{60}", o.text) for o in outs)
    assert seen[0] == (False, 0.0, 0.0)  # the first step: no fill measured, every core
    assert not all(host for host, _, _ in seen)  # light masks: some steps take every core
    for host, recent, step in seen:
        assert host == (recent > 0 and recent >= _threads.HOST_SHARE * step)
