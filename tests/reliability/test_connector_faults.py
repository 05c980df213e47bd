"""Faults between a connector and its server: killed and restarted Postgres, stalled and
dropped connections, HTTP servers that hang up, answer garbage or storm with 429/5xx,
and a Spark job cancelled while lookups are in flight.

Real parts only: the real Postgres of the connector tests, a throwaway Postgres (never the
shared one) where the server itself is stopped, real HTTP servers on 127.0.0.1. The one
stand-in is :class:`FaultProxy`, a TCP proxy on 127.0.0.1 that forwards bytes until told
to stall them or to cut every connection -- faults a healthy server cannot produce on
demand (the approach of asyncpg's ``tests/test_adversity.py``).

What must hold (docs/guarantees.md): with a retry strategy using
``asyncio_ops.connectors.is_retryable`` every row completes exactly once within its timeout budget;
when the fault outlasts the budget the job fails with an error that names the cause
(the connector error class and the redacted server address); nothing hangs -- every
test is bounded in wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest
import pytest_asyncio
from aiohttp import web
from asyncio_ops.connectors import (
    ConnectorError,
    LookupConnectionError,
    LookupResponseError,
    LookupTimeout,
    is_retryable,
)
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup

from asyncio_ops import (
    AsyncOperatorError,
    AsyncRetryStrategy,
    AsyncTimeoutError,
    OutputMode,
    Record,
    run_async_wait,
)
from tests.connectors.support import CountingLookup, PgTables, run_isolated

from .conftest import RestartablePostgres

# -- helpers ----------------------------------------------------------------------------------


def values(out: Sequence[Any]) -> list[Any]:
    return [e.value for e in out if isinstance(e, Record)]


def retry_connector_errors(max_attempts: int = 50) -> AsyncRetryStrategy:
    """Exponential backoff 20 ms .. 500 ms on exactly the transient connector errors."""
    return AsyncRetryStrategy.exponential_backoff(
        max_attempts, 20, 500, 2.0, exception_predicate=is_retryable
    )


async def admin_fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        rows: list[asyncpg.Record] = await connection.fetch(sql, *args, timeout=10)
        return rows
    finally:
        await connection.close(timeout=5)


async def terminate(dsn: str, app_name: str) -> int:
    """pg_terminate_backend on every connection carrying ``app_name`` (from another one)."""
    rows = await admin_fetch(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = $1 AND pid <> pg_backend_pid()",
        app_name,
    )
    return sum(1 for r in rows if r[0])


def unique_app() -> str:
    return f"aops_rel_{uuid.uuid4().hex[:10]}"


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target``, with faults switched on at will.

    ``stall()``: bytes already in flight stay where they are, nothing more is forwarded in
    either direction, and sockets stay open -- a server or network that stopped answering.
    ``cut()``: every open connection is reset (RST), and new ones are reset while
    ``refusing``; ``resume()`` forwards again.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.refusing = False
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.flowing.set()
        for writer in list(self._writers):
            _reset(writer)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stall(self) -> None:
        self.flowing.clear()

    def cut(self, *, refuse: bool = False) -> None:
        self.refusing = refuse
        for writer in list(self._writers):
            _reset(writer)

    def resume(self) -> None:
        self.refusing = False
        self.flowing.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refusing:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self.flowing.wait()
                writer.write(data)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN, as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def within(seconds: float, coro: Awaitable[Any]) -> tuple[Any, float]:
    """Await ``coro`` (failing the test past ``seconds``); its result and the elapsed time."""
    started = time.monotonic()
    result = await asyncio.wait_for(coro, seconds)
    return result, time.monotonic() - started


# -- Postgres: connections killed mid-run ---------------------------------------------------


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_backends_killed_repeatedly_every_row_exactly_once(pg_tables: PgTables) -> None:
    """pg_terminate_backend on all of the pool's connections, six times during the run."""
    app = unique_app()
    lookup = CountingLookup(
        pg_tables.dsn,
        f"SELECT id, name FROM {pg_tables.customers} CROSS JOIN pg_sleep(0.05) WHERE id = ANY($1)",
        key="customer_id",
        on="id",
        columns=("name",),
        batch_size=20,
        pool_size=4,
        server_settings={"application_name": app},
    )
    rows = [{"customer_id": 1 + i % 200, "n": i} for i in range(600)]
    killed: list[int] = []

    async def killer() -> None:
        for _ in range(6):
            await asyncio.sleep(0.15)
            killed.append(await terminate(pg_tables.dsn, app))

    budget = 30.0
    kill_task = asyncio.create_task(killer())
    out, elapsed = await within(
        budget + 5,
        run_async_wait(lookup, rows, timeout=budget, capacity=60, retry=retry_connector_errors()),
    )
    await kill_task
    assert sum(killed) >= 3, killed  # the faults really happened mid-run
    assert lookup.statistics().batching.failed_batches >= 1
    # Exactly once, in input order: one output per input row, none lost, none doubled.
    assert [v["name"] for v in values(out)] == [f"customer-{r['customer_id']}" for r in rows]
    assert elapsed < budget
    assert not await admin_fetch(
        pg_tables.dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name = $1", app
    ), "the pool was closed with the operator"


# -- Postgres: the server restarted, or gone for longer than the budget -----------------------


async def _seed(dsn: str) -> None:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        await connection.execute(
            "CREATE TABLE customers AS SELECT i AS id, 'customer-' || i AS name "
            "FROM generate_series(1, 500) AS i; ALTER TABLE customers ADD PRIMARY KEY (id)"
        )
    finally:
        await connection.close(timeout=5)


def _throwaway_lookup(dsn: str, **options: Any) -> CountingLookup:
    options.setdefault("connect_timeout", 2.0)
    options.setdefault("query_timeout", 5.0)
    return CountingLookup(
        dsn,
        "SELECT id, name FROM customers CROSS JOIN pg_sleep(0.02) WHERE id = ANY($1)",
        key="id",
        columns=("name",),
        batch_size=25,
        pool_size=4,
        **options,
    )


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_restarted_mid_run_recovers_through_retry(
    throwaway_pg: RestartablePostgres,
) -> None:
    """The server crashes (immediate stop) mid-run and is back 1.5 s later: no row lost."""
    await _seed(throwaway_pg.dsn)
    lookup = _throwaway_lookup(throwaway_pg.dsn)
    rows = [{"id": 1 + i % 500} for i in range(800)]
    down_for = 1.5

    async def crash_and_restart() -> None:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(throwaway_pg.kill)
        await asyncio.sleep(down_for)
        await asyncio.to_thread(throwaway_pg.revive)

    async def slow_rows() -> AsyncIterator[dict[str, int]]:
        for row in rows:  # spread over ~3 s, so that rows arrive before, during and after
            yield row
            await asyncio.sleep(0.004)

    budget = 30.0
    outage = asyncio.create_task(crash_and_restart())
    out, elapsed = await within(
        budget + 5,
        run_async_wait(
            lookup, slow_rows(), timeout=budget, capacity=100, retry=retry_connector_errors(100)
        ),
    )
    await outage
    assert [v["name"] for v in values(out)] == [f"customer-{r['id']}" for r in rows]
    assert lookup.statistics().batching.failed_batches >= 1, "the crash hit batches in flight"
    assert down_for < elapsed < budget


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_outage_beyond_the_attempts_fails_naming_the_cause(
    throwaway_pg: RestartablePostgres,
) -> None:
    """Retries run out while the server is down: the error names the class and the host."""
    await _seed(throwaway_pg.dsn)
    lookup = _throwaway_lookup(throwaway_pg.dsn, min_pool_size=0)
    async with lookup:
        assert await lookup.async_invoke({"id": 1}) == [{"name": "customer-1"}]
    throwaway_pg.kill()
    retry = AsyncRetryStrategy.fixed_delay(3, 100, exception_predicate=is_retryable)
    with pytest.raises(AsyncOperatorError) as caught:
        await within(20, run_async_wait(lookup, [{"id": 7}], timeout=15.0, retry=retry))
    error = caught.value
    assert isinstance(error.__cause__, LookupConnectionError)
    message = str(error)
    assert "LookupConnectionError" in message
    assert f"127.0.0.1:{throwaway_pg.port}" in message
    assert "{'id': 7}" in message  # the input is named
    assert "after 4 operator attempt(s)" in message


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_outage_beyond_the_timeout_budget_fails_in_time(
    throwaway_pg: RestartablePostgres,
) -> None:
    """Retries would go on, but the element's budget (2 s) runs out: a timeout error, on time,
    naming the input; the last connector error is its cause."""
    await _seed(throwaway_pg.dsn)
    lookup = _throwaway_lookup(throwaway_pg.dsn, min_pool_size=0)
    throwaway_pg.kill()
    budget = 2.0
    started = time.monotonic()
    with pytest.raises(AsyncTimeoutError) as caught:
        await within(
            budget + 10,
            run_async_wait(lookup, [{"id": 7}], timeout=budget, retry=retry_connector_errors(1000)),
        )
    elapsed = time.monotonic() - started
    assert budget <= elapsed < budget + 8  # the budget, then a give-up (margin: loaded CPUs)
    assert "{'id': 7}" in str(caught.value)


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_outage_beyond_the_timeout_budget_names_the_last_error(
    throwaway_pg: RestartablePostgres,
) -> None:
    lookup = _throwaway_lookup(throwaway_pg.dsn, min_pool_size=0)
    throwaway_pg.kill()
    with pytest.raises(AsyncTimeoutError) as caught:
        await within(
            15, run_async_wait(lookup, [{"id": 7}], timeout=1.0, retry=retry_connector_errors(1000))
        )
    assert isinstance(caught.value.__cause__, LookupConnectionError), repr(caught.value.__cause__)
    assert f"127.0.0.1:{throwaway_pg.port}" in str(caught.value)


# -- Postgres: a connection that stalls or is cut (fault-injecting proxy) -----------------------


def _host_port(dsn: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(dsn)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def _via(dsn: str, port: int) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@pytest_asyncio.fixture
async def pg_proxy(pg_tables: PgTables) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(*_host_port(pg_tables.dsn)) as proxy:
        yield proxy


def _proxied_lookup(t: PgTables, proxy: FaultProxy, **options: Any) -> CountingLookup:
    options.setdefault("server_settings", {"application_name": unique_app()})
    return CountingLookup(
        _via(t.dsn, proxy.port),
        f"SELECT id, name FROM {t.customers} WHERE id = ANY($1)",
        key="customer_id",
        on="id",
        columns=("name",),
        pool_size=2,
        **options,
    )


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_stalled_connection_times_out_with_the_operator_budget(
    pg_tables: PgTables, pg_proxy: FaultProxy
) -> None:
    """The network stops answering mid-run: the element fails with AsyncTimeoutError at its
    budget, and the whole run (open, lookups, close) returns soon after -- no hang.

    Closing cancels the batch stuck on the stalled connection; asyncpg's cancellation and
    the pool's reset are bounded by ``query_timeout`` (asyncpg's ``command_timeout``), after
    which the connection is terminated. (Before that bound existed, close() hung forever.)
    """
    query_timeout = 2.0
    lookup = _proxied_lookup(pg_tables, pg_proxy, connect_timeout=1.0, query_timeout=query_timeout)
    budget = 1.0

    async def rows() -> AsyncIterator[dict[str, int]]:
        for i in range(1, 41):
            if i == 21:
                pg_proxy.stall()
            yield {"customer_id": i}
            await asyncio.sleep(0.005)

    started = time.monotonic()
    with pytest.raises(AsyncTimeoutError):
        await within(budget + 15, run_async_wait(lookup, rows(), timeout=budget, capacity=10))
    elapsed = time.monotonic() - started
    assert elapsed < budget + query_timeout + 8, f"took {elapsed:.1f} s to give up"
    assert len(lookup.sent) >= 2


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_stalled_query_is_a_lookup_timeout_at_query_timeout(
    pg_tables: PgTables, pg_proxy: FaultProxy
) -> None:
    """With ``query_timeout`` below the element's budget, the connector's own timeout fires:
    LookupTimeout (retryable, a TimeoutError) naming the redacted server, in time."""
    lookup = _proxied_lookup(pg_tables, pg_proxy, query_timeout=0.5, connect_timeout=1.0)
    async with lookup:
        assert await lookup.async_invoke({"customer_id": 3}) == [{"name": "customer-3"}]
        pg_proxy.stall()
        started = time.monotonic()
        with pytest.raises(LookupTimeout) as caught:
            await within(10, lookup.async_invoke({"customer_id": 4}))
        assert time.monotonic() - started < 8  # query_timeout 0.5 s, not the 10 s stall
    assert is_retryable(caught.value)
    assert isinstance(caught.value, TimeoutError)
    assert f"127.0.0.1:{pg_proxy.port}" in str(caught.value)


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_connections_cut_and_refused_for_a_while_recover_through_retry(
    pg_tables: PgTables, pg_proxy: FaultProxy
) -> None:
    """Every connection reset and new ones refused for 0.7 s, twice: every row exactly once."""
    lookup = _proxied_lookup(pg_tables, pg_proxy, connect_timeout=1.0, query_timeout=2.0)
    rows = [{"customer_id": 1 + i % 200} for i in range(400)]

    async def outages() -> None:
        for _ in range(2):
            await asyncio.sleep(0.2)
            pg_proxy.cut(refuse=True)
            await asyncio.sleep(0.7)
            pg_proxy.resume()

    async def slow_rows() -> AsyncIterator[dict[str, int]]:
        for row in rows:
            yield row
            await asyncio.sleep(0.004)

    budget = 20.0
    faults = asyncio.create_task(outages())
    out, elapsed = await within(
        budget + 5,
        run_async_wait(
            lookup, slow_rows(), timeout=budget, capacity=50, retry=retry_connector_errors()
        ),
    )
    await faults
    assert [v["name"] for v in values(out)] == [f"customer-{r['customer_id']}" for r in rows]
    assert lookup.statistics().batching.failed_batches >= 1
    assert pg_proxy.accepted > 2  # connections were re-established
    assert elapsed < budget


# -- HTTP: servers that hang up, answer garbage, or storm ----------------------------------------

SECRET = "tok-REL-6b0d4e1f"


@dataclass
class Storm:
    """What the HTTP test server does; ``hits`` per customer id, with monotonic times."""

    hits: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)
    close_every: int = 0  # hang up on every n-th request
    status_until: float = 0.0  # answer ``status`` until this monotonic time
    status: int = 429
    retry_after: str | None = None
    requests: int = 0


async def _storm_app(storm: Storm) -> web.Application:
    async def customer(request: web.Request) -> web.StreamResponse:
        storm.requests += 1
        cid = request.match_info["id"]
        storm.hits.setdefault(cid, []).append(time.monotonic())
        if storm.close_every and storm.requests % storm.close_every == 0:
            # Hang up without an answer, as a crashing or overloaded server does.
            assert request.transport is not None
            request.transport.abort()
            storm.statuses[0] += 1
            return web.Response()
        if time.monotonic() < storm.status_until:
            headers = {"Retry-After": storm.retry_after} if storm.retry_after else {}
            storm.statuses[storm.status] += 1
            return web.json_response({"error": "busy"}, status=storm.status, headers=headers)
        storm.statuses[200] += 1
        return web.json_response({"id": int(cid), "name": f"customer-{cid}"})

    app = web.Application()
    app.router.add_get("/customers/{id}", customer)
    return app


@pytest_asyncio.fixture
async def storm_server() -> AsyncIterator[tuple[Storm, str]]:
    storm = Storm()
    runner = web.AppRunner(await _storm_app(storm), shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield storm, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _http(base: str, **options: Any) -> HttpLookup:
    return HttpLookup(
        base + "/customers/{customer_id}",
        params={"api_key": SECRET},
        headers={"Authorization": f"Bearer {SECRET}"},
        **options,
    )


def _assert_names_url_without_secret(error: BaseException, port: int | str) -> None:
    text = str(error)
    assert f"127.0.0.1:{port}/customers/" in text, text
    assert SECRET not in text and SECRET not in repr(error), text


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_server_hanging_up_on_every_third_request_every_row_once(
    storm_server: tuple[Storm, str],
) -> None:
    storm, base = storm_server
    storm.close_every = 3
    lookup = _http(base, max_retries=5, backoff=0.01, timeout=2.0)
    rows = [{"customer_id": i} for i in range(1, 301)]
    budget = 20.0
    out, elapsed = await within(
        budget + 5,
        run_async_wait(lookup, rows, timeout=budget, capacity=50, retry=retry_connector_errors()),
    )
    assert [v["name"] for v in values(out)] == [f"customer-{i}" for i in range(1, 301)]
    assert storm.statuses[0] >= 90  # a third of the requests were hung up on
    assert elapsed < budget


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_server_always_hanging_up_fails_naming_the_url(
    storm_server: tuple[Storm, str],
) -> None:
    storm, base = storm_server
    storm.close_every = 1
    lookup = _http(base, max_retries=2, backoff=0.01, timeout=2.0)
    retry = AsyncRetryStrategy.fixed_delay(2, 10, exception_predicate=is_retryable)
    with pytest.raises(AsyncOperatorError) as caught:
        await within(15, run_async_wait(lookup, [{"customer_id": 5}], timeout=10.0, retry=retry))
    cause = caught.value.__cause__
    assert isinstance(cause, LookupConnectionError), repr(cause)
    port = base.rsplit(":", 1)[1]
    _assert_names_url_without_secret(cause, port)
    _assert_names_url_without_secret(caught.value, port)
    # 3 operator attempts x (1 + 2 connector retries); aiohttp itself resends a request
    # once when a reused keep-alive connection turns out closed, hence at most twice that.
    assert 9 <= len(storm.hits["5"]) <= 18


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_429_storm_with_retry_after_every_row_once(
    storm_server: tuple[Storm, str],
) -> None:
    """For 1 s every request gets 429 Retry-After: 0.3; rows wait as told, then complete,
    and the process's pace keeps most of them out of the storm."""
    storm, base = storm_server
    storm.status, storm.retry_after = 429, "0.3"
    storm.status_until = time.monotonic() + 1.0
    lookup = _http(base, max_retries=10, timeout=2.0)
    rows = [{"customer_id": i} for i in range(1, 201)]
    budget = 15.0
    out, elapsed = await within(
        budget + 5,
        run_async_wait(lookup, rows, timeout=budget, capacity=100, retry=retry_connector_errors()),
    )
    assert [v["name"] for v in values(out)] == [f"customer-{i}" for i in range(1, 201)]
    assert 1 <= storm.statuses[429] < 200  # slowed down: not every row sent into the storm
    assert elapsed < budget
    # Retry-After was honoured: no key was asked again sooner than 0.3 s after a 429.
    for times in storm.hits.values():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= 0.29 for g in gaps), gaps


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_5xx_storm_recovers_through_backoff_and_operator_retry(
    storm_server: tuple[Storm, str],
) -> None:
    """503 without Retry-After for 1.2 s: "slow down", which the connector sends again
    itself, whatever its max_retries (2); every row once."""
    storm, base = storm_server
    storm.status, storm.retry_after = 503, None
    storm.status_until = time.monotonic() + 1.2
    lookup = _http(base, max_retries=2, backoff=0.05, max_backoff=0.2, timeout=2.0)
    rows = [{"customer_id": i} for i in range(1, 101)]
    budget = 15.0
    out, elapsed = await within(
        budget + 5,
        run_async_wait(
            lookup,
            rows,
            timeout=budget,
            capacity=100,
            mode=OutputMode.UNORDERED,
            retry=retry_connector_errors(),
        ),
    )
    assert sorted(v["name"] for v in values(out)) == sorted(f"customer-{i}" for i in range(1, 101))
    assert storm.statuses[503] >= 1
    assert elapsed < budget


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_permanent_503_fails_with_status_and_url_without_secret(
    storm_server: tuple[Storm, str],
) -> None:
    storm, base = storm_server
    storm.status, storm.retry_after = 503, "0.05"
    storm.status_until = time.monotonic() + 3600
    lookup = _http(base, max_retries=2, timeout=2.0)
    retry = AsyncRetryStrategy.fixed_delay(2, 10, exception_predicate=is_retryable)
    # a 503 is "slow down": sent again until the operator's timeout, whose error is the
    # service's last answer for the row
    with pytest.raises(AsyncOperatorError) as caught:
        await within(15, run_async_wait(lookup, [{"customer_id": 9}], timeout=3.0, retry=retry))
    cause = caught.value.__cause__
    assert isinstance(cause, LookupResponseError)
    assert cause.status == 503 and cause.retry_after == pytest.approx(0.05)
    _assert_names_url_without_secret(cause, base.rsplit(":", 1)[1])
    assert "503" in str(caught.value)


@dataclass
class RawServer:
    """An asyncio TCP server on 127.0.0.1 answering every connection with ``reply``
    (then closing), or never answering when ``reply`` is None."""

    reply: bytes | None
    port: int = 0
    connections: int = 0


@pytest_asyncio.fixture
async def raw_server() -> AsyncIterator[Callable[[bytes | None], Awaitable[RawServer]]]:
    servers: list[asyncio.Server] = []
    held: list[asyncio.StreamWriter] = []

    async def start(reply: bytes | None) -> RawServer:
        state = RawServer(reply)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
                if state.reply is None:
                    held.append(writer)  # keep it open, say nothing
                    return
                writer.write(state.reply)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    yield start
    for writer in held:
        writer.transport.abort()
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(b"\x00\x17garbage that is not HTTP\r\n\r\n", ConnectorError, id="not-http"),
        pytest.param(
            b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"id": 1',
            LookupConnectionError,
            id="truncated-body",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b'Content-Length: 9\r\n\r\n{"id": 1,',
            ConnectorError,
            id="broken-json",
        ),
    ],
)
async def test_http_garbage_answers_are_connector_errors_naming_the_url(
    raw_server: Callable[[bytes | None], Awaitable[RawServer]],
    reply: bytes,
    expected: type[ConnectorError],
) -> None:
    server = await raw_server(reply)
    lookup = _http(f"http://127.0.0.1:{server.port}", max_retries=1, backoff=0.01, timeout=2.0)
    async with lookup:
        with pytest.raises(ConnectorError) as caught:
            await within(10, lookup.async_invoke({"customer_id": 1}))
    assert isinstance(caught.value, expected), repr(caught.value)
    _assert_names_url_without_secret(caught.value, server.port)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_server_that_never_answers_is_a_lookup_timeout(
    raw_server: Callable[[bytes | None], Awaitable[RawServer]],
) -> None:
    server = await raw_server(None)
    lookup = _http(f"http://127.0.0.1:{server.port}", max_retries=1, backoff=0.01, timeout=0.5)
    started = time.monotonic()
    async with lookup:
        with pytest.raises(LookupTimeout) as caught:
            await within(10, lookup.async_invoke({"customer_id": 1}))
    assert time.monotonic() - started < 8  # 2 attempts x 0.5 s and the backoff, not 10 s
    assert server.connections == 2
    _assert_names_url_without_secret(caught.value, server.port)


# -- Spark: a job cancelled while lookups are in flight --------------------------------------------


def _pg_sessions(dsn: str, app: str) -> list[tuple[int, str]]:
    rows = run_isolated(
        admin_fetch(dsn, "SELECT pid, state FROM pg_stat_activity WHERE application_name = $1", app)
    )
    return [(r["pid"], r["state"]) for r in rows]


def _wait_for(predicate: Callable[[], bool], seconds: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.timeout(90)
def test_spark_job_cancelled_mid_lookup_leaves_no_task_connection_or_thread(
    spark: Any, pg_tables: PgTables
) -> None:
    """cancelJobGroup while every partition waits on a 10 s query.

    What actually happens (Spark 3.5/4.x, ``spark.python.worker.reuse`` on): the JVM
    interrupts the tasks at once; the Python workers do not notice and keep going until
    Spark's monitor kills them (SIGKILL, ``spark.python.task.killTimeout``, 2 s). The pool
    dies with the process: no close handshake, no ``atexit``. PostgreSQL notices a vanished
    client only when it next talks to it -- after the running query -- unless
    ``client_connection_check_interval`` (PostgreSQL >= 14) is set, as here through
    ``server_settings``: then the backends end within that interval.
    """
    from asyncio_ops.spark import ordered_wait

    app = unique_app()
    lookup = PostgresLookup(
        pg_tables.dsn,
        f"SELECT id, name FROM {pg_tables.customers} CROSS JOIN pg_sleep(10) WHERE id = ANY($1)",
        key="customer_id",
        on="id",
        columns=("name",),
        server_settings={"application_name": app, "client_connection_check_interval": "200"},
    )
    df = spark.range(0, 2000, numPartitions=2).selectExpr("id % 200 + 1 AS customer_id")
    out = ordered_wait(df, lookup, timeout=60.0, output_schema="name string", capacity=50)
    sc = spark.sparkContext
    threads_before = {t.ident for t in threading.enumerate()}
    group = f"cancel-{app}"
    failure: list[BaseException] = []

    def collect() -> None:
        sc.setJobGroup(group, "cancelled by a reliability test", interruptOnCancel=True)
        try:
            out.collect()
        except Exception as exc:
            failure.append(exc)

    runner = threading.Thread(target=collect, name="collect-to-cancel")
    runner.start()
    try:
        assert _wait_for(
            lambda: any(s == "active" for _, s in _pg_sessions(pg_tables.dsn, app)), 30
        ), "the lookups never reached the server"
        started = time.monotonic()
        sc.cancelJobGroup(group)
        runner.join(30)
        assert not runner.is_alive(), "collect() did not return after the cancel"
    finally:
        if runner.is_alive():
            sc.cancelJobGroup(group)
            runner.join(30)
    assert failure and "cancel" in str(failure[0]).lower(), failure

    tracker = sc.statusTracker()
    assert _wait_for(
        lambda: (
            not tracker.getJobIdsForGroup(group)
            or all(
                (info := tracker.getJobInfo(j)) is None or info.status != "RUNNING"
                for j in tracker.getJobIdsForGroup(group)
            )
        ),
        10,
    )
    assert _wait_for(lambda: not tracker.getActiveStageIds(), 10), tracker.getActiveStageIds()
    # Connections of the cancelled tasks: gone within a few seconds (kill timeout + check
    # interval), long before the 10 s queries would have ended on their own.
    assert _wait_for(lambda: not _pg_sessions(pg_tables.dsn, app), 8), _pg_sessions(
        pg_tables.dsn, app
    )
    assert time.monotonic() - started < 9.5
    leaked = [
        t.name for t in threading.enumerate() if t.ident not in threads_before and t.is_alive()
    ]
    assert not leaked, leaked
