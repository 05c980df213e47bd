"""Every path of PostgresLookup answers a query the same way, or fails the same way.

The paths: one row at a time (``async_invoke``), dict chunks
(``async_invoke_chunk``), the columnar one-to-one path (``async_invoke_arrow``
with one key column and no cache) and the columnar general path (a cache, or
``many=True``). The rule they share (docs/connectors.md, "Which queries"):

- a result row whose ``on`` value is NULL (or has a NULL part) matches no input
  row: an outer join's unmatched side, or a stray row, is left out;
- a non-NULL ``on`` value must be one of the keys the query was asked for, of
  the key's kind (a string for a string key, a number for a number key, ...);
  anything else is a ``LookupQueryError`` naming the column, the value and the
  key's type, never a silent miss or a match made by converting one to the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import LookupCache, LookupQueryError
from asyncio_ops.connectors.postgres import PostgresLookup

from .support import PgTables, columnar_pairs, per_row_pairs, run_isolated

pytestmark = pytest.mark.postgres

Pairs = list[tuple[int, dict[str, Any]]]


def chunk_pairs(lookup: PostgresLookup, rows: list[dict[str, Any]]) -> Pairs:
    async def go() -> Pairs:
        async with lookup:
            answers = await lookup.async_invoke_chunk(rows)
        return [(i, dict(r)) for i, answer in enumerate(answers) for r in answer]

    return run_isolated(go())


def every_path(
    make: Callable[..., PostgresLookup], batch: pa.RecordBatch
) -> dict[str, Callable[[], Pairs]]:
    """The four paths over ``batch``, each with a fresh lookup from ``make(**options)``."""
    rows = batch.to_pylist()
    return {
        "per row": lambda: per_row_pairs(make(), rows),
        "dict chunk": lambda: chunk_pairs(make(), rows),
        "columnar": lambda: columnar_pairs(make(), batch),
        "columnar with a cache": lambda: columnar_pairs(make(cache=LookupCache()), batch),
    }


def answers_of(make: Callable[..., PostgresLookup], batch: pa.RecordBatch) -> dict[str, Pairs]:
    return {name: run() for name, run in every_path(make, batch).items()}


def test_an_outer_join_over_the_keys_leaves_unmatched_keys_out_on_every_path(
    pg_tables: PgTables,
) -> None:
    query = f"""SELECT c.id, c.name FROM unnest($1::int[]) AS k(id)
                LEFT JOIN {pg_tables.customers} c ON c.id = k.id"""
    batch = pa.RecordBatch.from_pydict(
        {"customer_id": pa.array([1, 500, None, 2, 600, None, 1], pa.int64())}
    )

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id", **options)

    answers = answers_of(make, batch)
    expected = [
        (0, {"id": 1, "name": "customer-1"}),
        (3, {"id": 2, "name": "customer-2"}),
        (6, {"id": 1, "name": "customer-1"}),
    ]
    assert answers == {name: expected for name in answers}


def test_an_outer_join_that_selects_the_asked_key_answers_every_key_on_every_path(
    pg_tables: PgTables,
) -> None:
    query = f"""SELECT k.id, c.name FROM unnest($1::int[]) AS k(id)
                LEFT JOIN {pg_tables.customers} c ON c.id = k.id"""
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([1, 500, None], pa.int64())})

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id", **options)

    answers = answers_of(make, batch)
    expected = [(0, {"id": 1, "name": "customer-1"}), (1, {"id": 500, "name": None})]
    assert answers == {name: expected for name in answers}


def test_a_result_row_with_a_null_key_matches_no_input_row_on_any_path(
    pg_tables: PgTables,
) -> None:
    query = f"""SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)
                UNION ALL SELECT NULL::int, 'orphan'
                UNION ALL SELECT NULL::int, 'another orphan'"""
    ids = [None, 3, None, 4, None, 3]
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array(ids, pa.int64())})

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id", **options)

    answers = answers_of(make, batch)
    expected = [
        (1, {"id": 3, "name": "customer-3"}),
        (3, {"id": 4, "name": "customer-4"}),
        (5, {"id": 3, "name": "customer-3"}),
    ]
    assert answers == {name: expected for name in answers}


@pytest.mark.parametrize(
    ("select", "keys", "key_type"),
    [
        # the key is a string, the column an integer: no conversion on any path
        ("SELECT id, name FROM {t} WHERE id::text = ANY($1)", ["1", "2", None], pa.string()),
        # the key is an integer, the column a string
        ("SELECT id::text AS id, name FROM {t} WHERE id = ANY($1)", [1, 2, None], pa.int64()),
    ],
)
def test_a_key_column_of_another_kind_than_the_key_is_an_error_on_every_path(
    pg_tables: PgTables, select: str, keys: list[Any], key_type: pa.DataType
) -> None:
    query = select.format(t=pg_tables.customers)
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array(keys, key_type)})

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id", **options)

    for name, run in every_path(make, batch).items():
        with pytest.raises(LookupQueryError, match=r"column 'id'.*cast it in SQL") as caught:
            run()
        assert "key" in str(caught.value), name


def test_a_key_column_value_that_was_not_asked_for_is_an_error_on_every_path(
    pg_tables: PgTables,
) -> None:
    query = f"SELECT upper(name) AS name, tier FROM {pg_tables.customers} WHERE name = ANY($1)"
    batch = pa.RecordBatch.from_pydict({"name": ["customer-1", "customer-2", None]})

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(pg_tables.dsn, query, key="name", **options)

    for name, run in every_path(make, batch).items():
        with pytest.raises(LookupQueryError, match=r"'CUSTOMER-[12]'.*not one of the keys"):
            run()
        assert name


def test_numbers_of_another_width_still_match_on_every_path(pg_tables: PgTables) -> None:
    # An int4 column for a long key, a numeric for a double: both numbers, equal values.
    query = f"""SELECT id::numeric AS id, name FROM {pg_tables.customers}
                WHERE id = ANY($1::int[])"""
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([7.0, 8.0, None], pa.float64())})

    def make(**options: Any) -> PostgresLookup:
        return PostgresLookup(
            pg_tables.dsn, query, key="customer_id", on="id", columns=("name",), **options
        )

    answers = answers_of(make, batch)
    expected = [(0, {"name": "customer-7"}), (1, {"name": "customer-8"})]
    assert answers == {name: expected for name in answers}
