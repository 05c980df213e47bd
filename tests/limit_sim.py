"""A discrete-event simulation of an operator under ``AdaptiveLimit``, for its tests.

Work is always waiting (the operator is never short of input). Services:

- ``scaling``: every request takes its own log-normal time, whatever the concurrency;
- ``saturating(n)``: ``n`` servers, a FIFO queue beyond them (a request waits for a free
  server, then takes its log-normal time): throughput stops growing at ``n`` in flight
  and latency grows instead;
- ``cpu_bound(rate)``: the client's own loop completes at most ``rate`` requests per
  second: latency grows with the queue of completions (a busy event loop);
- ``errors_beyond(n)``: at most ``n`` requests are served at once; one arriving beyond
  them is answered at once (after ``error_latency``) with an error that does not
  declare overload (an HTTP 500): the error rate rises with the limit;
- ``error_share``: that share of requests, at random, are answered after their usual
  time with an error (rows the service does not know): errors that do not rise with
  the limit;
- ``latency_step``: ``(t, median)``: from simulated time ``t`` on, requests take the
  new median (a service that got slower or faster);
- ``overload_storm``: ``(start, end)``: every request started in that window is
  answered after ``error_latency`` with an error that declares overload (a 429).

``limit`` may be a list: that many operator instances (the partitions of a job) share
the service, each with its own limit (the outcome is their sum). The limit sees what
the operator shows it: a completion's latency (an error's with
``failed=True``, which is not goodput), and ``on_overload`` before a 429's completion;
as the operator does, a slot stays taken for the limit's ``pause_after_error``. Time is
simulated: nothing sleeps.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncio_ops._engine._limit import AdaptiveLimit


@dataclass
class Outcome:
    completed: int  # successful completions (goodput)
    seconds: float
    latencies: list[float] = field(default_factory=list)  # of successful completions
    limits: list[int] = field(default_factory=list)  # at each completion, errors included
    errors: int = 0  # completions that were errors
    times: list[float] = field(default_factory=list)  # of successful completions
    limit_times: list[float] = field(default_factory=list)  # of each entry of ``limits``

    @property
    def rate(self) -> float:
        return self.completed / self.seconds

    @property
    def error_fraction(self) -> float:
        total = self.completed + self.errors
        return self.errors / total if total else 0.0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def rate_between(self, start: float, end: float) -> float:
        """Successful completions per second in ``[start, end)``."""
        n = bisect.bisect_left(self.times, end) - bisect.bisect_left(self.times, start)
        return n / (end - start)

    def limit_at(self, t: float) -> int:
        """The limit at the last completion before ``t``."""
        return self.limits[max(0, bisect.bisect_left(self.limit_times, t) - 1)]


def simulate(
    limit: AdaptiveLimit | int | Sequence[AdaptiveLimit | int],
    seconds: float,
    *,
    median: float = 0.020,
    sigma: float = 0.3,
    servers: int | None = None,
    cpu_rate: float | None = None,
    errors_beyond: int | None = None,
    error_latency: float = 0.001,
    error_share: float = 0.0,
    latency_step: tuple[float, float] | None = None,
    overload_storm: tuple[float, float] | None = None,
    seed: int = 1,
) -> Outcome:
    rng = random.Random(seed)

    def service_time() -> float:
        m = median if latency_step is None or now < latency_step[0] else latency_step[1]
        return m * math.exp(sigma * rng.gauss(0.0, 1.0))

    now = 0.0
    limits = list(limit) if isinstance(limit, Sequence) else [limit]
    # (time, seq, kind, started, owner: the index of the instance whose request it is)
    events: list[tuple[float, int, str, float, int]] = []
    seq = 0
    in_flights = [0] * len(limits)
    busy = 0
    serving = 0  # errors_beyond: requests being served (not answered with an error)
    waiting: deque[tuple[float, int]] = deque()  # (started, owner) of requests queued
    done_queue_free_at = 0.0  # cpu_bound: when the loop can complete the next one
    out = Outcome(0, seconds)

    def current(owner: int) -> int:
        one = limits[owner]
        return one if isinstance(one, int) else one.limit

    def start(owner: int) -> None:
        nonlocal seq, busy, serving
        in_flights[owner] += 1
        seq += 1
        if overload_storm is not None and overload_storm[0] <= now < overload_storm[1]:
            heapq.heappush(events, (now + error_latency, seq, "overload", now, owner))
            return
        if errors_beyond is not None:
            if serving >= errors_beyond:
                heapq.heappush(events, (now + error_latency, seq, "error", now, owner))
                return
            serving += 1
        if servers is not None and busy >= servers:
            waiting.append((now, owner))
            return
        busy += 1
        heapq.heappush(events, (now + service_time(), seq, "served", now, owner))

    while True:
        for i in range(len(limits)):
            while in_flights[i] < current(i):
                start(i)
        t, _, kind, started, owner = heapq.heappop(events)
        if t > seconds:
            break
        now = t
        if kind == "free":  # the end of a slot's pause after an error
            in_flights[owner] -= 1
            continue
        if kind == "served":
            if errors_beyond is not None:
                serving -= 1
            if servers is not None:
                busy -= 1
                if waiting:
                    busy += 1
                    seq += 1
                    queued, whose = waiting.popleft()
                    heapq.heappush(events, (now + service_time(), seq, "served", queued, whose))
            if cpu_rate is not None:  # the loop completes one at a time
                done_queue_free_at = max(done_queue_free_at, now) + 1.0 / cpu_rate
                seq += 1
                heapq.heappush(events, (done_queue_free_at, seq, "done", started, owner))
                continue
        latency = now - started
        failed = kind in ("error", "overload") or (error_share > 0 and rng.random() < error_share)
        one = limits[owner]
        pause = 0.0
        if not isinstance(one, int):
            if kind == "overload":
                one.on_overload(now)
            one.on_complete(latency, in_flights[owner], now, failed=failed)
            if failed:
                pause = one.pause_after_error(latency)
        if pause > 0:  # as the operator does: the slot stays taken a while
            seq += 1
            heapq.heappush(events, (now + pause, seq, "free", started, owner))
        else:
            in_flights[owner] -= 1
        if failed:
            out.errors += 1
        else:
            out.completed += 1
            out.latencies.append(latency)
            out.times.append(now)
        out.limits.append(sum(current(i) for i in range(len(limits))))
        out.limit_times.append(now)
    return out
