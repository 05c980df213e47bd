"""Helpers shared by the connector tests (types, loop runner, retry driver, a counting lookup)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from asyncio_ops.connectors.postgres import PostgresLookup

from asyncio_ops import AsyncRetryStrategy

T = TypeVar("T")


class CountingLookup(PostgresLookup):
    """A PostgresLookup that records every lookup query it sends: ``sent``, the
    number of keys in each; ``sql``, its SQL (the query or its columnar form)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[int] = []
        self.sql: list[str] = []

    async def _send(self, connection: Any, sql: str, args: Sequence[Sequence[Any]]) -> Any:
        self.sent.append(len(args[0]))
        self.sql.append(sql)
        return await super()._send(connection, sql, args)


@dataclass(frozen=True)
class PgTables:
    """Names of this session's tables (unique per session, dropped at the end)."""

    dsn: str
    suffix: str
    customers: str
    addresses: str
    regional: str
    app_name: str


def run_isolated(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a private loop, leaving the thread's current loop alone.

    (``asyncio.run`` would reset it, under pytest-asyncio's feet.)
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def pg_execute(dsn: str, *statements: str, timeout: float = 60) -> None:
    """Run SQL statements on one fresh connection (setup and teardown of tests)."""
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    async def go() -> None:
        connection = await asyncpg.connect(dsn, timeout=10)
        try:
            for statement in statements:
                await connection.execute(statement, timeout=timeout)
        finally:
            await connection.close(timeout=5)

    run_isolated(go())


async def with_retry(
    attempt: Callable[[], Awaitable[Sequence[T]]],
    strategy: AsyncRetryStrategy,
    failures: list[BaseException] | None = None,
) -> Sequence[T]:
    """Drive ``attempt`` the way the operator applies a retry strategy to one element.

    Records each failure that was retried in ``failures``.
    """
    attempts = 0
    while True:
        attempts += 1
        try:
            return await attempt()
        except Exception as exc:
            if not (strategy.should_retry_exception(exc) and strategy.can_retry(attempts)):
                raise
            if failures is not None:
                failures.append(exc)
            await asyncio.sleep(strategy.backoff_seconds(attempts))


def per_row_pairs(
    lookup: PostgresLookup, rows: list[dict[str, Any]]
) -> list[tuple[int, dict[str, Any]]]:
    """What the per-row path answers, as (input row index, output dict) pairs."""

    async def go() -> list[tuple[int, dict[str, Any]]]:
        async with lookup:
            out = []
            for i, row in enumerate(rows):
                out.extend((i, dict(r)) for r in await lookup.async_invoke(row))
            return out

    return run_isolated(go())


def columnar_pairs(
    lookup: PostgresLookup, batch: pa.RecordBatch
) -> list[tuple[int, dict[str, Any]]]:
    """What the columnar path (``async_invoke_arrow``) answers, as the same pairs."""

    async def go() -> Any:
        async with lookup:
            return await lookup.async_invoke_arrow(batch)

    index, columns = run_isolated(go())
    names = list(columns)
    values = {n: pa.array(columns[n]).to_pylist() for n in names}
    positions = list(range(batch.num_rows)) if index is None else pa.array(index).to_pylist()
    return [(i, {n: values[n][k] for n in names}) for k, i in enumerate(positions)]
