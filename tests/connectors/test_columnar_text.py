"""Text columns of the columnar path travel as bytes (``connectors/postgres/_columnar.py``).

The answers must equal the per-row path's for every shape a text value takes:
multi-byte UTF-8, empty, NULL, a query whose text column is NULL in every row,
varchar, and bpchar (which stays an array: casting it to text drops its padding).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pyarrow as pa
import pytest
from asyncio_ops.connectors import LookupQueryError
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.postgres._columnar import Columnar, aggregate_sql, decode

from tests.helpers import unavailable

from .support import (
    CountingLookup,
    PgTables,
    columnar_pairs,
    per_row_pairs,
    pg_execute,
    run_isolated,
)

pytestmark = pytest.mark.postgres

# Keys 2 and 3 have NULL in column s: a query for exactly those two keys gets
# string_agg(s) = NULL while the lengths say two NULLs.
VALUES = """
SELECT k, s, v, c, n FROM (VALUES
  (1, 'grüße ✓ 🙂'::text, 'x'::varchar(8), 'ab'::char(4), 7),
  (2, NULL, NULL, NULL, NULL),
  (3, NULL, '', 'z', 9),
  (4, '', 'ünï', 'q', NULL),
  (5, 'plain', 'yy', NULL, 11)
) AS t(k, s, v, c, n)
WHERE k = ANY($1)
"""


def test_aggregate_sql_sends_text_columns_as_bytes_and_lengths() -> None:
    sql = aggregate_sql("SELECT id, name FROM t WHERE id = ANY($1)", ["id", "name"],
                        frozenset({"name"}))  # fmt: skip
    assert sql == (
        "SELECT array_agg(q.\"id\"), string_agg(convert_to(q.\"name\", 'UTF8'), ''::bytea), "
        "string_agg(int4send(coalesce(octet_length(q.\"name\"), -1)), '')\n"
        "FROM (\nSELECT id, name FROM t WHERE id = ANY($1)\n) AS q"
    )


def test_text_columns_equal_the_per_row_path(pg_tables: PgTables) -> None:
    keys = [2, 3, 1, None, 4, 2, 9, 5, 1]  # distinct in order: 2, 3, 1, 4, 9, 5
    batch = pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.int64())})
    lookup = CountingLookup(pg_tables.dsn, VALUES, key="key", on="k", batch_size=2)
    got = columnar_pairs(lookup, batch)
    expected = per_row_pairs(
        PostgresLookup(pg_tables.dsn, VALUES, key="key", on="k"), batch.to_pylist()
    )
    assert got == expected
    assert [i for i, _ in got] == [0, 1, 2, 4, 5, 7, 8]  # 9 has no row, None no key
    assert got[2][1] == {"k": 1, "s": "grüße ✓ 🙂", "v": "x", "c": "ab  ", "n": 7}
    sql = lookup.sql[0]
    assert "string_agg(convert_to(q.\"s\", 'UTF8'), ''::bytea)" in sql
    assert "string_agg(convert_to(q.\"v\", 'UTF8'), ''::bytea)" in sql
    assert 'array_agg(q."c")' in sql and 'array_agg(q."k")' in sql  # bpchar and int
    assert lookup.sent == [2, 2, 2]  # three queries, each with its piece of every column


def test_a_text_key_is_matched_from_the_bytes(pg_tables: PgTables) -> None:
    query = """SELECT code, label FROM (VALUES ('ä', 'a-umlaut'), ('a', 'plain a'), ('', 'empty'))
               AS t(code, label) WHERE code = ANY($1)"""
    batch = pa.RecordBatch.from_pydict({"code": ["a", "zz", None, "ä", "", "a"]})
    lookup = CountingLookup(pg_tables.dsn, query, key="code", columns=("label",))
    got = columnar_pairs(lookup, batch)
    assert got == per_row_pairs(
        PostgresLookup(pg_tables.dsn, query, key="code", columns=("label",)), batch.to_pylist()
    )
    assert [r["label"] for _, r in got] == ["plain a", "a-umlaut", "empty", "plain a"]
    assert lookup.sql[0].startswith("SELECT string_agg(convert_to(q.\"code\", 'UTF8'), ''::bytea)")


def test_decode_reads_nulls_empties_and_pieces() -> None:
    columnar = Columnar("", ("id", "s"), frozenset({"s"}))

    def lengths(*n: int) -> bytes:
        return struct.pack(f">{len(n)}i", *n)

    rows = [
        ([1, 2, 3], "añb".encode(), lengths(3, -1, 1)),  # "añ" is 3 bytes, then "b"
        (None, None, None),  # a query that matched nothing
        ([4], None, lengths(-1)),  # every value NULL: string_agg is NULL
        ([5], b"", lengths(0)),
    ]
    ids, strings = decode(columnar, rows)
    assert ids == [1, 2, 3, 4, 5]
    assert strings.type == pa.string()
    assert strings.to_pylist() == ["añ", None, "b", None, ""]
    assert decode(columnar, [(None, None, None)]) == [[], pa.array([], pa.string())]

    with pytest.raises(LookupQueryError, match="column 's': the server sent 3 bytes"):
        decode(columnar, [([1], b"abc", lengths(2))])


async def _create_latin1(dsn: str, name: str) -> None:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        await connection.execute(
            f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
            "TEMPLATE template0"
        )
    finally:
        await connection.close(timeout=5)


async def _drop(dsn: str, name: str) -> None:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        await connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await connection.close(timeout=5)


def test_a_database_not_in_utf8_sends_text_as_arrays(pg_tables: PgTables) -> None:
    name = f"aops_latin1_{uuid.uuid4().hex[:10]}"
    try:
        run_isolated(_create_latin1(pg_tables.dsn, name))
    except asyncpg.InsufficientPrivilegeError as exc:
        unavailable(f"cannot create a LATIN1 database here: {exc}")
    try:
        dsn = urlunsplit(urlsplit(pg_tables.dsn)._replace(path="/" + name))
        query = """SELECT k, s FROM (VALUES (1, 'café'), (2, NULL)) AS t(k, s)
                   WHERE k = ANY($1)"""
        batch = pa.RecordBatch.from_pydict({"key": pa.array([2, 1], pa.int64())})
        lookup = CountingLookup(dsn, query, key="key", on="k")
        got: list[tuple[int, dict[str, Any]]] = columnar_pairs(lookup, batch)
        assert got == [(0, {"k": 2, "s": None}), (1, {"k": 1, "s": "café"})]
        assert "string_agg" not in lookup.sql[0]  # LATIN1 bytes are not UTF-8: arrays
    finally:
        run_isolated(_drop(pg_tables.dsn, name))


def test_a_text_column_matched_to_integer_keys_names_the_column_and_both_kinds(
    pg_tables: PgTables,
) -> None:
    # Matched on the text column "code" while the keys are integers.
    query = "SELECT k, code FROM (VALUES (1, 'x1')) AS t(k, code) WHERE k = ANY($1)"
    batch = pa.RecordBatch.from_pydict({"key": pa.array([1], pa.int64())})
    lookup = PostgresLookup(pg_tables.dsn, query, key="key", on="code")
    with pytest.raises(
        LookupQueryError, match=r"column 'code' returned 'x1' \(a string\) for a key that is a num"
    ):
        columnar_pairs(lookup, batch)


def _every_character() -> list[str]:
    """Strings that together hold every byte value a Postgres UTF-8 text can hold
    (1..0x7F as themselves, 0x80..0xFF as lead and continuation bytes of 2-, 3- and
    4-byte characters) and the backslash sequences that bytea's input syntax would
    read as escapes."""
    ascii_ = "".join(chr(c) for c in range(1, 0x80))
    two = "".join(chr(c) for c in range(0x80, 0x800, 7))
    three = "".join(chr(c) for c in (0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF))
    four = "".join(chr(c) for c in (0x10000, 0x1F642, 0x10FFFF))
    escapes = ["C:\\temp\\x", "\\\\", "\\x41", "\\101", "\\", "a\\b\\", "\\\\x"]
    return [ascii_, two, three, four, *escapes, "", "plain"]


# One table per text-like type a column can have: text and varchar travel as bytes,
# the others as arrays; every one must answer exactly what was stored.
TEXT_LIKE = {
    "text": "text",
    "varchar": "varchar",
    "varchar(4000)": "varchar(4000)",
    "char(600)": "char(600)",
    "name": "name",
    "citext": "citext",
}


@pytest.mark.parametrize("type_", list(TEXT_LIKE))
def test_every_byte_and_backslash_of_a_text_like_type_comes_back_as_stored(
    pg_tables: PgTables, type_: str
) -> None:
    table = f"aops_bytes_{pg_tables.suffix}_{abs(hash(type_)) % 10**6}"
    values = _every_character()
    if type_ == "name":  # a name holds at most 63 bytes
        values = [v.encode()[:63].decode(errors="ignore") for v in values]
    statements = []
    if type_ == "citext":
        statements.append("CREATE EXTENSION IF NOT EXISTS citext")
    statements.append(f"CREATE TABLE {table} (k int PRIMARY KEY, s {TEXT_LIKE[type_]})")

    async def fill() -> None:
        connection = await asyncpg.connect(pg_tables.dsn, timeout=10)
        try:
            await connection.executemany(
                f"INSERT INTO {table} VALUES ($1, $2)",
                [(k, v) for k, v in enumerate(values)] + [(len(values), None)],
            )
        finally:
            await connection.close(timeout=5)

    try:
        pg_execute(pg_tables.dsn, *statements)
        run_isolated(fill())
        query = f"SELECT k, s FROM {table} WHERE k = ANY($1)"
        keys = [*range(len(values) + 1), 999, None]
        batch = pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.int64())})
        lookup = CountingLookup(pg_tables.dsn, query, key="key", on="k")
        got = columnar_pairs(lookup, batch)
        # citext is read through its text form: its queries answer records.
        assert ("_agg" in lookup.sql[0]) == (type_ != "citext")
        per_row = per_row_pairs(
            PostgresLookup(pg_tables.dsn, query, key="key", on="k"), batch.to_pylist()
        )
        assert got == per_row
        stored = [r["s"] for _, r in got]
        if type_ == "char(600)":  # bpchar pads to its length
            stored = [s.rstrip(" ") if s is not None else None for s in stored]
            values = [v.rstrip(" ") for v in values]
        assert stored == [*values, None]
    finally:
        pg_execute(pg_tables.dsn, f"DROP TABLE IF EXISTS {table}")
