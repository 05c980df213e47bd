"""RateLimit: requests per second and tokens per minute, per worker process or shared.

One job: the limit, its state in a process and its round trips to Redis (the scripts
Redis runs are in ``_rate_scripts``).

Contract::

    limit = RateLimit(requests_per_second=20, tokens_per_minute=90_000,
                      shared="redis://host:6379/0", name="openai-prod")
    async with limit.acquire(tokens=estimate):   # waits for 1 request and the tokens
        answer = await call(...)
    await limit.pause(retry_after)               # a 429 seen: everyone waits

Semantics. Each dimension is a GCRA (generic cell rate algorithm, the
token bucket as a "theoretical arrival time"): at ``rate`` units per second a
unit is due ``1 / rate`` seconds after the one before, and up to ``burst``
units may go at once after an idle spell. ``acquire`` reserves its units and
waits until they are due: callers are served in the order they asked, a
request never waits on a later one, and over any window of ``t`` seconds at
most ``rate * t + burst`` units go out. A request with more tokens than the
token burst waits until they are due (it is never refused).

Without ``shared`` the budget is the worker process's: every lookup copy in
one Python worker with equal settings shares it (Spark runs one per task
slot, so a job of N concurrent tasks may send N times the rate). With
``shared="redis://..."`` the budget is one for every process of every
executor and job naming the same ``name``: the reservation is one atomic
step of a Lua script on the Redis server (its clock, ``TIME``, is the only
clock), under the keys ``asyncio_ops:rate:<name>:requests``, ``:tokens`` and
``:pause``, which expire once idle. Request permits are leased ``lease`` at a
time, but never more than the rate gives in ``LEASE_SECONDS`` (0.1 s; at least
one), so a process pays one round trip per lease while a process that stops
(its task ended) leaves at most a tenth of a second of the budget unused. A
leased permit is a slot of the shared schedule: one not used within one
interval after it came due (the process was busy elsewhere, or between
tasks) is dropped, never sent late on top of other processes' slots; permits
a process leased and did not use are lost to the budget, never added to it.
Tokens are reserved with each request that names them.

``pause(seconds)`` (a 429 or 503 with Retry-After) holds the limit: every
reservation not yet due moves that many seconds later, keeping its order and
spacing (so the end of a pause is not a burst), and new ones start after it;
in the process that paused at once (its waiters and leased permits), in the
others at their next round trip to Redis (the permits they hold leased, at
most ``lease`` each, are not recalled). ``on_unavailable``: when Redis cannot be reached at the
first acquire, or later, ``"fail"`` (the default) raises
:class:`LookupConnectionError` naming the URL (without password);
``"local"`` goes on with a per-process budget of ``local_share`` of the rates
(give ``1/N`` for N tasks at once), logged once, and tries Redis again after
``retry_unavailable`` seconds. Never an unlimited burst.

When Redis loses a record (a flush, a restart without persistence, an eviction,
a failover): each process keeps, per record it changed, the value it left it at
(a bucket's theoretical arrival time on the server's clock, a running total),
and sends it with its next change. A record found gone while that value is
still ahead restarts from it, and for ``RESTORE_WINDOW`` seconds every process's
value raises it (the ``:restored`` key), so it soon holds the latest any had;
the process logs a warning and counts it. A loss so never moves a process's
schedule earlier nor refunds what it spent. A connection the server closed is
made again (3 attempts): a reservation sent twice when its answer was lost
takes more, never less.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from asyncio_ops import ConfigurationError, Scheduler
from asyncio_ops.options import seconds

from ._exceptions import LookupConnectionError
from ._redact import redact_dsn

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["Permit", "RateLimit", "RateLimitStatistics", "rate_limit_option"]

from ._rate_scripts import PAUSE as _PAUSE
from ._rate_scripts import RESERVE as _RESERVE
from ._rate_scripts import RESTORE_WINDOW
from ._rate_scripts import SETTINGS as _SETTINGS
from ._rate_scripts import TOTAL as _TOTAL
from ._slow_down import clipped

log = logging.getLogger("asyncio_ops.connectors")

LEASE_SECONDS: Final = 0.1
"""A lease holds at most this many seconds of the shared request rate."""

# how long a shared limit's settings are kept after the last process checked them, and how
# often a process checks them again (seconds)
_SETTINGS_TTL: Final = 3600.0
_SETTINGS_EVERY: Final = 600.0


@dataclass(frozen=True)
class RateLimitStatistics:
    """Counters of one limit in this process: ``requests`` and ``tokens`` acquired,
    ``waited`` seconds spent waiting for them (summed over callers), ``round_trips``
    to Redis, ``fallbacks`` (acquires served by the local share while Redis was
    unreachable), ``dropped`` (shared limits: leased request permits whose slot
    passed unused, lost to the budget rather than sent late), ``restored`` (shared
    limits: records Redis had lost that this process restored from what it knew).

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors import RateLimit
    >>> limit = RateLimit(requests_per_second=100, burst=5)
    >>> async def call():
    ...     async with limit.acquire():
    ...         pass  # the request
    >>> asyncio.run(call())
    >>> limit.statistics().requests
    1
    """

    requests: int
    tokens: int
    waited: float
    round_trips: int
    fallbacks: int
    dropped: int = 0
    restored: int = 0


@dataclass(frozen=True)
class Permit:
    """What one ``acquire`` was given: the ``tokens`` it reserved, and the seconds it
    ``waited`` for them (on the limit's clock, round trips to Redis included) before
    its block ran.

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors import RateLimit
    >>> async def call(limit):
    ...     async with limit.acquire(tokens=1200) as permit:
    ...         return permit.tokens  # permit.waited: the seconds it waited
    >>> asyncio.run(call(RateLimit(tokens_per_minute=90_000)))
    1200.0
    """

    tokens: float
    waited: float


def rate_limit_option(
    value: object, *, burst: int, name: str, option: str = "rate_limit"
) -> RateLimit | None:
    """A connector's ``rate_limit=``: a :class:`RateLimit` as given (per process, or
    shared through Redis), a number of requests per second of this process (a
    RateLimit named ``name``, ``burst`` at once: every lookup in the process with
    equal settings shares it), or None (no limit). Anything else is a
    ConfigurationError naming the option and the value."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{option} must be requests per second (a number > 0) or an "
            f"asyncio_ops.connectors.RateLimit, got {value!r}"
        )
    return RateLimit(requests_per_second=_positive(value, option), burst=burst, name=name)


class _Gcra:
    """One dimension's budget in this process (see the module docstring)."""

    __slots__ = ("interval", "tat", "tolerance")

    def __init__(self, rate: float, burst: float) -> None:
        self.interval = 1.0 / rate
        self.tolerance = burst * self.interval
        self.tat = -math.inf

    def reserve(self, units: float, now: float, paused_until: float) -> float:
        """Reserve ``units``; the time the last of them is due (to the nanosecond, so
        that sums of intervals meet the times a clock reaches)."""
        tat = max(self.tat, now, paused_until + self.tolerance - self.interval)
        self.tat = tat + units * self.interval
        return round(self.tat - self.tolerance, 9)

    def shift(self, now: float, seconds_: float) -> None:
        """A pause: reservations not yet due move ``seconds_`` later."""
        if self.tat > now:
            self.tat += seconds_


class RateLimit:
    """Requests per second and tokens per minute (see the module docstring).

    ``requests_per_second``/``burst``: the request budget (burst: requests that may
    go at once, default 1); ``tokens_per_minute``/``token_burst``: the token budget
    (default burst: one second's tokens); at least one of the two rates.
    ``shared``: a ``redis://`` URL for a budget shared by every process naming
    the same ``name`` (required with it). ``lease``: request permits fetched per
    round trip. ``on_unavailable``/``local_share``/``retry_unavailable``: what
    happens without Redis. ``clock``: a :class:`asyncio_ops.Scheduler` time comes
    from and waits are scheduled on (``asyncio_ops.testing.ManualClock`` in tests;
    the shared script then takes its time too); default: the monotonic clock.

    Example::

        from asyncio_ops.connectors import RateLimit
        from asyncio_ops.connectors.openai import ChatLookup

        quota = RateLimit(requests_per_second=20, tokens_per_minute=90_000, burst=5,
                          shared="redis://redis:6379/0", name="openai-prod")  # the cluster's
        chat = ChatLookup(base, "gpt-4o-mini", prompt="{text}", rate_limit=quota)

        async with quota.acquire(tokens=1200) as permit:  # a call of your own
            ...
    """

    def __init__(
        self,
        requests_per_second: float | None = None,
        tokens_per_minute: float | None = None,
        *,
        burst: float = 1,
        token_burst: float | None = None,
        shared: str | None = None,
        name: str | None = None,
        lease: int = 8,
        on_unavailable: str = "fail",
        local_share: float | None = None,
        retry_unavailable: float = 30.0,
        clock: Scheduler | None = None,
        max_pause: float = 300.0,
    ) -> None:
        if requests_per_second is None and tokens_per_minute is None:
            raise ConfigurationError("RateLimit needs requests_per_second or tokens_per_minute")
        self.requests_per_second = (
            None if requests_per_second is None
            else _positive(requests_per_second, "requests_per_second")
        )  # fmt: skip
        self.tokens_per_minute = (
            None if tokens_per_minute is None else _positive(tokens_per_minute, "tokens_per_minute")
        )
        self.burst = _positive(burst, "burst")
        token_rate = None if self.tokens_per_minute is None else self.tokens_per_minute / 60.0
        self.token_burst = (
            _positive(token_burst, "token_burst") if token_burst is not None
            else (token_rate or 1.0)
        )  # fmt: skip
        if shared is not None:
            if not isinstance(shared, str) or not shared.startswith(("redis://", "rediss://")):
                raise ConfigurationError(
                    f"shared must be a redis:// or rediss:// URL, got {redact_dsn(str(shared))!r}"
                )
            if not isinstance(name, str) or not name:
                raise ConfigurationError("a shared RateLimit needs name= (what its jobs share)")
        self.shared = shared
        self.name = name
        if not isinstance(lease, int) or lease < 1:
            raise ConfigurationError(f"lease must be an int >= 1, got {lease!r}")
        self.lease = lease
        if on_unavailable not in ("fail", "local"):
            raise ConfigurationError(
                f"on_unavailable must be 'fail' or 'local', got {on_unavailable!r}"
            )
        if on_unavailable == "local":
            if local_share is None:
                raise ConfigurationError(
                    "on_unavailable='local' needs local_share= (this process's part of the "
                    "rates while Redis is unreachable: 1/N for N tasks at once)"
                )
            local_share = _positive(local_share, "local_share")
            if local_share > 1:
                raise ConfigurationError(f"local_share must be <= 1, got {local_share!r}")
        self.on_unavailable = on_unavailable
        self.local_share = local_share
        self.retry_unavailable = seconds(retry_unavailable, "retry_unavailable")
        # the longest pause a server's Retry-After imposes (on every process sharing it)
        self.max_pause = seconds(max_pause, "max_pause")
        self.clock = clock
        self._state: _State | None = None

    # -- pickling: configuration only (the state belongs to a process and a loop) ----------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_state"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def key(self) -> Hashable:
        """What makes two limits one budget in a process."""
        return (
            self.requests_per_second, self.tokens_per_minute, self.burst, self.token_burst,
            self.shared, self.name, self.lease, self.on_unavailable, self.local_share,
        )  # fmt: skip

    def _local(self) -> _State:
        state = self._state
        loop = asyncio.get_running_loop()
        if state is None or state.loop is not loop:
            key = (id(loop), self.key())
            state = _STATES.get(key)
            if state is None or state.loop is not loop:
                state = _STATES[key] = _State(self, loop)
            self._state = state
        return state

    @asynccontextmanager
    async def acquire(self, tokens: float = 0) -> AsyncIterator[Permit]:
        """Wait for one request permit and ``tokens`` tokens, then run the block (given
        the :class:`Permit`: what was reserved, and how long it waited)."""
        if tokens < 0 or not math.isfinite(tokens):
            raise ConfigurationError(f"tokens must be a finite number >= 0, got {tokens!r}")
        waited = await self._local().acquire(tokens)
        yield Permit(float(tokens), waited)

    async def settle(self, reserved: float, used: float) -> None:
        """After a call: it reserved ``reserved`` tokens and was billed ``used`` (the
        answer's usage); the difference goes back to the budget, or is taken from it,
        so that the limit follows what the server counts rather than an estimate."""
        if self.tokens_per_minute is not None and used != reserved:
            await self._local().settle(float(used) - float(reserved))

    async def take_total(self, budget: str, units: int, maximum: int | None) -> int | None:
        """Add ``units`` (negative: give back) to the running total named ``budget``
        unless it would pass ``maximum``: the total after, or None when refused. Shared,
        the total is one for every process (``asyncio_ops:rate:<name>:total:<budget>``
        on the Redis server, one atomic step, kept a week after its last change);
        otherwise it is this process's. Redis unreachable: as ``on_unavailable`` says
        (an error, or this process's count meanwhile)."""
        return await self._local().take_total(budget, int(units), maximum)

    async def pause(self, seconds_: float) -> None:
        """Hold every reservation after now for ``seconds_`` (every sharing process), at
        most ``max_pause``: a server's Retry-After is not trusted without bounds (one
        ``Retry-After: 86400`` would hold every job sharing the limit for a day); a
        longer one is clipped, with a warning."""
        who = f"RateLimit {self.name or '(per process)'}"
        await self._local().pause(clipped(max(0.0, float(seconds_)), self.max_pause, who,
                                          "max_pause"))  # fmt: skip

    def statistics(self) -> RateLimitStatistics:
        state = self._state
        if state is None:
            return RateLimitStatistics(0, 0, 0.0, 0, 0)
        return RateLimitStatistics(state.requests, state.tokens, state.waited,
                                   state.round_trips, state.fallbacks, state.dropped,
                                   state.restored)  # fmt: skip

    def __repr__(self) -> str:
        where = f", shared={redact_dsn(self.shared)!r}, name={self.name!r}" if self.shared else ""
        return (
            f"RateLimit(requests_per_second={self.requests_per_second!r}, "
            f"tokens_per_minute={self.tokens_per_minute!r}{where})"
        )


def _positive(value: object, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or (not math.isfinite(value))
    ):
        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class _State:
    """One process's (and event loop's) side of a limit: its local buckets, its leased
    permits and its Redis client."""

    def __init__(self, limit: RateLimit, loop: asyncio.AbstractEventLoop) -> None:
        self.limit = limit
        self.loop = loop
        self.now: Callable[[], float] = time.monotonic if limit.clock is None else limit.clock.now
        share = 1.0 if limit.shared is None else (limit.local_share or 1.0)
        rps, tpm = limit.requests_per_second, limit.tokens_per_minute
        self.requests_bucket = None if rps is None else _Gcra(rps * share, limit.burst)
        self.tokens_bucket = None if tpm is None else _Gcra(tpm / 60.0 * share, limit.token_burst)
        self.paused_until = -math.inf
        self.pause_log: list[tuple[float, float]] = []  # (start, length) of each pause
        self.leased: collections.deque[float] = collections.deque()  # due times, local clock
        self.lock = asyncio.Lock()
        self.client: aioredis.Redis | None = None
        self.script: Any = None
        self.down_until = -math.inf
        self.settings_checked = -math.inf  # when this process last checked the name's settings
        self.requests = 0
        self.tokens = 0
        self.waited = 0.0
        self.round_trips = 0
        self.fallbacks = 0
        self.dropped = 0
        self.restored = 0
        self.restore_logged = -math.inf
        self.totals: dict[str, int] = {}
        # shared: what this process knows of the records in Redis, as of its last change
        # to each (a bucket's value on the server's clock, a running total): a record
        # Redis lost restarts from them, never from nothing
        self.floors: dict[str, float] = {}

    async def acquire(self, tokens: float) -> float:
        """Reserve and wait; the seconds it took."""
        limit = self.limit
        now = self.now()
        start = now
        pauses = len(self.pause_log)
        if limit.shared is not None and now >= self.down_until:
            due = await self._reserve_shared(tokens)
        else:
            if limit.shared is not None:
                self.fallbacks += 1
            due = self._reserve_local(tokens, now)
        self.requests += 1
        self.tokens += int(tokens)
        while True:
            delay = due - self.now()
            if delay > 0:
                self.waited += delay
                await self._sleep(delay)
            # a pause that came while this one waited (a 429 seen in this process) moves
            # it as late as the pause is long, keeping its place and spacing
            moved = sum(length for start, length in self.pause_log[pauses:] if start <= due)
            pauses = len(self.pause_log)
            if moved <= 0:
                return max(0.0, self.now() - start)
            due += moved

    def _reserve_local(self, tokens: float, now: float) -> float:
        due = now
        if self.requests_bucket is not None:
            due = max(due, self.requests_bucket.reserve(1, now, self.paused_until))
        if self.tokens_bucket is not None and tokens > 0:
            due = max(due, self.tokens_bucket.reserve(tokens, now, self.paused_until))
        return due

    async def _reserve_shared(self, tokens: float) -> float:
        limit = self.limit
        try:
            async with self.lock:  # one lease at a time; callers keep their order
                due = self.now()
                if limit.requests_per_second is not None:
                    step = 1.0 / limit.requests_per_second
                    while self.leased and self.leased[0] < due - step:
                        self.leased.popleft()  # a slot missed: dropped, never sent late
                        self.dropped += 1
                    if not self.leased:
                        most = int(limit.requests_per_second * LEASE_SECONDS)
                        lease = max(1, min(limit.lease, most))
                        first, _ = await self._round_trip(
                            "requests", limit.requests_per_second, limit.burst, lease
                        )
                        self.leased.extend(first + i * step for i in range(lease))
                    due = max(due, self.leased.popleft(), self.paused_until)
                if limit.tokens_per_minute is not None and tokens > 0:
                    first, _ = await self._round_trip(
                        "tokens", limit.tokens_per_minute / 60.0, limit.token_burst, tokens
                    )
                    due = max(due, first + (tokens - 1) * 60.0 / limit.tokens_per_minute)
                return due
        except LookupConnectionError:
            if limit.on_unavailable == "fail":
                raise
            self.down_until = self.now() + limit.retry_unavailable
            log.warning(
                "shared rate limit %r at %s is unreachable: going on with %s of its rates in "
                "this process for %s s", limit.name, redact_dsn(limit.shared or ""),
                limit.local_share, limit.retry_unavailable,
            )  # fmt: skip
            self.fallbacks += 1
            return self._reserve_local(tokens, self.now())

    def _connect(self) -> aioredis.Redis:
        """The process's client for the shared limit (made on first use, connecting lazily)."""
        if self.client is None:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import ExponentialBackoff
            from redis.exceptions import ConnectionError as RedisConnectionError

            assert self.limit.shared is not None
            # a connection the server closed (it restarted, or failed over) is made again:
            # a reservation sent twice when its answer was lost only takes more, never less
            self.client = aioredis.Redis.from_url(
                self.limit.shared, socket_timeout=5, socket_connect_timeout=5,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                retry_on_error=[RedisConnectionError],
            )  # fmt: skip
            self.script = self.client.register_script(_RESERVE)
        return self.client

    def _unreachable(self, exc: Exception) -> Exception:
        """``exc`` as raised by the Redis client: a LookupConnectionError naming the limit
        and the server (its credentials hidden) when Redis could not be reached, else
        ``exc`` itself (a bug or a script error: never taken for an outage)."""
        from redis import exceptions as rx

        if not isinstance(exc, rx.ConnectionError | rx.TimeoutError | OSError):
            return exc
        limit = self.limit
        return LookupConnectionError(
            f"shared rate limit {limit.name!r}: Redis at {redact_dsn(limit.shared or '')} "
            f"is unreachable: {exc}"
        )

    def _outage(self, exc: Exception) -> None:
        """Raise for ``exc`` unless Redis could not be reached and the limit goes on
        without it (``on_unavailable="local"``: return, the caller falls back): ``exc``
        itself for anything but an outage, else :meth:`_unreachable`'s error."""
        error = self._unreachable(exc)
        if error is exc:
            raise exc
        if self.limit.on_unavailable == "fail":
            raise error from exc

    async def _round_trip(
        self, dimension: str, rate: float, burst: float, units: float
    ) -> tuple[float, float]:
        """Reserve ``units`` on the server; (when the first is due, now) on the local clock."""
        limit = self.limit
        assert limit.shared is not None and limit.name is not None
        base = f"asyncio_ops:rate:{limit.name}"
        interval = 1.0 / rate
        sent = self.now()
        try:
            client = self._connect()
            if sent - self.settings_checked >= _SETTINGS_EVERY:
                await self._check_settings(client)
                self.settings_checked = sent
            floor = self.floors.get(dimension)
            reply = await self.script(
                keys=[f"{base}:{dimension}", f"{base}:pause", f"{base}:restored"],
                args=[repr(interval), repr(burst * interval), repr(float(units)), 60_000,
                      repr(sent) if limit.clock is not None else "",
                      "" if floor is None else repr(floor)],
            )  # fmt: skip
        except Exception as exc:
            error = self._unreachable(exc)
            if error is exc:
                raise
            raise error from exc
        self.round_trips += 1
        self.floors[dimension] = float(reply[2])
        if int(reply[3]):
            self._restored(f"its {dimension} schedule")
        first = float(reply[0])
        # due times on this process's clock: relative to when the reply came back
        arrived = self.now() if limit.clock is None else sent
        return arrived + first, arrived

    async def _check_settings(self, client: aioredis.Redis) -> None:
        """The settings a shared limit's name was first used with are this process's: a
        ConfigurationError naming both if not (two jobs naming one limit at 2/s and 50/s
        would each take their own rate from one budget)."""
        limit = self.limit
        mine = json.dumps(
            {"requests_per_second": limit.requests_per_second,
             "tokens_per_minute": limit.tokens_per_minute, "burst": limit.burst,
             "token_burst": limit.token_burst}, sort_keys=True,
        )  # fmt: skip
        key = f"asyncio_ops:rate:{limit.name}:settings"
        held = await client.eval(_SETTINGS, 1, key, mine, int(_SETTINGS_TTL * 1000))
        held = held.decode() if isinstance(held, bytes) else str(held)
        if held != mine:
            raise ConfigurationError(
                f"the shared RateLimit {limit.name!r} is in use with the settings {held}, "
                f"not this one's {mine}: one name is one budget. Give this limit another "
                f"name=, or the same settings (the name's settings are kept at {key} "
                f"until {int(_SETTINGS_TTL)} s after its last use)"
            )

    async def take_total(self, budget: str, units: int, maximum: int | None) -> int | None:
        limit = self.limit
        if limit.shared is not None and self.now() >= self.down_until:
            assert limit.name is not None
            try:
                client = self._connect()
                floor = self.floors.get(f"total:{budget}")
                added, total, restored = await client.eval(
                    _TOTAL, 2, f"asyncio_ops:rate:{limit.name}:total:{budget}",
                    f"asyncio_ops:rate:{limit.name}:restored", units,
                    -1 if maximum is None else maximum, 7 * 24 * 3600 * 1000,
                    "" if floor is None else str(int(floor)),
                )  # fmt: skip
                self.round_trips += 1
                self.floors[f"total:{budget}"] = float(total)
                if int(restored):
                    self._restored(f"its running total {budget!r}")
                return int(total) if int(added) else None
            except Exception as exc:
                self._outage(exc)
                self.down_until = self.now() + limit.retry_unavailable
        total = self.totals.get(budget, 0)
        if units > 0 and maximum is not None and total + units > maximum:
            return None
        total = self.totals[budget] = total + units
        return total

    def _restored(self, what: str) -> None:
        """Redis had lost a record this process had changed, which it restored from what
        it knew: counted, and logged (once per restore window)."""
        self.restored += 1
        now = self.now()
        if now - self.restore_logged < RESTORE_WINDOW:
            return
        self.restore_logged = now
        limit = self.limit
        log.warning(
            "shared rate limit %r: Redis at %s had lost %s (flushed, restarted without "
            "persistence, evicted or failed over); restored from what this process had "
            "reserved and spent. Run that Redis with persistence (appendonly yes) and "
            "maxmemory-policy noeviction", limit.name, redact_dsn(limit.shared or ""), what,
        )  # fmt: skip

    async def settle(self, tokens: float) -> None:
        """Take ``tokens`` more (or give back, if negative) from the token budget."""
        limit = self.limit
        bucket = self.tokens_bucket
        if limit.shared is None or self.now() < self.down_until:
            if bucket is not None:
                bucket.tat += tokens * bucket.interval
            return
        assert limit.tokens_per_minute is not None
        try:
            await self._round_trip(
                "tokens", limit.tokens_per_minute / 60.0, limit.token_burst, tokens
            )
        except LookupConnectionError:
            if limit.on_unavailable == "fail":
                raise

    async def pause(self, seconds_: float) -> None:
        now = self.now()
        until = now + seconds_
        self.paused_until = max(self.paused_until, until)
        self.pause_log.append((now, seconds_))
        self.leased = collections.deque(t + seconds_ if t >= now else t for t in self.leased)
        for bucket in (self.requests_bucket, self.tokens_bucket):
            if bucket is not None:
                bucket.shift(now, seconds_)
        limit = self.limit
        if limit.shared is None or self.now() < self.down_until:
            return
        try:
            client = self._connect()
            key = f"asyncio_ops:rate:{limit.name}:pause"
            ms = int(seconds_ * 1000)
            if ms > 0:
                await client.eval(_PAUSE, 3, key, f"asyncio_ops:rate:{limit.name}:requests",
                                       f"asyncio_ops:rate:{limit.name}:tokens", ms)  # fmt: skip
        except Exception as exc:
            self._outage(exc)

    async def _sleep(self, delay: float) -> None:
        clock = self.limit.clock
        if clock is None:
            await asyncio.sleep(delay)
            return
        fut = self.loop.create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        clock.call_at(self.now() + delay, wake)
        await fut


_STATES: Final[dict[tuple[int, Hashable], _State]] = {}
