"""Which path ``chunk_size`` chooses, on the driver, for each kind of function."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup

from asyncio_ops import AsyncFunction, AsyncRetryStrategy, ConfigurationError
from asyncio_ops.async_retry_predicates import empty_result_predicate, has_exception_predicate
from asyncio_ops.options import DEFAULT_CAPACITY
from asyncio_ops.spark._api import chunk_rows_of, default_capacity
from asyncio_ops.spark._options import WaitOptions

BATCH = 10_000  # the input Arrow batch's rows
QUERY = "SELECT id, name FROM customers WHERE id = ANY($1)"


class Columnar(AsyncFunction[Any, Any]):
    async def async_invoke(self, row: Any) -> Any:
        return [{"name": "x"}]

    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> Any:
        return None, {"name": ["x"] * batch.num_rows}


class Prefers(Columnar):
    def __init__(self, rows: Any, capacity: Any = 3) -> None:
        self.rows = rows
        self.capacity = capacity

    def preferred_chunk_rows(self) -> Any:
        return self.rows

    def preferred_capacity(self) -> Any:
        return self.capacity


class OverridesAsyncInvoke(Columnar):
    async def async_invoke(self, row: Any) -> Any:
        return []


class OverridesTimeout(Columnar):
    def timeout(self, row: Any) -> Any:
        return [{"name": "late"}]


async def per_row(row: Any) -> Any:
    return []


def auto(fn: Any, rows_as: str = "dict", retry: AsyncRetryStrategy | None = None) -> Any:
    return chunk_rows_of("auto", fn, rows_as, retry, BATCH)


def test_connectors_choose_one_requests_worth() -> None:
    assert auto(PostgresLookup("postgresql://h/db", QUERY, key="id")) == 5_000
    pg = PostgresLookup("postgresql://h/db", QUERY, key="id", batch_size=100, pool_size=4)
    assert auto(pg) == 400
    batch = HttpBatch(key="id", result_key="id", param="ids", max_size=50)
    assert auto(HttpLookup("http://h/customers", batch=batch)) == 50
    assert auto(HttpLookup("http://h/customers/{id}")) is None  # no batch endpoint: rows


def test_functions_choose_by_what_they_declare() -> None:
    assert auto(per_row) is None
    assert auto(Columnar()) == BATCH  # no preference: one input Arrow batch
    assert auto(Prefers(64)) == 64
    assert auto(Prefers(None)) is None
    assert auto(OverridesTimeout()) == BATCH  # honoured per row on the columnar path
    for bad in (0, -3, 2.5, "many"):
        with pytest.raises(ConfigurationError, match="preferred_chunk_rows"):
            auto(Prefers(bad))


def test_what_asks_for_rows_keeps_rows() -> None:
    assert auto(Columnar(), rows_as="row") is None
    assert auto(OverridesAsyncInvoke()) is None
    judges_results = AsyncRetryStrategy.fixed_delay(3, 10, result_predicate=empty_result_predicate)
    assert auto(Columnar(), retry=judges_results) is None
    judges_errors = AsyncRetryStrategy.fixed_delay(
        3, 10, exception_predicate=has_exception_predicate
    )
    assert auto(Columnar(), retry=judges_errors) == BATCH


def test_an_explicit_chunk_size_is_checked() -> None:
    assert chunk_rows_of(None, Columnar(), "dict", None, BATCH) is None
    assert chunk_rows_of(300, Columnar(), "dict", None, BATCH) == 300
    for bad in ("big", 0, -3, True):  # its form: checked with the other options
        with pytest.raises(ConfigurationError, match="chunk_size must be"):
            WaitOptions.of(timeout=1, chunk_size=bad)
    with pytest.raises(ConfigurationError, match="OverridesAsyncInvoke overrides async_invoke"):
        chunk_rows_of(8, OverridesAsyncInvoke(), "dict", None, BATCH)
    with pytest.raises(ConfigurationError, match="answers rows one at a time as configured"):
        chunk_rows_of(8, HttpLookup("http://h/customers/{id}"), "dict", None, BATCH)
    with pytest.raises(ConfigurationError, match="rows_as='row'"):
        chunk_rows_of(8, Columnar(), "row", None, BATCH)


def test_capacity_not_given_is_the_functions_when_it_chose_its_chunks() -> None:
    pg = PostgresLookup("postgresql://h/db", QUERY, key="id")
    assert default_capacity(pg, "auto", auto(pg)) == 4  # a few chunks fill the pool
    batch = HttpBatch(key="id", result_key="id", param="ids")
    http = HttpLookup("http://h/customers", batch=batch, max_connections=32)
    assert default_capacity(http, "auto", auto(http)) == 32  # a request per connection
    assert default_capacity(Prefers(64, 5), "auto", 64) == 5
    # rows, a function without a preference, or chunks the user sized: the default
    assert default_capacity(HttpLookup("http://h/c/{id}"), "auto", None) == DEFAULT_CAPACITY
    assert default_capacity(Columnar(), "auto", BATCH) == DEFAULT_CAPACITY
    assert default_capacity(pg, 10_000, 10_000) == DEFAULT_CAPACITY
    assert default_capacity(pg, None, None) == DEFAULT_CAPACITY == 100
    with pytest.raises(ConfigurationError, match="preferred_capacity"):
        default_capacity(Prefers(64, 0), "auto", 64)
