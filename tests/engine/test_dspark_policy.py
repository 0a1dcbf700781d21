"""DSpark's policy (policy.py) against a measured cost model: with synthetic step timings it turns
drafting off where a verify step costs more than the tokens it is expected to add, on where it
pays, by batch size; probes stale shapes; and the engine keeps outputs identical either way."""

from __future__ import annotations

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.dspark import DSpark
from deepinfer.dspark.policy import (
    DRAFT_PROBE_MIN,
    PROBE_AGE,
    PROBE_GAP,
    PROBE_SHARE,
    YIELD_MIN,
    CostModel,
    StepTime,
    batch_bucket,
    choose,
    width_bucket,
)


def _measured(decode: dict, verify: dict, slope: float = 0.005) -> CostModel:
    """A CostModel fed synthetic step times: decode[B] seconds, verify[(B, T)] seconds."""
    m = CostModel(slope)
    for _ in range(5):
        for B, t in decode.items():
            m.observe("decode", B, t, rows=B, step=1)
        for (B, T), t in verify.items():
            m.observe("verify", B * T, t, rows=B, step=1)
    return m


def test_buckets_and_first_sample_dropped():
    assert [batch_bucket(b) for b in (1, 2, 3, 8, 9, 64)] == [1, 2, 4, 8, 16, 64]
    assert [width_bucket(t) for t in (1, 2, 4, 6, 9)] == [1, 2, 5, 9, 9]
    t = StepTime()
    assert not t.observe(5.0, 0) and not t.measured  # the first step of a shape (graph capture)
    t.observe(0.010, 1)
    t.observe(1.0, 2)  # an outlier: clipped to 3x the average
    assert t.measured and t.mean == pytest.approx(0.010 + 0.1 * 0.020)
    m = CostModel(0.005)
    m.observe("verify", 8 * 5, 9.0, rows=8, step=0)
    assert m.measured("verify", 8, 5) is None and m.fits["verify"].w == 0  # kept out of the fit too


def test_drafting_off_when_verify_too_expensive_on_when_it_pays():
    conf = [[0.9, 0.6, 0.4, 0.2]] * 8  # 2.1 expected extra tokens a row at T = 5
    cheap = _measured({8: 0.010}, {(8, 5): 0.015})  # verify 1.5x a decode step: 3.1 / 1.5 > 1
    c = choose(conf, cheap, 8192)
    assert c.T == 5 and c.gain == pytest.approx((8 + 8 * 2.1) / 0.015 / (8 / 0.010))
    costly = _measured({8: 0.010}, {(8, 5): 0.040, (8, 3): 0.035, (8, 2): 0.030})  # 3.1 / 4 < 1
    c = choose(conf, costly, 8192)
    assert c.T == 1 and not c.probe
    # a narrower width that pays is found when the wide one does not
    mid = _measured({8: 0.010}, {(8, 5): 0.040, (8, 2): 0.012})  # T = 2: 1.9 / 1.2 > 1
    assert choose(conf, mid, 8192).T == 2


def test_plain_step_probed_before_verifying_on_a_guess():
    """With only verify steps measured at a batch, the plain step's time there is a guess (a fit
    from verify steps): choose decodes plainly (a probe) until it is measured, then compares."""
    conf = [[0.9, 0.6, 0.4, 0.2]] * 64
    m = _measured({}, {(64, 5): 0.018, (64, 2): 0.016})
    first = choose(conf, m, 8192, step=10)
    assert first.T == 1 and first.probe
    for step in (11, 12):
        m.observe("decode", 64, 0.0088, rows=64, step=step)
    c = choose(conf, m, 8192, step=13, last_probe=10)
    # measured: 64 / 8.8 ms plain vs (64 + 64 * 2.1) / 18 ms at T = 5
    assert c.T == 5 and not c.probe and c.gain == pytest.approx((64 + 64 * 2.1) / 0.018 / (64 / 0.0088))
    # stale again after PROBE_AGE steps: probed once, then not again within PROBE_GAP
    late = 12 + PROBE_AGE + 1
    assert choose(conf, m, 8192, step=late, last_probe=13).probe
    assert choose(conf, m, 8192, step=late + 1, last_probe=late).T == 5


def test_decision_follows_batch_size():
    """GPU-like timings: at batch 1 a verify step costs about a decode step (weight reads
    dominate), at batch 64 it costs 2-3x (compute): drafts pay at batch 1 and not at batch 64."""
    cost = _measured({1: 0.007, 64: 0.012}, {(1, 5): 0.0075, (64, 5): 0.040, (64, 3): 0.032, (64, 2): 0.023})
    assert choose([[0.9, 0.6, 0.4, 0.2]], cost, 8192).T == 5
    assert choose([[0.9, 0.6, 0.4, 0.2]] * 64, cost, 8192).T == 1
    assert choose([[0.99] * 4] * 64, cost, 8192).T == 5  # near-certain drafts: 4.96 / 3.3 > 1


def test_stale_or_unmeasured_shapes_are_probed_sparingly():
    conf = [[0.9, 0.6, 0.4, 0.2]] * 8
    cost = _measured({8: 0.010}, {(8, 5): 0.040, (8, 3): 0.035, (8, 2): 0.030})
    assert choose(conf, cost, 8192, step=10, last_probe=-1000).T == 1  # measured recently: no probe
    old = 1 + PROBE_AGE + 1
    c = choose(conf, cost, 8192, step=old, last_probe=old - PROBE_GAP)
    assert c.probe and c.T == 5  # measured long ago: probed (the widest shape with drafts)
    assert choose(conf, cost, 8192, step=old, last_probe=old - 1).T == 1  # at most one per PROBE_GAP
    fresh = _measured({8: 0.010}, {})  # verify never measured: the fit's prior says no (slope 10)
    fresh.slope = 10.0
    fresh.fits["verify"].slope = fresh.fits["decode"].slope = 10.0
    assert choose(conf, fresh, 8192, step=5, last_probe=5).T == 1
    assert choose(conf, fresh, 8192, step=5 + PROBE_GAP, last_probe=5).probe
    assert choose([[]] * 8, cost, 8192, step=old, last_probe=-1000).T == 1  # nothing to draft: no probe


class _Synthetic(CostModel):
    """Step times from formulas, measurements ignored, every shape measured just now."""

    def __init__(self, decode, verify):
        super().__init__(0.005)
        self.decode, self.verify = decode, verify

    def observe(self, *a, **k):
        pass

    def measured(self, path, B, T):
        t = StepTime()
        t.samples, t.last = 2, 1 << 40
        return t

    def step_seconds(self, path, B, T):
        return self.decode(B) if path == "decode" else self.verify(B, width_bucket(T))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tiny_folder, monkeypatch_session):
    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0)


def test_engine_falls_back_to_plain_decode_when_verify_does_not_pay(tiny):
    prompts = [[1, 5, 9, 5, 9], [1, 7, 7, 7, 7], [1, 300, 301], [1, 42, 43, 44]]
    params = [SamplingParams(temperature=0 if i % 2 else 0.9, seed=i, max_tokens=24, json_schema=SCHEMA)
              for i in range(4)]  # fmt: skip
    tiny.dspark = DSpark(False)
    base = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
    runs = {}
    for name, verify in (
        ("costly", lambda B, T: 0.001 * (1 + T)),
        ("cheap", lambda B, T: 0.001 * (1 + 0.01 * T)),
    ):
        d = tiny.dspark = DSpark(True)
        d._cost = _Synthetic(lambda B: 0.001, verify)
        outs = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
        assert outs == base, name  # lossless either way
        runs[name] = d.stats
    assert runs["costly"].verify_steps == 0 and runs["costly"].decode_steps > 0
    assert runs["cheap"].verify_steps > 0 and sum(runs["cheap"].accepted) > 0


def test_may_pay_upper_bound_and_realized_tokens():
    """Drafting is skipped before any draft is made when no verify shape can beat a plain step
    even with every draft accepted, or (once measured) at the bucket's realized tokens."""
    cost = _measured({64: 0.012}, {(64, 2): 0.030, (64, 3): 0.040, (64, 5): 0.065, (64, 9): 0.120})
    assert not cost.may_pay(64, 8, 1 << 20)  # even B * T tokens: 9 / (0.120 / 0.012) < 1
    cost = _measured({64: 0.012}, {(64, 2): 0.016, (64, 3): 0.020, (64, 5): 0.030, (64, 9): 0.050})
    assert cost.may_pay(64, 8, 1 << 20)  # all accepted at T = 9: 9 / 4.2 > 1
    assert not cost.may_pay(64, 8, 64)  # the token budget allows no verify shape
    for _ in range(YIELD_MIN):  # verify steps at batch 64 realized 1.1 tokens a row, expected 3
        cost.observe_tokens(64, 64 * 3.0, 64 * 1.1)
    assert cost.realized_per_row(64) == pytest.approx(1.1)
    assert not cost.may_pay(64, 8, 1 << 20)  # 1 + 1.5 * 0.1 = 1.15 a row cannot pay
    assert cost.may_pay(8, 8, 1 << 20) or cost.realized_per_row(8) is None  # other buckets unaffected


def test_choose_calibrates_confidence_by_realized_tokens():
    conf = [[0.9, 0.6, 0.4, 0.2]] * 8  # 2.1 expected extra a row at T = 5
    cost = _measured({8: 0.010}, {(8, 5): 0.020, (8, 3): 0.019, (8, 2): 0.018})
    c = choose(conf, cost, 8192)
    assert c.T == 5 and c.expected == pytest.approx(8 + 8 * 2.1)
    for _ in range(YIELD_MIN):  # realized a quarter of the extra tokens expected
        cost.observe_tokens(8, 8 * 3.1, 8 * (1 + 2.1 / 4))
    assert cost.calibration(8) == pytest.approx(0.25)
    assert choose(conf, cost, 8192).T == 1  # (1 + 0.525) / 2 < 1: plain decode


def test_plain_steps_make_no_drafts_and_take_the_off_path(tiny, monkeypatch):
    """A step where drafting cannot pay calls no draft source and runs ``runner.step`` exactly
    as the off mode does (same call count, same rows); outputs are identical."""
    import deepinfer.dspark.dspark as dspark_mod

    prompts = [[1, 5, 9, 5, 9], [1, 7, 7, 7, 7], [1, 300, 301], [1, 42, 43, 44]]
    params = [SamplingParams(temperature=0 if i % 2 else 0.9, seed=i, max_tokens=16, json_schema=SCHEMA)
              for i in range(4)]  # fmt: skip
    calls = {"decode": [], "propose": 0}
    step = tiny.runner.step

    def counted_decode(seqs, counts):
        calls["decode"].append(len(seqs))
        return step(seqs, counts)

    real_propose = dspark_mod.propose

    def counted_propose(*a, **k):
        calls["propose"] += 1
        return real_propose(*a, **k)

    monkeypatch.setattr(tiny.runner, "step", counted_decode)
    monkeypatch.setattr(dspark_mod, "propose", counted_propose)
    tiny.dspark = DSpark(False)
    base = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
    off_decodes, calls["decode"] = calls["decode"], []
    assert calls["propose"] == 0
    d = tiny.dspark = DSpark(True)
    d._cost = _Synthetic(lambda B: 0.001, lambda B, T: 0.001 * 2 * T)  # all accepted: T / 2T < 1
    d._last_probe = d._last_draft_probe = 1 << 30  # no probe due during the run
    outs = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
    assert outs == base
    assert calls["propose"] == 0 and d.stats.drafting_steps == 0 and d.stats.verify_steps == 0
    assert d.stats.skipped >= d.stats.decode_steps - 1 > 0  # the last: no room for a draft at all
    assert calls["decode"] == off_decodes  # the off mode's decode path, step for step
    # a probe is still due now and then: then it drafts
    d = tiny.dspark = DSpark(True)
    d._cost = _Synthetic(lambda B: 0.001, lambda B, T: 0.001 * 2 * T)
    assert [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)] == base
    assert calls["propose"] > 0 and d.stats.drafting_steps >= 1


def test_device_times_from_warm_up_stand_in_for_unmeasured_shapes():
    """Warm-up device times (``seed``) plus the host overhead measured decode steps show: no
    shape is unmeasured, so nothing is probed for its cost; a stale one is probed only where it
    is predicted close to paying."""
    cost = _measured({8: 0.012}, {})
    cost.seed("decode", 8, 1, 0.010)
    cost.seed("verify", 8, 5, 0.030)
    cost.seed("verify", 8, 3, 0.030)
    cost.seed("verify", 8, 2, 0.011)
    assert cost.step_seconds("verify", 8, 5) == pytest.approx(0.032)  # 2 ms of host overhead
    assert cost.last_seen("verify", 8, 5) == -1 and cost.last_seen("verify", 64, 5) is None
    conf = [[0.05, 0.01, 0.0, 0.0]] * 8  # drafts the model rejects
    assert choose(conf, cost, 8192, step=10, last_probe=-1000).T == 1  # no probe: timed at warm-up
    c = choose(conf, cost, 8192, step=PROBE_AGE + 10, last_probe=-1000)
    assert c.probe and c.T == 2  # stale: probed at the width predicted near paying, not at T = 5


def test_drafting_switched_off_for_the_batch_once_measured_not_to_pay():
    """Steps that drafted, all their costs in (drafts, matchers, verify or plain forward), are
    compared with plain steps per batch bucket: drafting stops where it does not pay."""
    cost = _measured({64: 0.010}, {})
    assert cost.drafting_pays(64) is None
    for _ in range(YIELD_MIN + 1):  # the first is dropped
        cost.observe_drafting(64, 64, 0.013)  # a token a row, slower than a plain step
    assert cost.drafting_pays(64) is False and cost.drafting_pays(8) is None
    assert cost.drafting_gap(64) == pytest.approx(0.3 / PROBE_SHARE, abs=1)  # 0.3 plain steps extra
    for _ in range(20):
        cost.observe_drafting(64, 64, 0.060)  # a drafting step costs 5 extra plain steps
    assert cost.drafting_gap(64) == pytest.approx(5 / PROBE_SHARE, rel=0.05)  # probes cost <= 1%
    for _ in range(20):
        cost.observe_drafting(64, 3 * 64, 0.015)  # three tokens a row for 1.5x the time
    assert cost.drafting_pays(64) is True


def test_drafting_probes_are_frequent_where_they_cost_little():
    """At batch 1 a drafting step costs a plain step and a little host work, so where drafting
    stopped paying (a request writing a free string: nothing forced, nothing to copy) it is
    probed again within a few steps, and one probe that verifies well (the request back in
    structure) opens the gate: a request's next forced run is not decoded plainly for 64 steps."""
    cost = _measured({1: 0.00466}, {})
    for _ in range(YIELD_MIN + 1):
        cost.observe_drafting(1, 3, 0.0053)  # in structure: three tokens a step
    for _ in range(20):
        cost.observe_drafting(1, 1, 0.0051)  # a free string: a token a step and the drafting cost
    assert cost.drafting_pays(1) is False
    gap = cost.drafting_gap(1)
    assert DRAFT_PROBE_MIN <= gap <= 10 < PROBE_GAP  # 0.09 plain steps a probe: probed every ~9 steps
    cost.observe_drafting(1, 3, 0.0053)  # a probe back in structure
    assert cost.drafting_pays(1) is True


def test_a_bucket_s_first_drafting_step_is_dropped():
    """The first drafting step of a batch bucket carries one-time work: like a shape's first step
    time, it is not what later drafting steps cost, so it does not count."""
    cost = _measured({8: 0.005}, {})
    cost.observe_drafting(8, 8, 0.200)  # first: 40 plain steps of set-up, a token a row
    for _ in range(YIELD_MIN):
        cost.observe_drafting(8, 24, 0.008)  # three tokens a row for 1.6x a plain step
    assert cost.drafting_pays(8) is True


def test_a_larger_batch_inherits_that_drafting_did_not_pay_at_a_smaller_one():
    """A batch filling up passes through buckets it never drafted at: where drafting was measured
    not to pay at a smaller batch, a larger one is not drafted at to learn it again (its verify
    forward costs more a row, and a row gains the same tokens), and its probes are spaced by the
    smaller batch's measured cost. A smaller batch learns nothing from a larger one."""
    cost = _measured({32: 0.010, 64: 0.012, 128: 0.014}, {})
    for _ in range(YIELD_MIN + 1):
        cost.observe_drafting(32, 32, 0.060)  # a token a row for 5 extra plain steps
    assert cost.drafting_pays(32) is False
    assert cost.drafting_pays(64) is False and cost.drafting_pays(128) is False
    assert cost.drafting_gap(32) == pytest.approx(5 / PROBE_SHARE, rel=0.05)
    assert cost.drafting_gap(64) == pytest.approx(2 * 5 / PROBE_SHARE, rel=0.05)  # twice the rows
    assert cost.drafting_pays(8) is None and cost.drafting_gap(8) == PROBE_GAP
    for _ in range(YIELD_MIN + 1):
        cost.observe_drafting(128, 3 * 128, 0.016)  # measured at 128 itself: three tokens a row pay
    assert cost.drafting_pays(128) is True and cost.drafting_pays(64) is False


def test_stays_closed_says_when_the_next_gate_closes_without_a_look():
    """Async scheduling launches a plain step ahead for drafting requests only when the next
    gate closes whatever the rows: drafting measured not to pay at that batch, no probe due."""
    d = DSpark(True)
    assert not d.stays_closed(64)  # nothing measured yet
    d._cost = cost = _measured({64: 0.010}, {})
    assert not d.stays_closed(64)  # drafting not measured at this batch: the gate looks
    for _ in range(YIELD_MIN + 1):
        cost.observe_drafting(64, 64, 0.060)  # a token a row for 5 extra plain steps
    gap = cost.drafting_gap(64)
    assert cost.drafting_pays(64) is False and gap > 2
    d._step, d._last_draft_probe = 100, 100 - gap + 2
    assert d.stays_closed(64)
    d._step = 100 + gap  # a probe is due next step
    assert not d.stays_closed(64)
    assert not DSpark({"schedule": "fixed"}).stays_closed(64)


def _h100_like() -> CostModel:
    """Warm-up device times shaped like the H100's at Llama-3-8B shape and batch 64: decode
    graphs of 64..128 rows cost 6.4..7.1 ms, a padded verify graph of width 3 8.2 ms."""
    cost = CostModel(0.005)
    for rows, ms in ((32, 6.2), (48, 6.3), (64, 6.4), (80, 6.6), (96, 6.8), (128, 7.1), (192, 8.0)):
        cost.seed("decode", rows, 1, ms / 1e3)
    for T, ms in ((2, 7.6), (3, 8.2), (5, 9.9)):
        cost.seed("verify", 64, T, ms / 1e3)
    return cost


def test_ragged_step_verifies_the_most_confident_drafts():
    """64 rows, 30 with two confident drafts and 34 with one doubtful one: a padded width-3
    step feeds 192 positions (8.2 ms); a ragged one feeds the 60 confident drafts and nothing
    for the rest (124 tokens: the 128-row decode graph, 7.1 ms) and promises more."""
    cost = _h100_like()
    conf = [[0.9, 0.8]] * 30 + [[0.05]] * 34
    padded = choose(conf, cost, 8192)
    assert padded.T == 3 and padded.counts is None
    assert padded.gain == pytest.approx((64 + 30 * 1.7 + 34 * 0.05) / 0.0082 / (64 / 0.0064))
    c = choose(conf, cost, 8192, ragged=320)
    # the 128-row graph holds 4 tokens more than the confident drafts: the first doubtful ones
    assert c.counts == [2] * 30 + [1] * 4 + [0] * 30 and c.T == 3
    assert c.expected == pytest.approx(64 + 30 * 1.7 + 4 * 0.05)
    assert c.gain == pytest.approx((64 + 30 * 1.7 + 0.2) / 0.0071 / (64 / 0.0064))
    conf = [[0.9, 0.8]] * 30 + [[0.05]] * 30 + [[0.06]] * 4  # the best of the doubtful ones
    assert choose(conf, cost, 8192, ragged=320).counts == [2] * 30 + [0] * 30 + [1] * 4
    c = choose(conf, cost, 96, ragged=320)  # the token budget: the 96-row graph, 32 drafts
    assert c.counts == [2, 2] + [1] * 28 + [0] * 34 and c.expected == pytest.approx(64 + 27 + 1.6)
    assert choose([[]] * 64, cost, 8192, ragged=320).T == 1  # nothing drafted


def test_ragged_counts_are_each_row_s_best_prefix():
    """Whatever the confidences, the drafts a ragged step takes are each row's first ones (a
    draft counts only after the ones before it), the most confident of all rows, within the
    graph size chosen."""
    import random

    rng = random.Random(0)
    cost = _h100_like()
    for _ in range(200):
        B = rng.choice([8, 33, 64])
        conf = []
        for _ in range(B):
            g, row = 1.0, []
            for _ in range(rng.randrange(0, 6)):
                g *= rng.choice([0.3, 0.9, 0.99, 1.0])
                row.append(g)
            conf.append(row)
        c = choose(conf, cost, 8192, ragged=320, probes=False)
        if c.counts is None:
            continue
        assert all(0 <= k <= len(g) for k, g in zip(c.counts, conf))
        taken = [x for g, k in zip(conf, c.counts) for x in g[:k]]
        left = [x for g, k in zip(conf, c.counts) for x in g[k:]]
        assert not left or min(taken) >= max(left)  # no draft left out is more confident
        assert B + len(taken) <= 320 and c.T == max(c.counts) + 1


def test_ragged_steps_are_measured_by_their_graph_size():
    """A ragged step's time is kept by (batch bucket, decode graph rows): it stands in for the
    warm-up's device time plus a verify step's host overhead."""
    cost = _h100_like()
    assert cost.ragged_bucket(65) == 80 and cost.ragged_bucket(124) == 128 and cost.ragged_bucket(300) == 512
    assert cost.ragged_seconds(64, 124) == pytest.approx(0.0071)  # no host overhead measured yet
    for step in range(3):
        cost.observe("decode", 64, 0.0069, rows=64, step=step)  # 0.5 ms of host overhead a step
    assert cost.ragged_seconds(64, 124) == pytest.approx(0.0076)
    for step in range(3):
        cost.observe("ragged", 120, 0.0085, rows=64, step=step)  # the first is dropped
    assert cost.ragged_seconds(64, 100) == pytest.approx(0.0085)  # the same 128-row graph
    assert cost.ragged_seconds(64, 96) == pytest.approx(0.0068 + 0.0014)  # a verify step's overhead
    assert cost.fits["verify"].w > 0  # and the verify fit learns from it


def test_may_pay_counts_ragged_steps():
    """Where no padded width can pay, a ragged step spreading the drafts over the rows still
    may: drafting is not skipped before its drafts are seen."""
    cost = _h100_like()
    cost.seed("verify", 64, 9, 0.020)
    assert not cost.may_pay(64, 8, 1 << 20, rate=0.15)  # padded: at best 1.15 tokens for 7.6 / 6.4
    assert cost.may_pay(64, 8, 1 << 20, rate=0.15, ragged=320)  # 16 drafts at 0.15 for 6.6 / 6.4
    assert not cost.may_pay(64, 8, 1 << 20, rate=0.05, ragged=320)
    assert not cost.may_pay(64, 8, 64, rate=0.15, ragged=320)  # no token budget for a draft
