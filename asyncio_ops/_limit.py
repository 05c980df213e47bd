"""``capacity="auto"``: an in-flight limit found from what the service answers.

One :class:`AdaptiveLimit` per operator instance (per Spark partition). The
operator reports each completion's latency (:meth:`AdaptiveLimit.on_complete`)
and each sign of overload (:meth:`AdaptiveLimit.on_overload`: a timeout, or an
error whose ``overload`` is true, e.g. a 429 or 503 answer); it reads
:attr:`AdaptiveLimit.limit` as the number of lookups it may keep in flight.

The limit climbs the throughput curve, as TCP BBR probes for bandwidth, with a
latency guard, as TCP Vegas keeps queues short. Time is cut into *rounds*: a
round ends at the first completion after at least ``limit`` completions and
twice the lowest round median latency seen (about one turn of the window), and
after startup at least 100 ms (shorter rounds measure rates too noisily).
Per round: the rate (completions / seconds), the median latency, and whether
the operator had enough work to fill the limit (an *app-limited* round teaches
nothing and changes nothing).

After every change of the limit one round is skipped (it still finishes the
requests of the previous limit); the next one judges the new limit, except in
startup, which ends at once when that round's latency already breaks the guard.

- **Startup**: the limit doubles while the rate grows by at least 25% per step
  and the round's median latency stays under 2x the lowest seen. When either
  fails, startup ends at the last step if it still grew the rate by 15% (past
  the knee of the curve), else at the step before.
- **Steady**: the limit is held; every fourth round a probe runs, alternately
  x1.25 (kept if the probe round's rate beats the held rate, the mean of the
  rounds held since the last probe, by 3% with latency under the guard: a
  service that scales) and x0.8 (kept if the rate stays within 3%: fewer in
  flight, same throughput, shorter queues at a saturated service; only when
  the last held round's median latency is 10% above the lowest, a sign of a
  queue; else that probe goes up too).
- **Overload**: a timeout or an overload error cuts the limit to 0.7x at once
  (at most once per round) and restarts steady probing from there.

The limit stays within ``[minimum, maximum]``. Nothing here reads a clock: the
caller passes ``now`` (the operator's clock, so a ``ManualClock`` drives it in
tests), and nothing here awaits.
"""

from __future__ import annotations

import math
from typing import Final, Protocol, runtime_checkable

from ._exceptions import ConfigurationError
from .options import positive_int

DEFAULT_MAX_CAPACITY: Final = 1024
"""The default bound of an adaptive limit (and the queue size it needs)."""
STARTUP_GROWTH: Final = 2.0
STARTUP_GAIN: Final = 1.25  # the rate must grow this much per startup step
STARTUP_KEEP: Final = 1.15  # the last step is kept if it grew the rate this much
LATENCY_GUARD: Final = 2.0  # round median latency / lowest round median
PROBE_UP: Final = 1.25
PROBE_DOWN: Final = 0.8
UP_GAIN: Final = 1.03  # a probe up is kept if the rate grows this much
DOWN_KEEP: Final = 0.97  # a probe down is kept if the rate stays above this share
QUEUE_FREE: Final = 1.1  # a held round's median latency under this x the lowest: no queue
OVERLOAD_CUT: Final = 0.7
PROBE_EVERY: Final = 4  # held rounds between probes
MAX_ROUND: Final = 1.0  # seconds: a round ends by then when completions are scarce
MIN_ROUND: Final = 0.1  # seconds: shorter rounds measure rates too noisily


@runtime_checkable
class SignalsOverload(Protocol):
    """An exception that says whether the service was overloaded (429, 503, ...)."""

    @property
    def overload(self) -> bool: ...


class AdaptiveLimit:
    """The in-flight limit of one operator instance (see the module docstring)."""

    __slots__ = (
        "_best_limit", "_best_rate", "_cut_in_round", "_down_next", "_held", "_latencies",
        "_max_in_flight", "_min_latency", "_probe", "_rounds_held", "_started", "_startup",
        "_transition", "changes", "limit", "maximum", "minimum", "rounds",
    )  # fmt: skip

    def __init__(
        self, initial: int = 16, minimum: int = 1, maximum: int = DEFAULT_MAX_CAPACITY
    ) -> None:
        self.minimum = positive_int(minimum, "minimum limit")
        self.maximum = positive_int(maximum, "maximum limit")
        if self.maximum < self.minimum:
            raise ConfigurationError(f"maximum limit {maximum} is below the minimum {minimum}")
        self.limit = min(max(positive_int(initial, "initial limit"), self.minimum), self.maximum)
        self.rounds = 0
        self.changes = 0
        self._startup = True
        self._best_rate = 0.0
        self._best_limit = self.limit
        self._min_latency = math.inf
        self._started: float | None = None  # the current round's start
        self._latencies: list[float] = []
        self._max_in_flight = 0
        self._cut_in_round = False
        self._held = 0.0  # the rate of the last held round
        self._rounds_held = 0
        self._probe = 0.0  # the factor being probed (0: none)
        self._down_next = True  # probes alternate: up first
        self._transition = False  # the round after a change: requests of the old limit

    def __repr__(self) -> str:
        phase = "startup" if self._startup else f"probe x{self._probe}" if self._probe else "hold"
        return f"AdaptiveLimit(limit={self.limit}, {phase}, rounds={self.rounds})"

    # -- what the operator reports ---------------------------------------------------------
    def on_complete(self, latency: float, in_flight: int, now: float) -> None:
        """One element completed after ``latency`` seconds, with ``in_flight`` elements
        (itself included) in flight just before it completed."""
        if self._started is None:
            self._started = now - latency
        self._latencies.append(latency)
        if in_flight > self._max_in_flight:
            self._max_in_flight = in_flight
        elapsed = now - self._started
        n = len(self._latencies)
        floor = self._min_latency if self._min_latency < math.inf else 0.0
        shortest = 2 * floor if self._startup else max(2 * floor, MIN_ROUND)
        if (n >= self.limit and elapsed >= shortest) or elapsed >= MAX_ROUND:
            self._end_round(n / elapsed if elapsed > 0 else math.inf, now)

    def on_overload(self, now: float) -> None:
        """A timeout or an overload answer: cut the limit (once per round; when
        nothing completes, a round is the time of two lowest round latencies)."""
        started = self._started
        floor = self._min_latency if self._min_latency < math.inf else MAX_ROUND / 2
        if started is not None and now - started >= 2 * floor:
            self._next_round(now)
        if self._cut_in_round:
            return
        self._cut_in_round = True
        self._startup = False
        self._probe = 0.0
        self._rounds_held = 0
        self._set(math.floor(self.limit * OVERLOAD_CUT))

    # -- rounds ----------------------------------------------------------------------------
    def _next_round(self, now: float) -> None:
        """Start a new round at ``now``: nothing measured, nothing cut yet."""
        self.rounds += 1
        self._started = now
        self._latencies = []
        self._max_in_flight = 0
        self._cut_in_round = False

    def _end_round(self, rate: float, now: float) -> None:
        latencies = sorted(self._latencies)
        median = latencies[len(latencies) // 2]
        app_limited = self._max_in_flight < 0.9 * self.limit
        cut = self._cut_in_round
        self._next_round(now)
        if median < self._min_latency:
            self._min_latency = median
        transition, self._transition = self._transition, False
        calm = median <= LATENCY_GUARD * self._min_latency
        if transition and self._startup and not calm and not cut:
            # a queue shows already while the step is taken: end startup now rather
            # than hold the longer queue for one more round
            self._startup = False
            self._held = self._best_rate
            self._set(self._best_limit)
            return
        if cut or app_limited or transition:
            # a round that was cut, not filled, or still finishing the requests of the
            # previous limit says nothing about this one
            return
        if self._startup:
            self._startup_round(rate, calm)
        else:
            self._steady_round(rate, calm, median)

    def _startup_round(self, rate: float, calm: bool) -> None:
        if calm and rate >= STARTUP_GAIN * self._best_rate and self.limit < self.maximum:
            self._best_rate, self._best_limit = rate, self.limit
            self._set(math.ceil(self.limit * STARTUP_GROWTH))
            return
        if calm and rate >= STARTUP_KEEP * self._best_rate:
            # at the maximum, or past the knee of the curve but still gaining: keep it
            self._best_rate, self._best_limit = rate, self.limit
        self._startup = False
        self._held = max(rate, self._best_rate)
        self._set(self._best_limit)

    def _steady_round(self, rate: float, calm: bool, median: float) -> None:
        if self._probe:  # judged on the round after its transition round
            up = self._probe > 1
            keep = (rate >= UP_GAIN * self._held and calm) if up else rate >= DOWN_KEEP * self._held
            base = self._best_limit
            self._probe = 0.0
            self._rounds_held = 0
            if keep:
                self._best_limit = self.limit
            else:
                self._set(base)
            return
        # the held rate: the mean of the rounds held since the last probe (less noisy)
        n = self._rounds_held
        self._held = rate if n == 0 else (self._held * n + rate) / (n + 1)
        self._best_limit = self.limit
        self._rounds_held += 1
        if self._rounds_held >= PROBE_EVERY:
            # alternate up and down probes: up finds more throughput, down shorter
            # queues (only where latency says there is a queue to shorten)
            self._down_next = not self._down_next
            down = self._down_next and median > QUEUE_FREE * self._min_latency
            self._probe = PROBE_DOWN if down else PROBE_UP
            before = self.limit
            self._set(math.ceil(self.limit * self._probe) if self._probe > 1
                      else math.floor(self.limit * self._probe))  # fmt: skip
            if self.limit == before:  # at a bound: nothing to probe
                self._probe = 0.0
                self._rounds_held = 0

    def _set(self, limit: int) -> None:
        limit = min(max(limit, self.minimum), self.maximum)
        if limit != self.limit:
            self.limit = limit
            self.changes += 1
            self._transition = True
