"""A job that failed in the function raises, under ``library_errors()``, the library's
exception under its public name, once, with Spark's exception (and its trace) as the
cause; Spark's own failures pass through unchanged."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from asyncio_ops import AsyncOperatorError, ConfigurationError
from asyncio_ops.spark import library_error, library_errors, ordered_wait

pytestmark = [pytest.mark.spark]


async def _refuses(row: dict[str, Any]) -> list[dict[str, Any]]:
    if row["id"] == 2:
        raise ConfigurationError("tier_url 'http://nowhere' is not a service\n(second line)")
    return [{"name": "ok"}]


def test_a_failed_task_raises_the_library_exception_with_spark_s_as_cause(
    spark: SparkSession,
) -> None:
    out = ordered_wait(spark.range(4, numPartitions=1), _refuses, timeout=5,
                       output_schema="name string")  # fmt: skip

    @library_errors()  # a decorator, or a context manager
    def collect() -> list[Any]:
        return out.collect()

    with pytest.raises(AsyncOperatorError) as info:
        collect()
    error = info.value
    assert type(error) is AsyncOperatorError
    assert str(error) == (
        "async lookup failed for input {'id': 2} after 1 operator attempt(s): "
        "ConfigurationError: tier_url 'http://nowhere' is not a service\n(second line)"
    )
    assert isinstance(error.__cause__, PythonException)
    shown = "".join(traceback.format_exception(error))
    # printed: Spark's trace first, then the library's exception, last, under its public
    # name, once after the cause
    last = shown.rstrip().splitlines()[-4:]
    assert any(line.startswith("asyncio_ops.AsyncOperatorError: async lookup") for line in last)
    assert shown.index("The above exception was the direct cause") < shown.rindex(
        "asyncio_ops.AsyncOperatorError"
    )


def test_other_failures_pass_unchanged(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="boom") as info, library_errors():
        spark.range(1).selectExpr("raise_error('boom')").collect()
    assert not isinstance(info.value, AsyncOperatorError)
    assert library_error(info.value) is None
    assert library_error(ValueError("asyncio_ops.ConfigurationError: x")) is None
    with pytest.raises(KeyError), library_errors():
        raise KeyError("driver-side")
