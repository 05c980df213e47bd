"""A discrete-event simulation of an operator under ``AdaptiveLimit``, for its tests.

Work is always waiting (the operator is never short of input). Services:

- ``scaling``: every request takes its own log-normal time, whatever the concurrency;
- ``saturating(n)``: ``n`` servers, a FIFO queue beyond them (a request waits for a free
  server, then takes its log-normal time): throughput stops growing at ``n`` in flight
  and latency grows instead;
- ``cpu_bound(rate)``: the client's own loop completes at most ``rate`` requests per
  second: latency grows with the queue of completions (a busy event loop).

Time is simulated: nothing sleeps.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from asyncio_ops._limit import AdaptiveLimit


@dataclass
class Outcome:
    completed: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.completed / self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(
    limit: AdaptiveLimit | int,
    seconds: float,
    *,
    median: float = 0.020,
    sigma: float = 0.3,
    servers: int | None = None,
    cpu_rate: float | None = None,
    seed: int = 1,
) -> Outcome:
    rng = random.Random(seed)

    def service_time() -> float:
        return median * math.exp(sigma * rng.gauss(0.0, 1.0))

    now = 0.0
    events: list[tuple[float, int, str, float]] = []  # (time, seq, kind, started)
    seq = 0
    in_flight = 0
    busy = 0
    waiting: deque[float] = deque()  # started times of requests queued for a server
    done_queue_free_at = 0.0  # cpu_bound: when the loop can complete the next one
    out = Outcome(0, seconds)

    def current() -> int:
        return limit if isinstance(limit, int) else limit.limit

    def start() -> None:
        nonlocal seq, in_flight, busy
        in_flight += 1
        if servers is not None and busy >= servers:
            waiting.append(now)
            return
        busy += 1
        seq += 1
        heapq.heappush(events, (now + service_time(), seq, "served", now))

    while True:
        while in_flight < current():
            start()
        t, _, kind, started = heapq.heappop(events)
        if t > seconds:
            break
        now = t
        if kind == "served":
            if servers is not None:
                busy -= 1
                if waiting:
                    busy += 1
                    seq += 1
                    heapq.heappush(events, (now + service_time(), seq, "served", waiting.popleft()))
            if cpu_rate is not None:  # the loop completes one at a time
                done_queue_free_at = max(done_queue_free_at, now) + 1.0 / cpu_rate
                seq += 1
                heapq.heappush(events, (done_queue_free_at, seq, "done", started))
                continue
        latency = now - started
        if not isinstance(limit, int):
            limit.on_complete(latency, in_flight, now)
        in_flight -= 1
        out.completed += 1
        out.latencies.append(latency)
        out.limits.append(current())
    return out
