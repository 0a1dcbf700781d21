"""Async scheduling: the next decode step launched before this step's tokens reach the host.

A plain decode step ends with the host waiting on the device: the sampled tokens are read back,
each sequence takes its token (stop tokens, stop strings, lengths), the scheduler commits and
plans the next step, and only then is the next forward launched. The device idles for that
turn-around (0.1-0.6 ms a step on an H100's host at 16-64 rows: docs/async-scheduling.md).

With async scheduling (``LLM(async_scheduling=...)``, on by default on CUDA) a step whose rows
all sample (a decode step, or one where the prompts end) and whose next step can be known
without its tokens launches that next step at once: the same rows, each one position on, its
token taken on the device from the sampler's output (the model runner's ``step_ahead``), and
its own token sampled on the device too where no row needs the host first (below). Then the
host reads this step's tokens (a copy recorded before that launch, so it does not wait for it),
accepts them and commits, and the next engine step takes the step already running
(``StepAhead.take``) instead of launching one: its forward started while the host worked.

What is sampled does not change: a row's token is a function of its logits, seed and step
(docs/sampling-kernel.md), and the step ahead runs the rows the next step would run, at the same
positions. A row that finishes (a stop token, a stop string, its length, an abort) is left out
of the next step, and the step ahead's result for it is dropped. A request that arrives meanwhile
is admitted one step later (``Scheduler.schedule(admit=False)``): the step already running is
taken first. When the next step is not that decode all the same (DSpark drafts), the step ahead
is dropped and the step runs as usual: its rows write the same K/V at the same positions again.

A step launches ahead only when nothing its tokens decide is needed to launch the next forward
(``may_step_ahead``): DSpark will not draft next step, no request is waiting for admission,
every running row is in the step, and not every row is at its last token.

A row with a constraint (its mask needs this step's token) or asking for logprobs (read on the
host) cannot be sampled on the device at once: the forward of the step launched ahead runs, and
the next engine step samples its logits once the host has read this step's tokens, advanced the
matchers and filled the masks. That puts the mask fill on the host's path between two
launches, where without the step ahead it runs beside the step's own forward. It pays where
the device bounds the step (a large model: the fill and the host's turn-around hide behind a
long forward) and costs where the host does (a small one). :class:`DeviceBound` decides from
the time the host waits for the device in such steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sequence import Sequence


@dataclass
class StepAhead:
    """A decode step in flight: ``rows`` (in step order), each at position ``starts[i]`` (its
    ``num_cached`` when launched), their logits and, when sampled ahead, their tokens (on the
    device)."""

    rows: list[Sequence]
    starts: list[int]
    logits: torch.Tensor  # [len(rows), V]
    tokens: torch.Tensor | None  # [len(rows)] int64; None: the step that takes it samples
    _at: dict[int, int] = field(init=False, repr=False)  # id(row) -> its index

    def __post_init__(self) -> None:
        self._at = {id(s): i for i, s in enumerate(self.rows)}

    def take(self, rows: list[Sequence], decode: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The logits and tokens (None: not sampled) of ``rows`` (a decode step's rows, each one
        token) when this step ran them all at their current positions, in that order: the step
        already computed them. None otherwise (the caller runs its own step)."""
        if not decode or not rows:
            return None
        idx = []
        for s in rows:
            i = self._at.get(id(s))
            if i is None or self.starts[i] != s.num_cached:
                return None
            idx.append(i)
        if len(idx) == len(self.rows):  # (idx is increasing: the running order is kept)
            return self.logits, self.tokens
        at = torch.tensor(idx, dtype=torch.int64).to(self.logits.device, non_blocking=True)
        return self.logits[at], None if self.tokens is None else self.tokens[at]


def may_step_ahead(rows: list[Sequence], running: int, waiting: int, may_draft) -> bool:
    """May the step of ``rows`` (each of them sampling) launch the next decode step's forward
    before its tokens are read?
    ``running``: the scheduler's running requests; ``waiting``: requests not yet admitted;
    ``may_draft(rows)``: may DSpark draft for these rows next step."""
    if waiting or len(rows) != running:
        return False
    if all(len(s.output_token_ids) + 1 >= s.max_tokens for s in rows):
        return False  # every row ends with this step's token
    return not may_draft(rows)


def samples_ahead(rows: list[Sequence]) -> bool:
    """Are the tokens of a step launched ahead over ``rows`` sampled at once? Not where a row's
    mask (its constraint) or its logprobs need the host first."""
    return all(s.constraint is None and s.params.logprobs is None for s in rows)


class DeviceBound:
    """Do steps whose rows need the host before their draw (:func:`samples_ahead` false) launch
    ahead? Only where the device bounds them, judged by the time the host waits for the device
    in each such step (``wait``: reading its tokens back) against the time it worked since the
    last step's tokens came back (``busy``: its turn-around, in ``step()`` and out of it), as
    running averages over the steps of the current choice:

    - not launched ahead, the host waits about the forward less the mask fill beside it; going
      ahead takes the host's turn-around (reading, accepting, committing, scheduling) off the
      device's path and puts the fill on it, so it pays where the wait outlasts the host's own
      time: launch ahead once ``wait >= ON * busy``;
    - launched ahead, the host waits what the forward has left once it has filled the masks;
      a wait near nothing means the host bounds the steps: stop once ``wait < OFF * busy``.

    Each choice is kept for :data:`SETTLE` steps before its averages are read (the first steps
    after a switch still hold the other choice's step). Measured on the H100 with both choices
    fixed (benchmarks/RESULTS.md): at Llama-3-8B's shape, whose forward is most of a 6-7 ms
    step, constrained steps launched ahead ran as fast as free rows; at SmolLM2-135M's, whose
    forward is shorter than the host's turn-around, 6-13% slower than not. ``always``: launch
    ahead whatever the times (tests)."""

    ON = 1.5
    OFF = 0.1
    SETTLE = 4
    WEIGHT = 0.25  # of the newest step in the averages

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self.ahead = always
        self._wait = self._busy = 0.0
        self._steps = 0  # steps of the current choice seen

    def note(self, ahead: bool, wait: float, busy: float) -> None:
        """One step with such rows: launched ahead or not, the seconds the host waited for the
        device and those it worked."""
        if self.always or ahead != self.ahead:
            return
        self._steps += 1
        if self._steps <= self.SETTLE // 2:  # (a step that still holds the other choice's)
            self._wait, self._busy = wait, busy
            return
        w = self.WEIGHT
        self._wait += w * (wait - self._wait)
        self._busy += w * (busy - self._busy)
        if self._steps < self.SETTLE:
            return
        if self.ahead:
            switch = self._wait < self.OFF * self._busy  # the host bounds the steps
        else:
            switch = self._wait >= self.ON * self._busy  # the device does
        if switch:
            self.ahead = not self.ahead
            self._steps = 0


class TokenRead:
    """Tokens on the device read back without waiting for work queued after them: on CUDA a
    copy into a pinned buffer (kept from read to read) and an event, recorded by ``start``;
    ``wait`` waits for that event only."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._tokens: torch.Tensor | None = None

    def start(self, tokens: torch.Tensor) -> None:
        self._tokens = tokens
        if tokens.device.type != "cuda":
            return
        n = tokens.numel()
        if self._host is None or self._host.numel() < n:
            self._host = torch.empty(max(n, 256), dtype=tokens.dtype, pin_memory=True)
            self._event = torch.cuda.Event()
        self._host[:n].copy_(tokens, non_blocking=True)
        self._event.record()

    def wait(self) -> list[int]:
        tokens, self._tokens = self._tokens, None
        if tokens.device.type != "cuda":
            return tokens.tolist()
        self._event.synchronize()
        return self._host[: tokens.numel()].tolist()
