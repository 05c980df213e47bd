"""The bulk read of a PostgresLookup given ``table=``: the table's statistics and its keys.

Call order (``asyncio_ops.spark.lookup_join``, strategies ``"bulk"`` and
``"auto"``): on the driver :func:`table_statistics`, once, for the cost model;
in each Spark task of a bulk read :func:`table_keys` of one part, whose keys the
lookup then looks up as it looks up any key (its own query, its columnar path),
so that what the bulk read answers is what the lookup answers, key for key.

Semantics:

- ``table`` names the relation whose ``on`` column(s) hold every key the query
  can answer (a key that is not there has no answer). The server resolves it
  (``to_regclass``, on the search path); one it does not know is a
  :class:`~asyncio_ops.connectors.LookupQueryError` naming it.
- Statistics: rows are ``pg_class.reltuples``, the estimate ANALYZE and
  autovacuum keep; a table never analyzed (-1) is taken as its heap's bytes over
  :data:`BYTES_PER_ROW_UNANALYZED`. Bytes are ``pg_relation_size`` (the heap).
- Parts: a key belongs to part ``(hashtext(key::text) & 2147483647) % parts``
  (a composite key: the text of the row of its columns), so that each key is in
  exactly one part. Each part's query scans the table once, reading what is
  committed when it runs; NULL keys are left out (they match nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._base import TableStatistics
from .._exceptions import LookupQueryError
from ._columnar import _quote_ident as quote_ident

if TYPE_CHECKING:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]
    import pyarrow as pa

__all__ = ["BYTES_PER_ROW_UNANALYZED", "keys_sql", "table_keys", "table_statistics"]

BYTES_PER_ROW_UNANALYZED: Final = 100
"""The bytes of a row assumed for a table that was never analyzed (no reltuples)."""

_RESOLVE: Final = (
    "SELECT c.oid::regclass::text AS name, c.reltuples::float8 AS reltuples, "
    "pg_relation_size(c.oid) AS bytes FROM pg_class c WHERE c.oid = to_regclass($1)"
)


async def _resolve(connection: asyncpg.Connection, table: str, seconds: float) -> Any:
    row = await connection.fetchrow(_RESOLVE, table, timeout=seconds)
    if row is None:
        raise LookupQueryError(
            f"table={table!r} is not a table the database knows (on its search path); name "
            "the table whose `on` column(s) hold the keys the query answers"
        )
    return row


async def table_statistics(
    connection: asyncpg.Connection, table: str, seconds: float
) -> TableStatistics:
    """``table``'s rows and bytes as the server estimates them (see the module docstring);
    ``seconds``: the query's timeout."""
    row = await _resolve(connection, table, seconds)
    size = int(row["bytes"])
    if row["reltuples"] >= 0:
        return TableStatistics(row["name"], int(row["reltuples"]), size, "pg_class.reltuples")
    return TableStatistics(
        row["name"], size // BYTES_PER_ROW_UNANALYZED, size,
        f"never analyzed: pg_relation_size / {BYTES_PER_ROW_UNANALYZED}",
    )  # fmt: skip


def keys_sql(table: str, on: Sequence[str], parts: int) -> str:
    """The query of one part's distinct keys (``$1``: parts, ``$2``: the part, when
    ``parts`` > 1); ``table`` as the server quotes it (``regclass::text``)."""
    columns = [quote_ident(name) for name in on]
    where = " AND ".join(f"{c} IS NOT NULL" for c in columns)
    if parts > 1:
        text = f"{columns[0]}::text" if len(columns) == 1 else f"ROW({', '.join(columns)})::text"
        where += f" AND (hashtext({text}) & 2147483647) % $1 = $2"
    return f"SELECT DISTINCT {', '.join(columns)} FROM {table} WHERE {where}"


async def table_keys(
    connection: asyncpg.Connection,
    table: str,
    on: Sequence[str],
    part: int,
    parts: int,
    schema: pa.Schema,
    seconds: float,
) -> pa.Table:
    """Part ``part`` of ``parts`` of ``table``'s distinct non-NULL keys (its ``on``
    columns), as the columns of ``schema`` (the input's key columns, in ``on``'s order)."""
    import pyarrow as pa

    name = (await _resolve(connection, table, seconds))["name"]
    args = (parts, part) if parts > 1 else ()
    records = await connection.fetch(keys_sql(name, on, parts), *args, timeout=seconds)
    columns = {}
    for i, (field, column) in enumerate(zip(schema, on, strict=True)):
        values = [record[i] for record in records]
        try:
            columns[field.name] = pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise LookupQueryError(
                f"the column {column!r} of {name} holds values that do not fit the key "
                f"column {field.name!r} ({field.type}): {exc}"
            ) from exc
    return pa.table(columns, schema=schema)
