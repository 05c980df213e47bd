"""Fixtures for connector tests: a real PostgreSQL and a real local aiohttp server.

Postgres comes from ``ASYNCIO_OPS_PG_DSN`` (default: trust auth on
127.0.0.1:5432, database ``test``). When it cannot be reached the Postgres
tests are skipped with the reason, except under ``CI=true``, where they fail:
CI must never pass by not testing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest

from tests.helpers import unavailable

from .support import PgTables, run_isolated

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def _probe(dsn: str) -> None:
    connection = await asyncpg.connect(dsn, timeout=5)
    await connection.close(timeout=5)


async def _setup(t: PgTables) -> None:
    connection = await asyncpg.connect(t.dsn, timeout=10)
    try:
        await connection.execute(
            f"""
            CREATE TABLE {t.customers} (id int PRIMARY KEY, name text NOT NULL, tier text);
            INSERT INTO {t.customers}
              SELECT i, 'customer-' || i, CASE WHEN i % 3 = 0 THEN 'gold' ELSE 'basic' END
              FROM generate_series(1, 200) AS i;
            CREATE TABLE {t.addresses} (customer_id int NOT NULL, seq int NOT NULL, city text,
                                        PRIMARY KEY (customer_id, seq));
            INSERT INTO {t.addresses}
              SELECT c, s, 'city-' || c || '-' || s
              FROM generate_series(1, 20) AS c, generate_series(1, 3) AS s WHERE s <= c % 4;
            CREATE TABLE {t.regional} (region text NOT NULL, id int NOT NULL, name text,
                                       PRIMARY KEY (region, id));
            INSERT INTO {t.regional} VALUES
              ('eu', 1, 'eu-one'), ('eu', 2, 'eu-two'), ('us', 1, 'us-one'), ('us', 3, 'us-three');
            """,
            timeout=30,
        )
    finally:
        await connection.close(timeout=5)


async def _teardown(t: PgTables) -> None:
    connection = await asyncpg.connect(t.dsn, timeout=10)
    try:
        await connection.execute(
            f"DROP TABLE IF EXISTS {t.customers}, {t.addresses}, {t.regional}", timeout=30
        )
    finally:
        await connection.close(timeout=5)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """A reachable DSN, or skip (fail under CI=true)."""
    dsn = os.environ.get("ASYNCIO_OPS_PG_DSN", DEFAULT_DSN)
    try:
        run_isolated(_probe(dsn))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        reason = (
            f"PostgreSQL not reachable ({type(exc).__name__}); set ASYNCIO_OPS_PG_DSN or start "
            "one (docker compose up -d)"
        )
        unavailable(reason)
    return dsn


@pytest.fixture(scope="session")
def pg_tables(pg_dsn: str) -> Iterator[PgTables]:
    """Tables created once per session under unique names, dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    tables = PgTables(
        dsn=pg_dsn,
        suffix=suffix,
        customers=f"aops_customers_{suffix}",
        addresses=f"aops_addresses_{suffix}",
        regional=f"aops_regional_{suffix}",
        # Connections of these tests carry this name, so a test can terminate
        # exactly its own backends and nobody else's.
        app_name=f"aops_test_{suffix}",
    )
    run_isolated(_setup(tables))
    try:
        yield tables
    finally:
        run_isolated(_teardown(tables))


REDIS_URL = os.environ.get("ASYNCIO_OPS_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A reachable Redis (``ASYNCIO_OPS_REDIS_URL``), or skip (fail under CI=true)."""
    import asyncio

    async def probe() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
        try:
            await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(probe())
    except Exception as exc:
        unavailable(f"Redis not reachable at {REDIS_URL} ({type(exc).__name__}); set "
                    "ASYNCIO_OPS_REDIS_URL or start one (docker compose up -d)")  # fmt: skip
    return REDIS_URL


@pytest.fixture
def name(redis_url: str) -> Iterator[str]:
    """A shared limit's or cache's name of this test's own; its Redis keys (rate limits'
    and caches') deleted after."""
    import asyncio
    import uuid

    unique = f"test-{uuid.uuid4().hex[:8]}"
    yield unique

    async def clean() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        try:
            for kind in ("rate", "cache"):
                keys = [k async for k in client.scan_iter(f"asyncio_ops:{kind}:{unique}:*")]
                if keys:
                    await client.delete(*keys)
        finally:
            await client.aclose()

    asyncio.run(clean())


class OwnRedis:
    """A Redis server of a test's own (``redis-server`` on a free port of 127.0.0.1,
    nothing on disk, as the machine's): ``flush()`` empties it, ``restart()`` stops it
    and starts it again on the same port, empty (a restart without persistence)."""

    def __init__(self, binary: str) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.binary = binary
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Any = None
        self.start()

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server never answered"
                time.sleep(0.05)
        client.close()

    def flush(self) -> None:
        import redis

        with redis.Redis(port=self.port) as client:
            client.flushall()

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A Redis of this test's own, which it may flush and restart (needs ``redis-server``:
    skipped without it, failed under CI=true)."""
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server not on PATH (apt-get install redis-server)")
    server = OwnRedis(binary)
    try:
        yield server
    finally:
        server.stop()
