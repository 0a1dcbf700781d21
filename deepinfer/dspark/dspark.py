"""DSpark: the engine's speculative decoding, called from the decode branch of ``LLM.step``.

Per decode step: ``plan`` proposes drafts for every request that speculates (grammar-forced
tokens, n-gram copies from the prompt and output) and chooses how many positions to verify
(``policy.choose``); None means a plain decode step. ``step`` then launches the
multi-position forward it is given (``ModelRunner.verify``), writes each position's bitmask
while it runs (``Verifier``), verifies all rows in one kernel launch, and feeds the emitted
tokens to the sequences.
Both take plain inputs (sequences, sizes, the tokenizer, a forward callable), not the ``LLM``.

Lossless: every emitted token is the target model's own choice at its position (greedy argmax,
or its seeded sample with the same random numbers plain decoding would use), so outputs equal
plain decoding's, token for token, whenever the multi-position forward's logits equal the
one-position decode's. They agree up to float rounding (a different matmul shape): measured on
the embedded model on CPU, max |logit difference| 5e-5 in float32 and 0.5 in bfloat16, so a
near-tie can break the other way, as it can when the batch size changes. In deterministic mode
(``LLM(deterministic=True)``), which promises bit-identical tokens whatever the batch, DSpark
is off: its multi-position forward is not the batch-invariant decode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch

from .. import kernels
from .config import DSparkConfig
from .drafts import FORCED, NGRAM, Drafts, NgramIndex, forced_tokens, propose
from .policy import CostModel, RequestStats, choose
from .verify import Verifier

DEVICE_SLOPE = {"cpu": 0.2, "cuda": 0.005}
PREFERRED_SIZE = 4096  # forced tokens whose model-preferred replacement is remembered
RETIRED_MOST = 1024  # finished requests' state kept for a forward to free it behind (``_forget``)


@dataclass
class DSparkStats:
    """Counters since the last ``reset`` (benchmarks read them)."""

    verify_steps: int = 0  # steps that ran a verify forward
    decode_steps: int = 0  # decode steps left plain (no draft worth verifying, or none speculating)
    rows: int = 0  # row-steps verified
    plain_rows: int = 0  # row-steps decoded plainly
    positions: int = 0  # row-positions in verify forwards (B * T summed; a ragged step's tokens)
    ragged_steps: int = 0  # of the verify steps, those ragged (each row only its own drafts)
    drafted: list[int] = field(default_factory=lambda: [0, 0])  # by source: FORCED, NGRAM
    accepted: list[int] = field(default_factory=lambda: [0, 0])
    rejected: list[int] = field(default_factory=lambda: [0, 0])  # the first rejected draft's source
    kind_accepted: list[int] = field(default_factory=lambda: [0] * 5)  # by confidence class (drafts.K_*)
    kind_rejected: list[int] = field(default_factory=lambda: [0] * 5)
    emitted: int = 0  # tokens emitted by verify steps (accepted drafts + bonus)
    probes: int = 0  # verify steps taken to measure a shape predicted not to pay
    drafting_steps: int = 0  # steps that made drafts (verified or not)
    skipped: int = 0  # plain steps decided before drafting (drafting could not pay)
    draft_seconds: float = 0.0  # host time making drafts (``plan``)
    verify_seconds: float = 0.0  # host time of verify steps (``step``: masks, forward, kernel, tokens)
    mask_wait_seconds: float = 0.0  # of it, after the launch, getting the bitmasks (inline: filling them)
    verify_sync_seconds: float = (
        0.0  # of it, from the kernel's launch to its results read back (the forward's end)
    )
    accept_hist: dict[tuple[int, int], int] = field(default_factory=dict)  # (drafts, accepted) -> rows

    def reset(self) -> None:
        fresh = DSparkStats()
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    @property
    def tokens_per_row_step(self) -> float:
        """Tokens a row gains per verify step (1.0 = plain decoding)."""
        return self.emitted / self.rows if self.rows else 1.0

    def acceptance(self, source: int) -> float:
        """P(a draft of this source is accepted | the drafts before it were)."""
        seen = self.accepted[source] + self.rejected[source]
        return self.accepted[source] / seen if seen else float("nan")


@dataclass
class Plan:
    seqs: list
    drafts: list[Drafts]
    T: int  # positions per row (drafts + 1)
    expected: float | None = None  # tokens the policy expected (None: schedule "fixed")
    ragged: bool = False  # each row feeds only its own drafts (``ModelRunner.verify``'s ``ragged``)


class _Request:
    __slots__ = ("stats", "index", "stop_ids", "history", "prompt_len")

    def __init__(
        self,
        config: DSparkConfig,
        s,
        stop_ids: frozenset[int],
        prior: RequestStats,
        index: NgramIndex | None = None,
    ) -> None:
        self.stats = RequestStats(prior)
        self.index = index or NgramIndex(config.ngram_min, config.ngram_max)  # (prompt indexed ahead)
        self.stop_ids = stop_ids
        self.history = list(s.prompt_token_ids)  # prompt + output, extended as the output grows
        self.prompt_len = len(self.history)

    def tokens(self, s) -> list[int]:
        out = s.output_token_ids
        self.history.extend(out[len(self.history) - self.prompt_len :])
        return self.history


class DSpark:
    """Speculative decoding for one LLM: settings, per-request draft statistics, cost model."""

    verifier_class = Verifier  # what makes a step's bitmasks and kernel inputs (a subclass may watch it)
    # Does the engine index new prompts for n-gram lookup behind a prefill's forward
    # (``index_prompts``)? None: on CUDA, where the host waits for that forward; on the CPU the
    # forward is the host's own work, and a request's first drafting step indexes its prompt.
    index_ahead: bool | None = None

    def __init__(self, config: bool | dict | DSparkConfig = True) -> None:
        self.config = DSparkConfig.parse(config)
        self.stats = DSparkStats()
        self.verify_fn = kernels.verify  # backend "auto": Triton on CUDA, torch reference on CPU
        self._requests: dict[int, _Request] = {}
        self._indexed: dict[int, NgramIndex] = {}  # prompts indexed ahead, by request id (``index_prompts``)
        # requests' state dropped by ``_forget``, freed behind the next forward (an n-gram index
        # of a long prompt is thousands of tuples: about 50 µs to free)
        self._retired: list = []
        self._overall = RequestStats()  # every request's observations: the prior of new ones
        self._preferred: dict[int, int] = {}  # first forced token -> the model's token instead
        self._cost: CostModel | None = None
        self._verifier: Verifier | None = None
        # previous step: start time, path, tokens in its forward, request ids, rows
        self._last: tuple[float, str, int, frozenset[int], int] | None = None
        self._step = 0
        self._last_probe = -(1 << 30)  # step of the last probe of a verify shape (policy.choose)
        self._last_draft_probe = -(1 << 30)  # step of the last drafting step ``gate`` let through
        self._gated: tuple[int, bool] = (-1, False)  # (step, may it draft) of the last ``gate``
        self._drafted: list | None = None  # [gate time, tokens emitted] of a step that drafted
        self._gate_at = 0.0
        self._ids: frozenset = frozenset()  # request ids of the batch ``gate`` last saw

    # -- which requests ---------------------------------------------------------------------
    def speculates(self, s) -> bool:
        """Does request ``s`` draft? Its ``speculative`` if set, else the LLM's default (never
        when it asks for logprobs, which the verify step does not compute)."""
        if getattr(s.params, "logprobs", None) is not None:
            return False
        sp = getattr(s.params, "speculative", None)
        if sp is not None:
            return bool(sp)
        d = self.config.default
        return d == "all" or (d == "constrained" and s.constraint is not None)

    def indexes_ahead(self, device_type: str) -> bool:
        """Should the engine call ``index_prompts`` behind a prefill's forward on this device?"""
        return self.index_ahead if self.index_ahead is not None else device_type == "cuda"

    def index_prompts(self, running: list) -> None:
        """Index for n-gram lookup the prompt of every request of ``running`` that speculates,
        whose prompt is computed, and that has no index yet: the work a request's first drafting
        step would otherwise do (a dict entry per prompt position and n-gram length, about 3 µs a
        token, so tens of milliseconds for a batch of long prompts). The engine calls it after a
        prefill's launch, where the host waits for the device; the index is the one the first
        lookup would build. Indexes of requests no longer running are dropped."""
        ids = {s.request_id for s in running}
        self._retired.clear()  # (behind the prefill's forward)
        done = self._indexed
        for rid in [r for r in done if r not in ids]:
            del done[rid]
        cfg = self.config
        for s in running:
            rid = s.request_id
            if rid in done or rid in self._requests or not self.speculates(s):
                continue
            prompt = s.prompt_token_ids
            if s.num_cached < len(prompt):  # (a chunked prompt: indexed once its last chunk runs)
                continue
            index = done[rid] = NgramIndex(cfg.ngram_min, cfg.ngram_max)
            index.extend(prompt)

    # -- one step -----------------------------------------------------------------------------
    def gate(
        self,
        running: list,
        *,
        cache_len: int,
        token_budget: int,
        device_type: str = "cpu",
        step_times: dict | None = None,
        ragged_tokens: int = 0,
    ) -> bool:
        """Called once per engine step, before scheduling: may this step draft? The previous
        decode step's time goes into the cost model first. False when no running request
        speculates, or when no verify step of this batch could beat a plain one even with its
        drafts accepted at the best rate any running request has seen (``CostModel.may_pay``),
        but for one drafting step every PROBE_GAP steps (more where a drafting step costs many
        plain ones: ``CostModel.drafting_gap``). The caller brings the matchers up to date
        before such a step only (drafts are walked from them); a plain step leaves that work
        deferred behind its forward, as the off mode does. ``cache_len``: positions a KV slot
        holds; ``token_budget``: most tokens in a step's forward; ``device_type`` sets the cost
        model's prior; ``step_times``: {(path, rows, positions): device seconds} of the step
        shapes, timed at warm-up (``seed``s the cost model, so no shape is probed mid-run);
        ``ragged_tokens``: most tokens a ragged verify step may feed (0: none; the LLM's
        ``_ragged_tokens``, from ``DSparkConfig.ragged`` and ``ModelRunner.ragged_tokens``)."""
        now = time.perf_counter()
        ids = self._ids = frozenset(s.request_id for s in running)
        cost = self._cost_model(device_type, step_times)
        if self._last is not None and ids <= self._last[3]:  # no prefill since: a clean interval
            t0, path, tokens, _, rows = self._last
            cost.observe(path, tokens, now - t0, rows=rows, step=self._step)
            if self._drafted is not None:  # that step drafted: what it got for all it cost
                cost.observe_drafting(rows, self._drafted[1], now - self._drafted[0])
            elif path == "decode":  # a plain step, timed the same way (gate to gate)
                cost.observe_drafting(rows, rows, now - self._gate_at, plain=True)
        self._last = self._drafted = None
        self._step += 1
        self._gate_at = now
        self._gated = (self._step, False)
        adaptive = self.config.schedule != "fixed"
        pays = cost.drafting_pays(len(running)) if adaptive else None  # measured, once drafted enough
        if pays is False and self._step - self._last_draft_probe < cost.drafting_gap(len(running)):
            # drafting does not pay at this batch and no probe is due: decided without a look at
            # the rows, so a closed gate costs a plain step a few microseconds at any batch size
            self.stats.skipped += 1
            return False
        left = [s.max_tokens - len(s.output_token_ids) - 1 for s in running if self.speculates(s)]
        if not left:
            return False
        kmax = min(self.config.max_drafts, min(cache_len - len(s) for s in running), max(left))
        if kmax <= 0:
            return False
        if adaptive and (
            pays is False
            or (
                pays is None
                and not cost.may_pay(
                    len(running), kmax, token_budget, self._best_rate(running), ragged=ragged_tokens
                )
            )
        ):
            if self._step - self._last_draft_probe < cost.drafting_gap(len(running)):
                self.stats.skipped += 1
                return False
            self._last_draft_probe = self._step  # draft now and then: ``choose`` may probe
        self._gated = (self._step, True)
        return True

    def stays_closed(self, rows: int) -> bool:
        """Will the next step's ``gate``, for a batch of ``rows``, close without a look at the
        rows: drafting measured not to pay at that batch, and no probe due (async scheduling
        launches a plain step ahead for drafting requests only then)? Never under the fixed
        schedule, nor before a step has gated."""
        if self.config.schedule == "fixed" or self._cost is None:
            return False
        cost = self._cost
        if cost.drafting_pays(rows) is not False:
            return False
        return self._step + 1 - self._last_draft_probe < cost.drafting_gap(rows)

    def plan(
        self,
        running: list,
        *,
        cache_len: int,
        token_budget: int,
        special_ids: frozenset[int] = frozenset(),
        device_type: str = "cpu",
        step_times: dict | None = None,
        ragged_tokens: int = 0,
    ) -> Plan | None:
        """Drafts for this decode step of ``running`` (the batch, in slot order), or None for a
        plain decode step. ``special_ids``: token ids that end a request's drafts besides its
        own stop ids (the tokenizer's specials and EOS); the other arguments as ``gate``'s,
        which runs first unless the engine ran it this step.

        A step ``gate`` closed makes no drafts at all: it runs exactly the off mode's path
        (``runner.step``: the decode CUDA graphs), and its time is measured from the end of
        this call, so the cost model compares against that path's own step time, not one that
        includes drafting. A verify step's time is measured from ``gate``."""
        if self._gated[0] != self._step or self._last is not None:  # gate not run for this step
            self.gate(running, cache_len=cache_len, token_budget=token_budget, device_type=device_type,
                      step_times=step_times, ragged_tokens=ragged_tokens)  # fmt: skip
        ids = self._ids  # gate's, when these rows are the batch it saw (they are a subset of it)
        if len(ids) != len(running):
            ids = frozenset(s.request_id for s in running)
        if not self._gated[1]:
            return self._plain(running, ids)
        now = self._gate_at
        cost = self._cost_model(device_type, step_times)
        spec = [self.speculates(s) for s in running]
        if not any(spec):
            return self._plain(running, ids)
        self._forget(ids)
        cfg = self.config
        room = min(cache_len - len(s) for s in running)  # positions L-1 .. L-1+T-1 fit the cache
        budget = token_budget
        self.stats.drafting_steps += 1
        t_draft = time.perf_counter()
        self._drafted = [now, len(running)]  # a plain step emits a token a row; ``step`` counts a verify
        drafts: list[Drafts] = []
        for s, on in zip(running, spec):
            k = min(cfg.max_drafts, s.max_tokens - len(s.output_token_ids) - 1, room)
            if not on or k <= 0:
                drafts.append(Drafts())
                continue
            r = self._request(s, special_ids)
            src = r.stats.sources
            ngram_on = src[NGRAM].enabled(self._step, cfg.min_acceptance)
            try:
                m = s.constraint.copy() if s.constraint is not None else None
                drafts.append(propose(
                    r.tokens(s), m, r.index if ngram_on else None, k,
                    forced=src[FORCED].enabled(self._step, cfg.min_acceptance), stop_ids=r.stop_ids,
                    preferred=self._preferred,
                ))  # fmt: skip
            except Exception:  # a matcher that fails here fails its request at on_token, not the batch
                drafts.append(Drafts())
        self.stats.draft_seconds += time.perf_counter() - t_draft
        if cfg.schedule == "fixed":
            T = min(max(len(d) for d in drafts) + 1, max(budget // len(running), 1))
            expected = counts = None
            if cfg.ragged and len(running) + sum(map(len, drafts)) <= ragged_tokens:  # every draft
                counts = [len(d) for d in drafts]
                T = max(counts) + 1
        else:
            conf = [self._requests[s.request_id].stats.confidence(d.kinds) if d else [] for s, d in
                    zip(running, drafts)]  # fmt: skip
            c = choose(conf, cost, budget, step=self._step, last_probe=self._last_probe,
                       ragged=ragged_tokens)  # fmt: skip
            T, expected, counts = c.T, c.expected, c.counts
            if c.probe:
                self._last_probe = self._step
                self.stats.probes += 1
                if T == 1:  # a plain step to measure plain steps: not drafting's outcome
                    self._drafted = None
        if T == 1:
            return self._plain(running, ids)
        if counts is not None:  # ragged: each row its own most confident drafts
            for d, k in zip(drafts, counts):
                d.truncate(k)
            self._last = (now, "ragged", len(running) + sum(counts), ids, len(running))
            return Plan(list(running), drafts, T, expected, ragged=True)
        for d in drafts:
            d.truncate(T - 1)
        self._last = (now, "verify", len(running) * T, ids, len(running))
        return Plan(list(running), drafts, T, expected)

    def _plain(self, running: list, ids: frozenset[int]) -> None:
        """A plain decode step: the caller runs the off mode's ``runner.step``; its time is
        measured from here (not from the start of ``plan``)."""
        self.stats.decode_steps += 1
        self.stats.plain_rows += len(running)
        self._last = (time.perf_counter(), "decode", len(running), ids, len(running))
        return None

    def step(self, plan: Plan, masks, *, forward, tokenizer, vocab_size: int, device) -> list:
        """Verify ``plan``'s drafts in one forward + one kernel launch; feed the emitted tokens to
        the sequences. ``masks``: the step's MaskFiller (position 0's bitmasks); ``forward(seqs,
        drafts, T, graphs=...)``: the verify forward's logits [B, T, V] (``ModelRunner.verify``);
        ``tokenizer``: what the sequences finish with; ``vocab_size``, ``device``: the bitmasks'
        width and where they go. Returns the sequences that finished."""
        t_step = time.perf_counter()
        seqs, T = plan.seqs, plan.T
        drafts = [d.tokens for d in plan.drafts]
        v = self._verifier
        if v is None or v.device != device:
            v = self._verifier = self.verifier_class(vocab_size, device)
        pending = v.start_masks(seqs, drafts, T, masks)  # every position's rows, while the forward runs
        logits = forward(seqs, drafts, T, graphs=self.config.cuda_graphs, ragged=plan.ragged)  # [B, T, V]
        self._retired.clear()  # finished requests' indexes freed while the device runs
        t_wait = time.perf_counter()
        bitmask, constrained = v.bitmask(pending)  # [B, T, W] on the device, or None
        self.stats.mask_wait_seconds += time.perf_counter() - t_wait
        t_sync = time.perf_counter()
        out = self.verify_fn(
            logits, bitmask=bitmask, validate=False, **v.inputs(seqs, drafts, T, constrained)
        )
        both = torch.cat([out.accepted[:, None], out.tokens], dim=1).tolist()  # one read-back
        self.stats.verify_sync_seconds += time.perf_counter() - t_sync
        accepted, tokens = [r[0] for r in both], [r[1:] for r in both]
        finished = []
        st = self.stats
        emitted0 = st.emitted
        st.verify_steps += 1
        st.rows += len(seqs)
        st.positions += len(seqs) + sum(map(len, drafts)) if plan.ragged else len(seqs) * T
        st.ragged_steps += plan.ragged
        for s, d, a, row in zip(seqs, plan.drafts, accepted, tokens):
            s.num_cached = len(s) + a  # the last token and the accepted drafts are cached
            if d:
                self._requests[s.request_id].stats.observe(d.sources, d.kinds, a)
                self._overall.observe(d.sources, d.kinds, a)
                for src, ok in zip(d.sources, [True] * a + [False] * (len(d) - a)):
                    st.drafted[src] += 1
                    st.accepted[src] += ok
                for kind in d.kinds[:a]:
                    st.kind_accepted[kind] += 1
                if a < len(d):
                    st.rejected[d.sources[a]] += 1
                    st.kind_rejected[d.kinds[a]] += 1
            st.accept_hist[(len(d), a)] = st.accept_hist.get((len(d), a), 0) + 1
            for i, t in enumerate(row[: a + 1]):
                if i == a < len(d) and d.sources[a] == FORCED and t >= 0 and s.constraint is not None:
                    self._prefer(s.constraint, t)  # the model's token where it rejected the forced one
                s.on_token(t, tokenizer)
                st.emitted += 1
                if s.is_finished:
                    finished.append(s)
                    break
        if self._drafted is not None:
            self._drafted[1] = st.emitted - emitted0
        if plan.expected is not None:  # realized vs expected tokens, for the cost model
            self._cost_model(device.type).observe_tokens(len(seqs), plan.expected, st.emitted - emitted0)
        st.verify_seconds += time.perf_counter() - t_step
        return finished

    # -- helpers ------------------------------------------------------------------------------
    def _cost_model(self, device_type: str, step_times: dict | None = None) -> CostModel:
        if self._cost is None:
            slope = self.config.cost_slope
            if slope is None:
                slope = DEVICE_SLOPE.get(device_type, DEVICE_SLOPE["cuda"])
            self._cost = CostModel(slope)
            for (path, rows, positions), seconds in (step_times or {}).items():
                self._cost.seed(path, rows, positions, seconds)
        return self._cost

    def _best_rate(self, running: list) -> float:
        """The highest acceptance rate of any confidence class of any running request (a new
        one's: the rates of the requests before it)."""
        best = max(k.rate for k in self._overall.kinds.values())
        for s in running:
            r = self._requests.get(s.request_id)
            if r is not None:
                best = max(best, max(k.rate for k in r.stats.kinds.values()))
        return best

    def _prefer(self, matcher, token: int) -> None:
        """Remember the model's token where it rejected a forced draft, keyed by the canonical
        first forced token there (the model's tokenization habit, e.g. '":' + '"' for '":"')."""
        f = forced_tokens(matcher)
        if not f:
            return
        if token == f[0]:
            self._preferred.pop(f[0], None)
        elif len(self._preferred) < PREFERRED_SIZE:
            self._preferred[f[0]] = token

    def _request(self, s, special_ids: frozenset[int]) -> _Request:
        r = self._requests.get(s.request_id)
        if r is None:
            stop = special_ids | frozenset(s.params.stop_token_ids)
            index = self._indexed.pop(s.request_id, None)
            r = self._requests[s.request_id] = _Request(self.config, s, stop, self._overall, index)
        return r

    def _forget(self, running_ids: frozenset[int]) -> None:
        """Drop the statistics (and prompts indexed ahead) of requests that are no longer
        running; they are freed behind the next forward (``step``, ``index_prompts``)."""
        retired = self._retired
        if len(retired) > RETIRED_MOST:
            retired.clear()
        if len(self._requests) > len(running_ids):
            for rid in [r for r in self._requests if r not in running_ids]:
                retired.append(self._requests.pop(rid))
        if self._indexed:
            for rid in [r for r in self._indexed if r not in running_ids]:
                retired.append(self._indexed.pop(rid))
