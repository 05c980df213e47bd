"""Slowing down for a service that says so: a connector's request pace, learned from 429s.

Contract. A connector given no :class:`~asyncio_ops.connectors.RateLimit` still meets
services that answer 429 ("too many requests") or 503 ("unavailable") when asked
too fast. Such an answer is not an error of the row: the connector sends it again,
as often as it takes, within the operator's ``timeout`` (only other errors count
against ``max_retries``), and every request of the worker process to that service
(its :class:`Pace`, one per service key and event loop) slows down:

- until the first "slow down" nothing is paced: requests go as the operator's
  capacity lets them;
- a "slow down" sets the pace to half the rate requests went at over the last
  second (multiplicative decrease, at most once a second), and holds every request
  for the answer's ``Retry-After`` (clipped to ``max_pause``, with a warning), or a
  short backoff without one;
- each answer that is not a "slow down" raises the pace by one request per second,
  so it doubles each second its requests are answered (TCP's slow start): the
  pace climbs back to the service's rate within seconds of a storm, and probes
  above it now and then (to be cut again); ten seconds without a "slow down"
  lift the pace.

With a ``RateLimit`` the limit paces instead, and a ``Retry-After`` pauses it for
every process sharing it (:meth:`RateLimit.pause`, clipped the same way).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Hashable
from typing import Final

__all__ = ["SLOW_DOWN", "Pace", "clipped", "pace_of"]

log = logging.getLogger("asyncio_ops.connectors")

SLOW_DOWN: Final = frozenset({429, 503})  # the statuses that ask a client to slow down
_MIN_RATE: Final = 0.5  # requests per second: the pace never stops a service for good
_DECREASE_EVERY: Final = 1.0  # seconds between two cuts of the pace
_LIFT_AFTER: Final = 10.0  # seconds without a "slow down" before the pace is lifted
_BACKOFF: Final = 0.5  # seconds held after a "slow down" that names no Retry-After


def clipped(seconds: float, most: float, who: str, option: str = "") -> float:
    """A wait a server asked for (a Retry-After), at most ``most`` seconds: a longer one
    (or NaN) is clipped, with a warning naming ``who`` (and the ``option`` that bounds
    it). Nothing a server sends holds a client without bounds."""
    if seconds <= most:
        return seconds
    bound = f"{option}={most}" if option else str(most)
    log.warning("%s: a Retry-After of %s s is clipped to %s s", who, seconds, bound)
    return most


class Pace:
    """One service's request pace in one process and event loop (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rate: float | None = None  # requests per second; None: not paced
        self.next_at = 0.0  # when the next paced request may go (monotonic)
        self.held_until = 0.0  # a Retry-After holds every request until then
        self.cut_at = -float("inf")  # the last decrease
        self.sent: collections.deque[float] = collections.deque()  # the last second's sends
        self.turns = asyncio.Lock()  # paced requests take their turns in order

    def free(self) -> bool:
        """Count a request about to go; True if it may go now (not paced, not held), so
        that the common case costs no await. Otherwise it waits in :meth:`wait`."""
        now = time.monotonic()
        sent = self.sent
        sent.append(now)
        while sent[0] < now - 1.0:
            sent.popleft()
        if self.rate is not None and now - self.cut_at > _LIFT_AFTER:
            self.rate = None  # long enough without a "slow down": not paced any more
        return self.rate is None and now >= self.held_until

    async def wait(self) -> float:
        """Wait for the turn of a request :meth:`free` counted; the seconds waited.
        Paced requests take their turns one after the other (first come, first
        served), each spaced by the pace at its turn, so a pace that rises takes effect
        at once."""
        started = now = time.monotonic()
        async with self.turns:
            while True:
                now = time.monotonic()
                rate = self.rate
                turn = max(self.held_until, self.next_at if rate is not None else now)
                if turn <= now:
                    break
                await asyncio.sleep(turn - now)  # the pace or the hold may change meanwhile
            if rate is not None:
                self.next_at = now + 1.0 / rate
        return now - started

    def slow_down(self, retry_after: float | None, max_pause: float) -> None:
        """The service said "slow down": cut the pace (at most once a second) and hold
        every request for ``retry_after`` (:func:`clipped` to ``max_pause``) or a short
        backoff."""
        now = time.monotonic()
        if now - self.cut_at >= _DECREASE_EVERY:
            self.cut_at = now
            went = len(self.sent) if self.rate is None else self.rate
            self.rate = max(_MIN_RATE, went / 2)
        hold = _BACKOFF if retry_after is None else clipped(retry_after, max_pause, self.name)
        self.held_until = max(self.held_until, now + hold)

    def answered(self) -> None:
        """An answer that is not a "slow down": one request per second more, so the pace
        doubles each second its requests are answered (TCP's slow start)."""
        if self.rate is not None:
            self.rate += 1.0


# per event loop (a loop that ends takes its paces with it), per service
_PACES: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Pace]]] = (
    weakref.WeakKeyDictionary()
)


def pace_of(key: Hashable, name: str) -> Pace:
    """The pace of the service ``key`` in this process and the running event loop."""
    loop = asyncio.get_running_loop()
    paces = _PACES.get(loop)
    if paces is None:
        paces = _PACES[loop] = {}
    pace = paces.get(key)
    if pace is None:
        pace = paces[key] = Pace(name)
    return pace
