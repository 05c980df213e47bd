"""A job that failed in the function raises the library's exception under its public
name, once, with Spark's exception (and its trace) as the cause: by default once the
library's API was called on the driver, and under ``library_errors()`` for what that
cannot reach; Spark's own failures pass through unchanged."""

from __future__ import annotations

import traceback
from typing import Any

import py4j.java_gateway as gateway  # type: ignore[import-untyped]
import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from asyncio_ops import AsyncOperatorError, ConfigurationError
from asyncio_ops.spark import keyed_process, library_error, library_errors, ordered_wait
from asyncio_ops.state import KeyedProcessFunction

pytestmark = [pytest.mark.spark]


async def _refuses(row: dict[str, Any]) -> list[dict[str, Any]]:
    if row["id"] == 2:
        raise ConfigurationError("tier_url 'http://nowhere' is not a service\n(second line)")
    return [{"name": "ok"}]


def _hooked() -> bool:
    return bool(getattr(gateway.get_return_value, "__asyncio_ops_library_errors__", False))


def test_a_failed_task_raises_the_library_exception_with_spark_s_as_cause(
    spark: SparkSession,
) -> None:
    out = ordered_wait(spark.range(4, numPartitions=1), _refuses, timeout=5,
                       output_schema="name string")  # fmt: skip
    with pytest.raises(AsyncOperatorError) as info:
        out.collect()  # no wrapper: the default
    _check_the_refusal(info.value)


def test_library_errors_raises_it_where_the_default_cannot_reach(spark: SparkSession) -> None:
    """A session created after the library's last call re-installs PySpark's converter
    alone (what a Spark Connect client, without py4j, always has): the wrapper still
    translates, and the library's next call hooks the default again."""
    out = ordered_wait(spark.range(4, numPartitions=1), _refuses, timeout=5,
                       output_schema="name string")  # fmt: skip
    assert _hooked()
    spark.newSession()  # its __init__ installs PySpark's converter over ours
    assert not _hooked()
    with pytest.raises(PythonException) as spark_s:
        out.collect()
    assert isinstance(library_error(spark_s.value), AsyncOperatorError)

    @library_errors()  # a decorator, or a context manager
    def collect() -> list[Any]:
        return out.collect()

    with pytest.raises(AsyncOperatorError) as info:
        collect()
    _check_the_refusal(info.value)
    ordered_wait(spark.range(1), _refuses, timeout=5, output_schema="name string")
    assert _hooked()


def _check_the_refusal(error: BaseException) -> None:
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


class _Sevens(KeyedProcessFunction[Any, dict[str, Any], dict[str, Any]]):
    def process_element(self, value: dict[str, Any], ctx: Any, out: Any) -> None:
        if value["id"] == 7:
            raise ConfigurationError("sevens are not configured")
        out.collect({"id": value["id"]})


def test_keyed_process_raises_the_library_exception_too(spark: SparkSession) -> None:
    out = keyed_process(spark.range(10, numPartitions=2), _Sevens(), key="id",
                        output_schema="id long")  # fmt: skip
    with pytest.raises(ConfigurationError, match="sevens are not configured") as info:
        out.collect()
    assert isinstance(info.value.__cause__, PythonException)


def test_other_failures_pass_unchanged(spark: SparkSession) -> None:
    ordered_wait(spark.range(1), _refuses, timeout=5, output_schema="name string")
    assert _hooked()  # installed, and still:
    with pytest.raises(Exception, match="boom") as info:
        spark.range(1).selectExpr("raise_error('boom')").collect()
    assert not isinstance(info.value, AsyncOperatorError)
    with pytest.raises(Exception, match="boom") as info, library_errors():
        spark.range(1).selectExpr("raise_error('boom')").collect()
    assert not isinstance(info.value, AsyncOperatorError)
    assert library_error(info.value) is None
    assert library_error(ValueError("asyncio_ops.ConfigurationError: x")) is None
    with pytest.raises(KeyError), library_errors():
        raise KeyError("driver-side")
