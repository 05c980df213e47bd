"""``capacity="auto"``: an in-flight limit found from what the service answers.

One class with one job, :class:`AdaptiveLimit` (with the two protocols through which
functions and their errors speak to it): the in-flight limit of one operator instance
(one per Spark partition). The operator reports each completion's latency
(:meth:`AdaptiveLimit.on_complete`, with ``failed=True`` when the element's result is
an error, e.g. a row from ``on_failure``) and each sign of overload
(:meth:`AdaptiveLimit.on_overload`: a timeout, or an error whose ``overload`` is true,
e.g. a 429 or 503 answer); it reads :attr:`AdaptiveLimit.limit` as the number of
lookups it may keep in flight.

The limit climbs the throughput curve, as TCP BBR probes for bandwidth. Time is
cut into *rounds*: a round ends at the first completion after at least ``limit``
completions and twice the latency floor (about one turn of the window), and after
startup at least 100 ms (shorter rounds measure rates too noisily). Per round: the
*goodput* (completions that were not errors / seconds), the median latency of
those completions, the share of completions that were errors, and whether the
operator had enough work to fill the limit (an *app-limited* round teaches
nothing and changes nothing). Errors are not goodput and not latency samples:
an error answered at once would otherwise look like throughput and lower the
latency floor.

The *latency floor* is the lowest round median of the last 2.5 s (a windowed
minimum, as BBR's min_rtt expires). When it rises past 2x while the round's
goodput is under 0.75x of the goodput measured at the old floor (the service got
slower; our own queue growing with the limit comes with as much goodput), startup
is entered again from the current limit.

After every change of the limit one round is skipped (it still finishes the
requests of the previous limit); the next one judges the new limit.

- **Startup**: the limit doubles while the goodput grows by at least 25% per step
  (latency does not stop it: where the client's own CPU is the bound, latency rises
  with concurrency while the goodput still grows). When a step fails, startup ends
  there if it still grew the goodput by 15% (past the knee of the curve), else at
  the step before.
- **Steady**: the limit is held; every fourth round a probe runs, alternately
  x1.25 (kept if the probe round's goodput beats the held goodput, the mean of the
  rounds held since the last probe, by 3% and past the held rounds' own noise) and
  x0.8 (kept
  if the goodput stays within 3%: fewer in flight, same throughput, shorter queues
  at a saturated service; only when the last held round's median latency is 10%
  above the floor or 1% of its completions were errors, a sign of a queue or of a
  service past its knee; else that probe goes up too).
- **Overload**: a timeout or an overload error cuts the limit to 0.7x at once (at
  most once per round; in startup to the last step that was good, if lower) and
  restarts steady probing from there.
- **Errors that rise with the limit**: a round's errors are judged at once, as they
  come (errors answered at once flood a job while a round runs on). Once they
  exceed what the base share predicts (before any round, and until errors are
  shown to come at a share of their own, a prior of a known share of 1 in 22) by
  at least 4, by 2% of the round's completions and by 5 standard deviations of
  chance, the limit is cut to 0.5x (during a probe up the probe ends instead, back
  at the held limit). The next round starts when what was in flight above the new
  limit has completed (their errors are the old limit's). The rounds after the cut
  check its cause, until they hold 20 completions, or 40 while the share fell by
  more than chance but not yet past doubt: if the share fell (the two shares 3
  standard deviations apart), or most requests still fail, the limit before the
  cut is the *error limit* (cut again at once if the share is still past the
  base's), and probes up to it wait 16, then 32, ... up to 256 held rounds (doubled
  after each probe that raised the share again, reset by one that did not; two
  errors at 2% of a probe's completions end it). If the share did not fall, the
  limit is cut again, checked from the first cut: the partitions of a job share
  the service, and one partition's rounds after its cut may still meet the others'
  excess. The third time in a row, the share is taken as the errors' own (rows
  the service refuses whatever the load): it is the base from then on, the cuts
  are undone and startup resumes.
- **Errors answered at once** (in under half the latency floor) also keep their
  slot taken for a latency floor, as an answer would, doubled for each round in a
  row in which most requests failed (at most 1 s; the operator asks
  :meth:`AdaptiveLimit.pause_after_error`), and when the rounds held show more than
  1% of them, round after round, the limit is trimmed by their share (the service,
  shared with others, takes fewer than it is sent), and probes back up to where it
  was wait twice as long.
- **Recovery**: once a round after cuts passes without one, if the cuts took the
  limit below half of where it was held before them (a storm of overload, not a
  touch of the knee), startup is entered again, at most up to that former level
  (and below the error limit): recovery is as fast as the first climb. Cuts for
  errors recover by probes only: what the service refused, a neighbour may hold.
- **Carried**: ``refused_at`` (the last error limit there was, kept when a probe
  clears it) is what a worker's next partition on the same service starts below,
  with its probes up to it backed off.

The limit stays within ``[minimum, maximum]``. Nothing here reads a clock: the
caller passes ``now`` (the operator's clock, so a ``ManualClock`` drives it in
tests), and nothing here awaits.

What it did is visible: :attr:`AdaptiveLimit.low` and :attr:`AdaptiveLimit.high`
are the lowest and highest limit it has had, :attr:`AdaptiveLimit.cuts` the
number of cuts; one INFO line (logger ``asyncio_ops.limit``, naming
:attr:`AdaptiveLimit.name`) says where startup settled, and one the first cut of
a series (the first after a round without one), with its cause; the cuts after
it in the series are DEBUG lines.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Final, Protocol, runtime_checkable

from .._exceptions import ConfigurationError
from ..options import DEFAULT_MAX_CAPACITY, positive_int

log = logging.getLogger("asyncio_ops.limit")


STARTUP_GROWTH: Final = 2.0
STARTUP_GAIN: Final = 1.25  # the goodput must grow this much per startup step
STARTUP_KEEP: Final = 1.15  # the last step is kept if it grew the goodput this much
LATENCY_GUARD: Final = 2.0  # round median latency / latency floor
LATENCY_WINDOW: Final = 2.5  # seconds: the floor is the lowest round median of this window
SLOWER: Final = 0.75  # a floor past the guard with the goodput under this share: slower
PROBE_UP: Final = 1.25
PROBE_DOWN: Final = 0.8
UP_GAIN: Final = 1.03  # a probe up is kept if the goodput grows this much
UP_SIGMAS: Final = 2.0  # and by this many standard deviations of the held rounds' goodput
DOWN_KEEP: Final = 0.97  # a probe down is kept if the goodput stays above this share
QUEUE_FREE: Final = 1.1  # a held round's median latency under this x the floor: no queue
ERRORS_FREE: Final = 0.01  # a held round's error share under this: not past the knee
ERROR_RISE: Final = 0.02  # an error share this far above the one before: overload
ERROR_EVIDENCE: Final = 4  # errors a round needs before their share can mean overload
ERROR_SIGMAS: Final = 5.0  # and the excess is this many standard deviations past chance
ERROR_KNOWN: Final = 2  # errors that end a probe up where errors rose with the limit before
ERROR_PRIOR: Final = 20  # before any round: as if 0 errors in this many completions
ERROR_CUT: Final = 0.5  # a rising error share cuts this much (errors answered at once)
ERROR_CONFIRM: Final = 3.0  # the share after that cut must fall this many sigmas
ERROR_ALARMS: Final = 2  # cuts whose errors did not fall, in a row, before a share is kept
ERROR_CHECK: Final = 2  # a check that cannot tell ends after this many priors' completions
ERROR_MOST: Final = 0.75  # a share this high after the cut is overload whatever it did
PAUSE_UNKNOWN: Final = 0.01  # seconds: the pause after an error before any latency is known
MAX_PAUSE: Final = 1.0  # seconds: the longest pause of a slot after an error
OVERLOAD_CUT: Final = 0.7
RECOVER_BELOW: Final = 0.5  # cuts below this share of the held limit: recover by startup
PROBE_EVERY: Final = 4  # held rounds between probes
TRIM_AFTER: Final = 2  # held rounds with errors answered at once before the limit is trimmed
PROBE_BACKOFF: Final = 256  # at most this many held rounds between probes to the error limit
ERROR_PROBE_WAIT: Final = 16  # held rounds before the first probe up to the error limit
MAX_ROUND: Final = 1.0  # seconds: a round ends by then when completions are scarce
MIN_ROUND: Final = 0.1  # seconds: shorter rounds measure rates too noisily


@runtime_checkable
class CallsService(Protocol):
    """A function that names the service it calls (the connectors: an HTTP origin, a
    database, a model endpoint). A worker's runtime keeps the limit an operator
    learned for a service and starts its next operator instance on the same service
    there: what a partition learned about a service holds for the next one.

    Example:

    >>> from asyncio_ops import CallsService
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> lookup = HttpLookup("http://api:8080/customers/{id}")
    >>> isinstance(lookup, CallsService), lookup.service_endpoint()
    (True, 'http http://api:8080')
    """

    def service_endpoint(self) -> str | None:
        """The service's name, the same for every function that calls it (without
        credentials); None: unknown (the limit is then kept per function)."""
        ...


@runtime_checkable
class SignalsOverload(Protocol):
    """An exception that says whether the service was overloaded (429, 503, ...).

    Example:

    >>> from asyncio_ops import SignalsOverload
    >>> from asyncio_ops.connectors import LookupResponseError
    >>> answer = LookupResponseError("HTTP 503", status=503)
    >>> isinstance(answer, SignalsOverload), answer.overload  # capacity="auto" cuts its limit
    (True, True)
    """

    @property
    def overload(self) -> bool: ...


class AdaptiveLimit:
    """The in-flight limit of one operator instance (see the module docstring).

    Example:

    >>> from asyncio_ops import AdaptiveLimit
    >>> limit = AdaptiveLimit(initial=100)
    >>> limit.on_overload(now=0.0)  # a timeout, a 429 or a 503: cut at once
    >>> limit.limit, limit.cuts
    (70, 1)

    In an operator: ``AsyncWaitOperator(..., capacity="auto")`` or, to carry
    what it learned to the next instance, ``capacity=limit``.
    """

    __slots__ = (
        "_alarms", "_base_completions", "_base_errors", "_best_limit", "_best_rate", "_ceiling",
        "_completions", "_cut_in_round", "_down_next", "_draining", "_error_check", "_error_limit",
        "_errors", "_failing", "_fast", "_floor_rate", "_floors", "_held",
        "_held_completions", "_held_errors", "_held_fast", "_held_n", "_held_spread", "_latencies",
        "_max_in_flight", "_min_latency", "_probe", "_probe_wait", "_rounds_held", "_started",
        "_startup", "_transition", "changes", "cuts", "high", "limit", "low", "maximum", "minimum",
        "name", "refused_at", "rounds",
    )  # fmt: skip

    def __init__(
        self,
        initial: int = 16,
        minimum: int = 1,
        maximum: int = DEFAULT_MAX_CAPACITY,
        refused_at: int = 0,
    ) -> None:
        self.minimum = positive_int(minimum, "minimum limit")
        self.maximum = positive_int(maximum, "maximum limit")
        if self.maximum < self.minimum:
            raise ConfigurationError(f"maximum limit {maximum} is below the minimum {minimum}")
        self.limit = min(max(positive_int(initial, "initial limit"), self.minimum), self.maximum)
        self.rounds = 0
        self.changes = 0
        self.cuts = 0
        self.low = self.high = self.limit  # the range it has been in
        self.name = "capacity"  # who it is in its log lines (the runtime names the partition)
        self._startup = True
        self._best_rate = 0.0
        self._best_limit = self.limit
        self._min_latency = math.inf  # the latency floor: the lowest median of the window
        # (round end, median, goodput), medians rising: the window's lowest first
        self._floors: deque[tuple[float, float, float]] = deque()
        self._floor_rate = 0.0  # the goodput of the round that set the floor
        self._started: float | None = None  # the current round's start
        self._latencies: list[float] = []  # of the round's completions that were not errors
        self._completions = 0  # the round's completions, errors included
        self._errors = 0  # the round's completions that were errors
        # the errors and completions a round's error share is judged against: a prior
        # of no errors (so that a first round of errors answered at once is judged
        # too, and a share that rose step by step is not taken for the base), until
        # a cut shows that the errors do not fall with the limit: their share then
        self._base_errors = 0
        self._base_completions = ERROR_PRIOR
        # after a cut for rising errors: (the limit before it, the errors and
        # completions of its round, and those of the rounds judged since), until the
        # rounds at the lower limit tell whether the share fell with it
        self._error_check: tuple[int, int, int, int, int] | None = None
        self._error_limit = 0  # the lowest limit at which errors rose, confirmed (0: none)
        # the last error limit there was (kept when a probe clears it): what the next
        # partition on the service starts below
        self.refused_at = 0
        if refused_at:
            # learned before, by another partition on the same service: start below it,
            # and probe up to it only after the back-off
            self._errors_rose_at(max(positive_int(refused_at, "refused_at"), self.minimum + 1))
            self.limit = min(self.limit, self._error_limit - 1)
            self.low = self.high = self.limit
        # held rounds before a probe up to the error limit (each costs error rows)
        self._probe_wait = ERROR_PROBE_WAIT
        self._failing = 0  # rounds in a row in which most completions were errors
        self._alarms = 0  # cuts in a row whose errors did not fall
        self._max_in_flight = 0
        self._cut_in_round = False
        self._held = 0.0  # the goodput of the rounds held since the last probe
        self._held_n = 0  # how many rounds that mean is of
        self._held_spread = 0.0  # and the sum of their squared deviations from it
        self._held_errors = 0  # their errors and completions
        self._held_completions = 0
        self._fast = 0  # the round's errors answered at once (in under half the floor)
        self._held_fast = 0  # those of the rounds held since the last probe
        self._rounds_held = 0
        self._probe = 0.0  # the factor being probed (0: none)
        self._down_next = True  # probes alternate: up first
        self._transition = False  # the round after a change: requests of the old limit
        self._draining = False  # after a cut, until what was in flight above it completes
        self._ceiling = 0  # the limit held before a series of cuts (0: none)

    def __repr__(self) -> str:
        phase = "startup" if self._startup else f"probe x{self._probe}" if self._probe else "hold"
        return f"AdaptiveLimit(limit={self.limit}, {phase}, rounds={self.rounds})"

    # -- what the operator reports ---------------------------------------------------------
    def on_complete(self, latency: float, in_flight: int, now: float, failed: bool = False) -> None:
        """One element completed after ``latency`` seconds, with ``in_flight`` elements
        (itself included) in flight just before it completed; ``failed``: its result is
        an error (not goodput, not a latency sample)."""
        if self._started is None:
            self._started = now - latency
        self._completions += 1
        if failed:
            self._errors += 1
            if latency < self._min_latency / 2:
                self._fast += 1
            # judged at once (errors answered at once flood the job while a round
            # runs on): when most requests fail, during a probe up to where errors
            # rose before, or once they are past the base's share
            if not self._cut_in_round and (
                self._errors >= ERROR_MOST * self._completions
                or (self._probe > 1 and self._error_limit)
                or self._errors_rose(self._errors, self._completions)
            ):
                self._judge_errors()
        else:
            self._latencies.append(latency)
        if in_flight > self._max_in_flight:
            self._max_in_flight = in_flight
        elapsed = now - self._started
        n = self._completions
        floor = self._min_latency if self._min_latency < math.inf else 0.0
        shortest = 2 * floor if self._startup else max(2 * floor, MIN_ROUND)
        drained = self._draining and in_flight - 1 <= self.limit
        if drained or (n >= self.limit and elapsed >= shortest) or elapsed >= MAX_ROUND:
            good = len(self._latencies)
            self._end_round(good / elapsed if elapsed > 0 else math.inf, now)
            if drained:
                # what was in flight above the cut has completed: that was the round
                # after the change; the next one, from here, judges the new limit
                self._draining = self._transition = False

    def on_overload(self, now: float) -> None:
        """A timeout or an overload answer: cut the limit (once per round; when
        nothing completes, a round is the time of two latency floors)."""
        started = self._started
        floor = self._min_latency if self._min_latency < math.inf else MAX_ROUND / 2
        if started is not None and now - started >= 2 * floor:
            self._next_round(now)
        self._cut("a timeout or an overload answer (429, 503)")

    def _errors_rose(self, errors: int, n: int) -> bool:
        """A round's ``errors`` in ``n`` completions are past the base's share (with
        enough evidence)."""
        m = self._base_completions
        excess = errors - self._base_errors / m * n
        # past chance: at a constant share p the excess has a standard deviation of
        # sqrt(p (1 - p) (n + n^2 / m)) (this round's count and the base's own estimate;
        # p estimated with one error and one success more, so that 0 of m is not certain).
        # The prior is no estimate: its share p is taken as known (n alone), else a round
        # of 60 with 15 errors would pass for chance against "0 in 20"
        p = (self._base_errors + 1) / (m + 2)
        spread = n if self._base_errors == 0 and m == ERROR_PRIOR else n + n * n / m
        chance = ERROR_SIGMAS * math.sqrt(p * (1 - p) * spread)
        return excess >= max(ERROR_EVIDENCE, ERROR_RISE * n, chance)

    def pause_after_error(self, latency: float) -> float:
        """How long the slot of an element whose result is an error, answered after
        ``latency`` seconds, stays taken: 0 unless it came at once (in under half the
        latency floor). Then the slot is free again after a latency floor, as after an
        answer, doubled for each round in a row in which most requests failed (at most
        :data:`MAX_PAUSE`): a slot whose requests are refused at once would otherwise
        send one every millisecond, and make an error row of each, however low the
        limit."""
        floor = self._min_latency if self._min_latency < math.inf else PAUSE_UNKNOWN
        if latency >= floor / 2:
            return 0.0
        return min(floor * 2.0 ** min(self._failing, 10), MAX_PAUSE) - latency

    def _judge_errors(self) -> None:
        """Did the round's error share rise (see the module docstring)? Cut if so."""
        probing_up = self._probe > 1 and not self._cut_in_round
        if probing_up and self._error_limit and self._errors_known():
            self._failed_probe()  # errors rose here before: a few say it again
            return
        if self._error_check is not None and self._errors < ERROR_MOST * self._completions:
            return  # a cut being checked: only a round in which most fail cuts again
        if not self._errors_rose(self._errors, self._completions):
            return
        if probing_up:
            self._failed_probe()  # the probe up did it: back to the held limit
        elif not self._cut_in_round:
            before = self.limit
            self._cut("the share of error answers rose with it", ERROR_CUT)
            if self.limit < before:
                if self._error_check is not None:  # checked from the first cut
                    before = self._error_check[0]
                self._error_check = (before, self._errors, self._completions, 0, 0)

    def _errors_known(self) -> bool:
        """During a probe up at a service whose errors rose with the limit before: as
        few as :data:`ERROR_KNOWN` errors, at :data:`ERROR_RISE` of the round's
        completions past the base's share, end the probe (each error more is a row)."""
        expected = self._base_errors / self._base_completions * self._completions
        excess = self._errors - expected
        return excess >= ERROR_KNOWN and excess >= ERROR_RISE * self._completions

    def _errors_rose_at(self, limit: int) -> None:
        """Errors rose with the limit at ``limit``: the error limit is at most that."""
        self._error_limit = min(self._error_limit or limit, limit)
        self.refused_at = self._error_limit

    def _failed_probe(self) -> None:
        """A probe up raised the error share: back to the held limit, and the next
        probe that high waits twice as long."""
        self._errors_rose_at(self.limit)
        self._probe_wait = min(2 * self._probe_wait, PROBE_BACKOFF)
        self._cut_in_round = True  # the round says nothing; no second cut in it
        self._probe = 0.0
        self._rounds_held = 0
        self._set(self._best_limit)

    def _cut(self, cause: str, factor: float = OVERLOAD_CUT) -> None:
        if self._cut_in_round:
            return
        self._cut_in_round = True
        first = not self._ceiling  # the first cut of a series
        if first:
            self._ceiling = self._best_limit
        cut = math.floor(self.limit * factor)
        if self._startup:  # the step just taken did it: back to the last good one
            cut = min(cut, self._best_limit)
        self._startup = False
        self._probe = 0.0
        self._rounds_held = 0
        before = self.limit
        self._set(cut)
        # a cut for errors answered at once: the next round starts when what was in
        # flight above the new limit has completed (their errors are the old limit's)
        self._draining = factor == ERROR_CUT
        self.cuts += 1
        log.log(logging.INFO if first else logging.DEBUG,
                "%s: cut from %d to %d in flight after %s", self.name, before, self.limit,
                cause)  # fmt: skip

    # -- rounds ----------------------------------------------------------------------------
    def _next_round(self, now: float) -> None:
        """Start a new round at ``now``: nothing measured, nothing cut yet."""
        self.rounds += 1
        self._started = now
        self._latencies = []
        self._completions = 0
        self._errors = 0
        self._fast = 0
        self._max_in_flight = 0
        self._cut_in_round = False

    def _floor(self, median: float, now: float, rate: float) -> None:
        """Take a round's median into the windowed minimum; a floor that rose past the
        guard while the goodput fell (the service got slower, not our own queue
        longer: that one comes with as much goodput or more) starts startup again."""
        floors = self._floors
        while floors and floors[-1][1] >= median:
            floors.pop()
        floors.append((now, median, rate))
        while len(floors) > 1 and floors[0][0] < now - LATENCY_WINDOW:
            floors.popleft()
        before, before_rate = self._min_latency, self._floor_rate
        _, self._min_latency, self._floor_rate = floors[0]
        if (
            before < math.inf
            and self._min_latency > LATENCY_GUARD * before
            and rate < SLOWER * before_rate
        ):
            self._restart()

    def _restart(self) -> None:
        """Enter startup again from the current limit."""
        self._startup = True
        self._best_rate = 0.0
        self._best_limit = self.limit
        self._probe = 0.0
        self._rounds_held = 0

    def _end_round(self, rate: float, now: float) -> None:
        if self._errors:
            self._judge_errors()
        latencies = sorted(self._latencies)
        median = latencies[len(latencies) // 2] if latencies else math.inf
        errors, completions, fast = self._errors, self._completions, self._fast
        failing = completions > 0 and errors >= ERROR_MOST * completions
        self._failing = self._failing + 1 if failing else 0
        app_limited = self._max_in_flight < 0.9 * self.limit
        cut = self._cut_in_round
        self._next_round(now)
        if latencies:
            self._floor(median, now, rate)
        transition, self._transition = self._transition, False
        if cut or app_limited or transition:
            # a round that was cut, not filled, or still finishing the requests of the
            # previous limit says nothing about this one
            return
        if self._error_check is not None and not self._errors_fell(errors, completions):
            return  # still checked, cut again, or the errors' own share (startup resumes)
        if self._ceiling:
            # the first round after cuts that passed without one
            if self.limit < RECOVER_BELOW * self._ceiling:
                self._restart()  # a storm took it far down: climb as fast as startup
            else:
                self._ceiling = 0
        if self._startup:
            self._startup_round(rate)
        else:
            self._steady_round(rate, median, errors, completions, fast)

    def _errors_fell(self, errors: int, completions: int) -> bool:
        """The full rounds after a cut for rising errors, until they hold
        :data:`ERROR_PRIOR` completions: did the share fall with the limit (by
        :data:`ERROR_CONFIRM` standard deviations of the pooled share's, or to where the
        base predicts), or do most requests still fail? Then the limit before the cut
        is the error limit, and the round is judged as any other (True). If not, the
        limit is cut again, checked from the first cut (the partitions of a job share
        the service: the others may not have cut yet); after :data:`ERROR_ALARMS` such
        cuts in a row the share is the errors' own (rows the service refuses whatever
        the load), the base later rounds are judged against, and startup resumes."""
        assert self._error_check is not None
        before, had, of, errors_after, after = self._error_check
        errors_after += errors
        after += completions
        if errors_after >= ERROR_MOST * after:
            # most requests still fail: a service refusing nearly all it is sent
            # (other clients, our own other partitions, holding it) is not a share of
            # bad rows; the cut stands, and the next rise may cut again
            self._error_check = None
            self._errors_rose_at(before)
            return True
        # two shares, each with its own chance (the one before the cut is often of a
        # few completions): fell when the difference passes ERROR_CONFIRM standard
        # deviations of the pooled share's
        pooled = (had + errors_after) / (of + after)
        spread = math.sqrt(pooled * (1 - pooled) * (1 / of + 1 / after))
        drop = had / of - errors_after / after
        if drop <= ERROR_CONFIRM * spread and (
            after < ERROR_PRIOR or (drop > spread and after < ERROR_CHECK * ERROR_PRIOR)
        ):
            # too few completions yet to tell, or a share that fell by more than
            # chance but not yet past doubt: held, and the next rounds add theirs
            self._error_check = (before, had, of, errors_after, after)
            return False
        if drop > ERROR_CONFIRM * spread:
            self._error_check = None
            self._errors_rose_at(before)
            self._alarms = 0
            # the cuts were for errors, not a storm of overload: the error limit bounds
            # the probes back up, and no startup recovers the level before them (what
            # the service refused, a neighbour may hold now)
            self._ceiling = 0
            if self._errors_rose(errors, completions):
                # fell, and still past the base's share: cut again, checked from here
                held = self.limit
                self._cut("the share of error answers still rose with it", ERROR_CUT)
                self._error_check = (held, errors, completions, 0, 0)
                return False
            return True
        self._alarms += 1
        if self._alarms < ERROR_ALARMS:
            self._cut("the share of error answers did not fall with it", ERROR_CUT)
            self._error_check = (before, errors_after, after, 0, 0)
            return False
        self._error_check = None
        self._base_errors, self._base_completions = had + errors_after, of + after
        self._alarms = 0
        self._ceiling = 0
        self._set(max(self.limit, before))  # a false alarm: the cuts are undone
        self._restart()  # and the climb goes on from there, as fast as startup
        log.info("%s: the share of error answers did not fall with the limit: %.0f%% "
                 "is taken as the errors' own", self.name, 100 * had / of)  # fmt: skip
        return False

    def _end_startup(self, rate: float) -> None:
        self._startup = False
        self._ceiling = 0
        self._held = rate
        self._set(self._best_limit)
        log.info("%s: settled at %d in flight after %d rounds (%.0f answers/s)",
                 self.name, self.limit, self.rounds, rate)  # fmt: skip

    def _startup_round(self, rate: float) -> None:
        top = min(self._ceiling, self.maximum) if self._ceiling else self.maximum
        if self._error_limit:
            top = min(top, self._error_limit - 1)
        if rate >= STARTUP_GAIN * self._best_rate and self.limit < top:
            self._best_rate, self._best_limit = rate, self.limit
            self._set(min(math.ceil(self.limit * STARTUP_GROWTH), top))
            return
        if rate >= STARTUP_KEEP * self._best_rate:
            # at the top, or past the knee of the curve but still gaining: keep it
            self._best_rate, self._best_limit = rate, self.limit
        self._end_startup(max(rate, self._best_rate))

    def _steady_round(
        self, rate: float, median: float, errors: int, completions: int, fast: int
    ) -> None:
        if self._probe:  # judged on the round after its transition round
            up = self._probe > 1
            if up:
                # a gain past the held rounds' own noise too (else the limit drifts up
                # on lucky rounds, past the knee, adding latency for nothing)
                n = self._held_n
                noise = math.sqrt(self._held_spread / (n - 1) * (1 + 1 / n)) if n > 1 else 0.0
                keep = rate >= max(UP_GAIN * self._held, self._held + UP_SIGMAS * noise)
            else:
                keep = rate >= DOWN_KEEP * self._held
            base = self._best_limit
            self._probe = 0.0
            self._rounds_held = 0
            if keep:
                self._best_limit = self.limit
                if up and self._error_limit and self.limit >= self._error_limit:
                    self._error_limit = 0  # errors no longer rise there
                    self._probe_wait = ERROR_PROBE_WAIT
            else:
                self._set(base)
            return
        # the held goodput: the mean of the rounds held since the last probe (less noisy)
        n = self._rounds_held
        if n == 0:
            self._held, self._held_spread = rate, 0.0
        else:  # Welford's running mean and spread
            mean = self._held + (rate - self._held) / (n + 1)
            self._held_spread += (rate - self._held) * (rate - mean)
            self._held = mean
        self._held_n = n + 1
        if n == 0:
            self._held_errors, self._held_completions, self._held_fast = 0, 0, 0
        self._held_errors += errors
        self._held_completions += completions
        self._held_fast += fast
        self._best_limit = self.limit
        self._rounds_held += 1
        if self._rounds_held >= TRIM_AFTER and self._held_fast > ERRORS_FREE * (
            self._held_completions
        ):
            # errors answered at once, round after round: that share of the slots is
            # refused (the service, shared with others, takes fewer than we send)
            share = self._held_fast / self._held_completions
            self._errors_rose_at(self.limit)
            self._probe_wait = min(2 * self._probe_wait, PROBE_BACKOFF)
            self._rounds_held = 0
            self._set(math.floor(self.limit * (1 - share)))
            self._best_limit = self.limit
            return
        if self._rounds_held >= PROBE_EVERY:
            # alternate up and down probes: up finds more throughput, down shorter
            # queues or fewer errors (only where latency says there is a queue to
            # shorten, or errors say the service is past its knee)
            down = not self._down_next
            past = (
                median > QUEUE_FREE * self._min_latency
                or self._held_errors > ERRORS_FREE * self._held_completions
            )
            higher = math.ceil(self.limit * PROBE_UP)
            if self._error_limit:
                higher = min(higher, self._error_limit)
                going_up = not (down and past)
                if going_up and higher >= self._error_limit and (
                    self._rounds_held < self._probe_wait
                ):
                    return  # up to where errors rose: only after the back-off
            self._down_next = down
            self._probe = PROBE_DOWN if down and past else PROBE_UP
            before = self.limit
            self._set(higher if self._probe > 1 else math.floor(self.limit * self._probe))
            if self.limit == before:  # at a bound: nothing to probe
                self._probe = 0.0
                self._rounds_held = 0

    def _set(self, limit: int) -> None:
        limit = min(max(limit, self.minimum), self.maximum)
        if limit != self.limit:
            self.limit = limit
            self.changes += 1
            self._transition = True
            self.low = min(self.low, limit)
            self.high = max(self.high, limit)
