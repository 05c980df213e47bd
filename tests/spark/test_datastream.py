"""PyFlink porting: a function written as for PyFlink's ``AsyncDataStream`` runs unchanged
apart from imports (rows arrive as ``Row``: ``value[0]``, ``value.name``; ``[Row(...)]``
or bare values come back), with PyFlink's names and argument order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pyspark.sql import Row, SparkSession

from asyncio_ops import AsyncFunction, AsyncRetryStrategy, ConfigurationError
from asyncio_ops.spark import AsyncDataStream


class AsyncFunctionImpl(AsyncFunction):  # type: ignore[type-arg]
    """As in PyFlink: reads the row by position and by name, returns a list of Rows."""

    async def async_invoke(self, value: Row) -> list[Row]:
        await asyncio.sleep(0.001)
        return [Row(value[0], value.name.upper())]


class PlusOne(AsyncFunction):  # type: ignore[type-arg]
    """As in PyFlink with a scalar output type: bare values."""

    async def async_invoke(self, value: Row) -> list[int]:
        await asyncio.sleep(0.001)
        return [value[0] + 1]


class Seconds:
    """Stands for PyFlink's ``Time.seconds(n)``: what ``timeout`` reads of it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def to_milliseconds(self) -> int:
        return self.n * 1000


@pytest.fixture
def people(spark: SparkSession) -> Any:
    return spark.createDataFrame([(i, f"n{i}") for i in range(6)], "id long, name string")


@pytest.mark.parametrize("mode", ["ordered_wait", "unordered_wait"])
def test_a_pyflink_function_runs_unchanged(spark: SparkSession, people: Any, mode: str) -> None:
    wait = getattr(AsyncDataStream, mode)
    out = wait(people, AsyncFunctionImpl(), Seconds(5), 10, "id long, name string")
    assert out.columns == ["id", "name"]  # only what the function returns, as in PyFlink
    assert sorted(tuple(r) for r in out.collect()) == [(i, f"N{i}") for i in range(6)]


def test_bare_values_with_a_one_column_output_type_and_retry(people: Any) -> None:
    retry = AsyncRetryStrategy.fixed_delay(2, 10)
    out = AsyncDataStream.unordered_wait_with_retry(people, PlusOne(), 5, retry, 10, "next long")
    assert sorted(r.next for r in out.collect()) == list(range(1, 7))


def test_output_type_is_required(people: Any) -> None:
    with pytest.raises(ConfigurationError, match="output_type is required"):
        AsyncDataStream.ordered_wait(people, PlusOne(), 5)


class BareRow(AsyncFunction):  # type: ignore[type-arg]
    """Returns a bare Row instead of a list of Rows (a common porting slip); its
    ``timeout`` does the same."""

    async def async_invoke(self, value: Row) -> Any:
        if value.id % 2:
            await asyncio.sleep(30)  # times out: timeout() answers
        return Row(value[0], value.name.upper())

    async def timeout(self, value: Row) -> Any:
        return Row(value[0], "late")


@pytest.mark.parametrize("mode", ["ordered_wait", "unordered_wait"])
def test_a_bare_row_is_a_failed_lookup_kept_as_an_error_row_with_its_input(
    people: Any, mode: str
) -> None:
    wait = getattr(AsyncDataStream, mode)
    out = wait(people, BareRow(), 0.5, 10, "id long, name string", on_error="error_column")
    # only the output columns, as in PyFlink; an error row's input is in _error.input
    assert out.columns == ["id", "name", "_error"]
    rows = sorted(out.collect(), key=lambda r: r["_error"]["input"]["id"])
    assert [r["_error"]["input"].asDict() for r in rows] == [
        {"id": i, "name": f"n{i}"} for i in range(6)
    ]
    for r in rows:
        assert (r["id"], r["name"]) == (None, None)
        assert r["_error"]["exception"] == "InvalidResultError"
        assert "must return a list of results" in r["_error"]["message"]
        assert "got Row" in r["_error"]["message"]
        assert "wrap a single result in a list" in r["_error"]["message"]


class HangsOnOdd(AsyncFunction):  # type: ignore[type-arg]
    """Odd ids never answer: the timeout decides them, and timeout() answers ``late``."""

    async def async_invoke(self, value: Row) -> list[Row]:
        if value.id % 2:
            await asyncio.sleep(30)
        return [Row(value[0], value.name.upper())]

    async def timeout(self, value: Row) -> list[Row]:
        return [Row(value[0], "late")]


def test_pyflinks_time_is_the_timeout(people: Any) -> None:
    """``from pyflink.common.time import Time`` becomes ``from asyncio_ops.spark import Time``:
    the same names, and AsyncDataStream reads it as PyFlink does (to_milliseconds)."""
    from asyncio_ops.spark import Time

    out = AsyncDataStream.ordered_wait(
        people, HangsOnOdd(), Time.milliseconds(500), 10, "id long, name string"
    )
    assert [tuple(r) for r in out.collect()] == [
        (i, "late" if i % 2 else f"N{i}") for i in range(6)
    ]


def test_time_has_pyflinks_units() -> None:
    from datetime import timedelta

    from asyncio_ops.spark import Time

    assert Time.milliseconds(1500).to_milliseconds() == 1500
    assert Time.seconds(5).to_milliseconds() == 5_000
    assert Time.minutes(2).to_milliseconds() == 120_000
    assert Time.hours(1).to_milliseconds() == 3_600_000
    assert Time.days(1).to_milliseconds() == 86_400_000
    assert Time.seconds(60) == Time.minutes(1) and Time.seconds(1) != Time.seconds(2)
    assert Time.seconds(5).to_timedelta() == timedelta(seconds=5)
    assert repr(Time.seconds(2)) == "Time.milliseconds(2000)"
    with pytest.raises(ConfigurationError, match=r"Time.seconds\(\) must not be negative, got -1"):
        Time.seconds(-1)
    with pytest.raises(ConfigurationError, match=r"Time.seconds\(\) takes an int, got 1.5"):
        Time.seconds(1.5)  # type: ignore[arg-type]
