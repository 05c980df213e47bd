"""``AdaptiveLimit`` (``capacity="auto"``) against simulated services: it reaches the best
fixed capacity's throughput where the service scales, and keeps latency near the unloaded
latency where the service saturates; overload cuts it; a round without enough work
changes nothing. Simulated time (tests/limit_sim.py): deterministic, nothing sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncio_ops import AsyncFunction, AsyncWaitOperator, ConfigurationError, OutputMode
from asyncio_ops._engine._limit import PROBE_DOWN, AdaptiveLimit
from asyncio_ops.testing import ManualClock
from tests.conftest import Runner
from tests.helpers import settle
from tests.limit_sim import simulate

FIXED = (16, 64, 256, 1024)
SERVICES = {
    "scaling": {},
    "saturating at 64": {"servers": 64},
    "saturating at 300": {"servers": 300},
    "client CPU-bound": {"cpu_rate": 32_000.0},
}


@pytest.mark.parametrize("service", list(SERVICES))
@pytest.mark.parametrize("seed", [1, 2])
def test_auto_reaches_the_best_fixed_capacity_with_unloaded_latency(
    service: str, seed: int
) -> None:
    kw = SERVICES[service]
    # 8 simulated seconds: startup (doubling from 16, two rounds a step) costs about
    # half a second, which a short run pays in full
    best = max(simulate(c, 8.0, seed=seed, **kw).rate for c in FIXED)
    unloaded = simulate(4, 8.0, seed=seed, **kw).quantile(0.99)
    limit = AdaptiveLimit()
    auto = simulate(limit, 8.0, seed=seed, **kw)
    assert auto.rate >= 0.9 * best, f"{auto.rate:,.0f}/s against {best:,.0f}/s"
    assert auto.quantile(0.99) <= 2 * unloaded, limit


def test_a_saturated_service_holds_the_limit_near_its_servers() -> None:
    limit = AdaptiveLimit()
    out = simulate(limit, 10.0, servers=64)
    settled = out.limits[len(out.limits) // 2 :]
    assert min(settled) >= 48 and max(settled) <= 130, (min(settled), max(settled))


@pytest.mark.parametrize("seed", [1, 2])
def test_errors_that_rise_with_the_limit_hold_it_at_the_knee(seed: int) -> None:
    # beyond 16 in flight the service answers an error (not declared overload) in 1 ms:
    # taken for throughput, such errors would drive the limit to its maximum
    limit = AdaptiveLimit()
    out = simulate(limit, 8.0, errors_beyond=16, seed=seed)
    settled = sorted(out.limits[len(out.limits) // 2 :])
    assert settled[len(settled) // 2] <= 16 and settled[-1] <= 20, (settled[0], settled[-1])
    assert out.error_fraction <= 0.01, (out.error_fraction, limit)
    best = max(simulate(c, 8.0, errors_beyond=16, seed=seed).rate for c in (8, 16, 32))
    assert out.rate >= 0.9 * best, f"{out.rate:,.0f}/s against {best:,.0f}/s"


def test_partitions_sharing_a_service_that_fails_fast_settle_below_its_capacity() -> None:
    """Two partitions (each its own limit, starting at 16) against a service that serves
    16 at once and answers an error in 1 ms beyond: their limits settle where their sum
    fits, and the error rows are a small share. The simulation is a worst case: here a
    request freed by one partition is always taken by that partition again first, so
    the other one meets every refusal (on a real network the two race; measured on the
    example service, bench.adaptive's "fails fast", the share is far lower). Without
    judging errors from the first round and pausing slots after errors answered at
    once, 29-86% of these rows were errors."""
    shares = []
    for seed in range(1, 7):
        limits = [AdaptiveLimit(), AdaptiveLimit()]
        out = simulate(limits, 10.0, errors_beyond=16, seed=seed)
        best = max(simulate([c, c], 10.0, errors_beyond=16, seed=seed).rate for c in (4, 8))
        assert out.rate >= 0.9 * best, (seed, out.rate, best, limits)
        assert out.error_fraction <= 0.15, (seed, out.error_fraction, limits)
        shares.append(out.error_fraction)
    assert sum(share <= 0.02 for share in shares) >= len(shares) // 2, shares


@pytest.mark.parametrize("service", ["scaling", "saturating at 64", "errors at 30%"])
def test_errors_at_a_constant_share_are_not_overload(service: str) -> None:
    # 10% (or 30%) of rows are errors whatever the limit (keys the service does not
    # know): not goodput, but no reason to cut
    kw: dict[str, Any] = {**SERVICES.get(service, {}), "error_share": 0.1}
    if service == "errors at 30%":
        kw["error_share"] = 0.3
    best = max(simulate(c, 8.0, **kw).rate for c in FIXED)
    limit = AdaptiveLimit()
    auto = simulate(limit, 8.0, **kw)
    assert auto.rate >= 0.85 * best, f"{auto.rate:,.0f}/s against {best:,.0f}/s, {limit}"


@pytest.mark.parametrize("seed", [1, 2])
def test_the_limit_climbs_again_after_the_service_gets_slower(seed: int) -> None:
    # 5 ms, then from 3 s on 100 ms; the client's loop completes at most 2,000/s, so
    # 10 in flight were enough before the step and about 200 are needed after it
    kw: dict[str, Any] = {"median": 0.005, "cpu_rate": 2000.0, "latency_step": (3.0, 0.100)}
    best = max(simulate(c, 10.0, seed=seed, **kw).rate_between(8.0, 10.0) for c in FIXED)
    limit = AdaptiveLimit()
    out = simulate(limit, 10.0, seed=seed, **kw)
    # the latency floor of before the step expires 2.5 s after it, startup again takes
    # about 1.5 s at 100 ms: from 8 s on at the best fixed capacity's throughput
    assert out.rate_between(8.0, 10.0) >= 0.9 * best, (out.rate_between(8.0, 10.0), limit)


@pytest.mark.parametrize("service", ["scaling", "saturating at 64"])
def test_the_limit_recovers_from_an_overload_storm_as_fast_as_it_started(service: str) -> None:
    # from 3 s to 4 s every request is answered with an overload error (a 429) in 1 ms
    kw = {**SERVICES[service], "overload_storm": (3.0, 4.0)}
    out = simulate(AdaptiveLimit(), 8.0, **kw)
    assert out.limit_at(4.0) <= 2  # the storm cut it to the bottom
    level = 0.8 * out.limit_at(3.0)  # (the limit may have been in a probe x1.25)
    recovery = next((t for t, n in zip(out.limit_times, out.limits, strict=True)
                     if t > 4.0 and n >= level), math.inf) - 4.0  # fmt: skip
    # the startup climb from the same bottom, in a fresh limit
    fresh = simulate(AdaptiveLimit(initial=1), 4.0, **SERVICES[service])
    startup = next(t for t, n in zip(fresh.limit_times, fresh.limits, strict=True) if n >= level)
    # a round or two more: the one the storm ends in, then the first without a cut
    assert recovery <= 1.5 * startup, (recovery, startup, level)
    # and holds it (a probe x0.8 below it now and then, as before the storm)
    late = sorted(out.limits[len(out.limits) * 7 // 8 :])
    assert late[len(late) // 2] >= level and late[0] >= math.floor(PROBE_DOWN * level)


@pytest.mark.parametrize("service", ["scaling", "saturating at 64", "saturating at 300"])
def test_a_learned_limit_is_at_the_best_fixed_capacity_in_the_first_second(service: str) -> None:
    # a worker's next partition of an operator starts where its previous one ended
    # (the runtime passes the limit as ``initial``): no climb from 16 again
    kw = SERVICES[service]
    previous = AdaptiveLimit()
    simulate(previous, 8.0, **kw)
    best = max(simulate(c, 1.0, **kw).rate for c in FIXED)
    first_second = simulate(AdaptiveLimit(initial=previous.limit), 1.0, **kw)
    assert first_second.rate >= 0.9 * best, (first_second.rate, best, previous)


def test_an_overload_cuts_the_limit_once_per_round() -> None:
    limit = AdaptiveLimit(initial=100)
    limit.on_overload(now=0.0)
    limit.on_overload(now=0.0)  # the same round: no second cut
    assert limit.limit == 70
    for i in range(70):  # a full round: 70 completions of 20 ms over 0.2 s
        limit.on_complete(0.02, 70, now=0.04 + i * 0.003)
    assert limit.rounds == 1
    limit.on_overload(now=0.3)
    assert limit.limit == 49


def test_what_the_limit_did_is_in_its_range_its_cuts_and_its_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run through startup and an overload storm: the limit's range and cuts count
    what happened; INFO says where startup settled and the first cut of the storm (with
    its cause), the storm's further cuts are DEBUG."""
    kw = {**SERVICES["scaling"], "overload_storm": (3.0, 4.0)}
    limit = AdaptiveLimit()
    limit.name = "capacity of look, partition 3"
    with caplog.at_level("DEBUG", logger="asyncio_ops.limit"):
        out = simulate(limit, 6.0, **kw)
    assert limit.low == min([16, *out.limits]) and limit.high == max([16, *out.limits])
    assert limit.low <= 2 and limit.high >= 64
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    debug = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert info[0].startswith("capacity of look, partition 3: settled at "), info
    cuts = [m for m in info if "cut from" in m]
    assert cuts and all("a timeout or an overload answer (429, 503)" in m for m in cuts)
    assert limit.cuts == len(cuts) + len(debug) and len(debug) >= 2  # the storm's
    assert len(cuts) <= 3  # one per series, not one per cut


def test_rounds_without_enough_work_change_nothing() -> None:
    limit = AdaptiveLimit(initial=64)
    t = 0.0
    for _ in range(50):  # 50 rounds with at most 10 in flight
        for _ in range(64):
            t += 0.001
            limit.on_complete(0.02, 10, now=t)
    assert limit.limit == 64 and limit.rounds >= 40


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 64), st.integers(1, 2048),
    st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(0, 4096), st.booleans()), max_size=300),
)  # fmt: skip
def test_the_limit_stays_within_its_bounds(
    minimum: int, maximum: int, events: list[tuple[float, int, bool]]
) -> None:
    maximum = max(minimum, maximum)
    limit = AdaptiveLimit(initial=16, minimum=minimum, maximum=maximum)
    now = 0.0
    for latency, in_flight, overload in events:
        now += latency / 10
        if overload:
            limit.on_overload(now)
        else:
            limit.on_complete(latency, in_flight, now)
        assert minimum <= limit.limit <= maximum


def test_bad_bounds_are_named() -> None:
    with pytest.raises(ValueError, match="maximum limit 4 is below the minimum 8"):
        AdaptiveLimit(minimum=8, maximum=4)
    with pytest.raises(ValueError, match="initial limit"):
        AdaptiveLimit(initial=0)


# -- in the operator: capacity="auto" -------------------------------------------------------
class Saturating(AsyncFunction[int, int]):
    """A service on the manual clock: ``servers`` answer at once, each in 20 ms; beyond
    them requests queue (FIFO). ``stalled``: nothing is answered any more."""

    def __init__(self, clock: ManualClock, servers: int) -> None:
        self.clock = clock
        self.servers = servers
        self.busy = 0
        self.queue: deque[asyncio.Future[list[int]]] = deque()
        self.in_flight = 0
        self.max_in_flight = 0
        self.stalled = False

    def _serve(self, fut: asyncio.Future[list[int]], value: int) -> None:
        self.busy += 1

        def done() -> None:
            self.busy -= 1
            if not fut.done():
                fut.set_result([value])
            if self.queue and not self.stalled:
                self._serve(*self.queue.popleft())

        if not self.stalled:
            self.clock.call_at(self.clock.now() + 0.020, done)

    async def async_invoke(self, value: int) -> list[int]:
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.busy < self.servers:
                self._serve(fut, value)
            else:
                self.queue.append((fut, value))
            return await fut
        finally:
            self.in_flight -= 1


async def _drive(op: AsyncWaitOperator, clock: ManualClock, seconds: float) -> None:
    """Feed elements without end while the clock advances ``seconds`` in 1 ms steps."""

    async def feed() -> None:
        i = 0
        while True:
            await op.process_element(i)
            i += 1

    feeder = asyncio.get_running_loop().create_task(feed())
    try:
        for _ in range(int(seconds * 1000)):
            clock.advance(0.001)
            await settle()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_auto_capacity_finds_a_saturated_service_limit(run: Runner[Any], mode: OutputMode) -> None:
    async def main() -> None:
        clock = ManualClock()
        service = Saturating(clock, servers=40)
        out: list[Any] = []
        op = AsyncWaitOperator(service, output=out.append, timeout=5.0, capacity="auto",
                               clock=clock, mode=mode, max_capacity=512)  # fmt: skip
        await op.open()
        await _drive(op, clock, 3.0)
        limiter = op.limiter
        assert limiter is not None and limiter.rounds > 20
        assert 28 <= limiter.limit <= 64, limiter
        assert service.max_in_flight <= 512
        assert len(out) > 0.8 * 40 / 0.020 * 3.0 * 0.7  # near the service's 2,000/s
        await op.close()

    run(main())


def test_auto_capacity_is_cut_by_timeouts(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        service = Saturating(clock, servers=1000)
        op = AsyncWaitOperator(service, output=lambda _: None, timeout=0.2, capacity="auto",
                               clock=clock, on_failure=lambda *_: [])  # fmt: skip
        await op.open()
        await _drive(op, clock, 1.0)
        assert op.limiter is not None
        grown = op.limiter.limit
        assert grown > 16  # startup grew it
        service.stalled = True  # every request in flight now times out
        await _drive(op, clock, 2.0)
        assert op.limiter.limit < grown * 0.5, op.limiter
        await op.close()

    run(main())


def test_auto_capacity_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        AsyncWaitOperator(lambda v: v, output=print, timeout=1, capacity="lots")
    with pytest.raises(ConfigurationError, match="max_capacity"):
        AsyncWaitOperator(Saturating(ManualClock(), 1), output=print, timeout=1,
                          capacity="auto", max_capacity=0)  # fmt: skip


class Busy(Exception):
    """What a service says when it is overloaded (as a 429 or 503 answer)."""

    @property
    def overload(self) -> bool:
        return True


def test_auto_capacity_is_cut_by_overload_errors_not_by_others(run: Runner[Any]) -> None:
    """A 429 cuts at once, and so does a service refusing most of what it is sent. Rows
    the service refuses at a share of their own (30% here, whatever the load) may cut
    once (before any round they are judged against a prior of none), but a round at
    the lower limit with the same share shows they do not come from the load: the
    limit goes back up."""

    async def main() -> None:
        cases: list[tuple[Exception, int, bool]] = [
            (Busy("429"), 10, True), (ValueError("refused"), 10, True),
            (ValueError("bad row"), 3, False),
        ]  # fmt: skip
        for error, every, cut in cases:
            clock = ManualClock()

            async def fails(
                value: int, error: Exception = error, every: int = every,
                clock: ManualClock = clock,
            ) -> list[int]:  # fmt: skip
                answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                clock.call_at(clock.now() + 0.005,
                              lambda: answered.done() or answered.set_result(None))  # fmt: skip
                await answered
                if value % 10 < every:  # every one in ten (all) or three in ten
                    raise error
                return [value]

            op = AsyncWaitOperator(fails, output=lambda _: None, timeout=5.0, capacity="auto",
                                   clock=clock, on_failure=lambda *_: [])  # fmt: skip
            await op.open()
            await _drive(op, clock, 1.0)
            assert op.limiter is not None
            assert (op.limiter.limit < 16) is cut, (error, every, op.limiter)
            await op.close()

    run(main())


class ErrorsBeyond(AsyncFunction[int, int]):
    """A service on the manual clock: up to ``knee`` requests are answered in 20 ms; one
    beyond them is answered in 1 ms with an error that does not declare overload."""

    def __init__(self, clock: ManualClock, knee: int) -> None:
        self.clock = clock
        self.knee = knee
        self.serving = 0

    async def async_invoke(self, value: int) -> list[int]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ok = self.serving < self.knee
        self.serving += ok
        self.clock.call_at(self.clock.now() + (0.020 if ok else 0.001),
                           lambda: fut.done() or fut.set_result(None))  # fmt: skip
        try:
            await fut
        finally:
            self.serving -= ok
        if not ok:
            raise RuntimeError("500")
        return [value]


def test_auto_capacity_takes_error_rows_for_no_throughput(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        rows: list[Any] = []
        op = AsyncWaitOperator(ErrorsBeyond(clock, knee=16), output=lambda r: rows.append(r.value),
                               timeout=5.0, capacity="auto", clock=clock,
                               on_failure=lambda *_: ["error"])  # fmt: skip
        await op.open()
        await _drive(op, clock, 3.0)
        assert op.limiter is not None and op.limiter.limit <= 20, op.limiter
        errors = rows.count("error")
        assert len(rows) > 0.8 * 16 / 0.020 * 3.0 * 0.8  # near the service's 800/s
        assert errors < 0.05 * len(rows), (errors, len(rows))
        await op.close()

    run(main())


def test_a_slot_refused_at_once_waits_before_its_next_request(run: Runner[Any]) -> None:
    """A service that refuses everything in 1 ms: without a pause after such an error,
    a single slot would send a thousand requests a second (each an error row); the
    slot stays taken a latency floor (10 ms before any answer), doubled for each round
    in a row in which most failed, so a second makes about a hundred calls."""

    async def main() -> None:
        clock = ManualClock()
        calls = 0

        async def refused(value: int) -> list[int]:
            nonlocal calls
            calls += 1
            answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            clock.call_at(clock.now() + 0.001,
                          lambda: answered.done() or answered.set_result(None))  # fmt: skip
            await answered
            raise RuntimeError("500")

        rows: list[Any] = []
        op = AsyncWaitOperator(refused, output=rows.append, timeout=5.0, capacity="auto",
                               clock=clock, on_failure=lambda *_: ["error"])  # fmt: skip
        await op.open()
        await _drive(op, clock, 1.0)
        assert op.limiter is not None and op.limiter.limit < 16, op.limiter
        assert calls < 200, (calls, op.limiter)  # without the pause: 1,502
        await op.close()

    run(main())


def _round(limit: AdaptiveLimit, n: int, seconds: float, start: float,
           errors: int = 0, latency: float = 0.005) -> float:  # fmt: skip
    """``n`` completions at ``limit.limit`` in flight, evenly over ``seconds`` from
    ``start``, the first ``errors`` of them errors answered in 1 ms; returns the end."""
    in_flight = limit.limit
    for i in range(n):
        now = start + seconds * (i + 1) / n
        failed = i < errors
        limit.on_complete(0.001 if failed else latency, in_flight, now, failed=failed)
    return start + seconds


def test_errors_past_the_prior_are_judged_at_once_whatever_the_round_s_size() -> None:
    # one completion in four an error: against the prior (no errors in 20), cut within
    # the round, not passed for chance because the prior is only 20 completions
    limit = AdaptiveLimit(initial=64)
    for i in range(60):
        limit.on_complete(0.001 if i % 4 == 0 else 0.02, 64, now=0.001 * (i + 1),
                          failed=i % 4 == 0)  # fmt: skip
    assert limit.limit == 32 and limit.cuts == 1


def test_errors_of_requests_in_flight_above_a_cut_do_not_cut_it_again() -> None:
    limit = AdaptiveLimit(initial=16)
    t = 0.0
    for in_flight in range(16, 8, -1):  # everything refused at once: cut at the first ones
        t += 0.001
        limit.on_complete(0.001, in_flight, now=t, failed=True)
    assert limit.limit == 8 and limit.cuts == 1  # the old limit's requests: no second cut
    for _ in range(12):  # refused again at the new limit: cut again
        t += 0.001
        limit.on_complete(0.001, 8, now=t, failed=True)
    assert limit.limit == 4 and limit.cuts == 2


def test_a_limit_starts_below_where_the_service_refused_the_last_partition() -> None:
    limit = AdaptiveLimit(initial=14, refused_at=9)
    assert limit.limit == 8 and limit.refused_at == 9
    t = 0.0
    for _ in range(6):  # goodput doubling each round: startup stays below the refusal
        t = _round(limit, limit.limit, 0.02, t)
    assert limit.limit <= 8
    fresh = AdaptiveLimit(initial=14)
    assert fresh.limit == 14 and fresh.refused_at == 0
