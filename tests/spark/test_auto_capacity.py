"""``capacity="auto"`` on Spark: each partition adapts its own limit (reported per
partition in ``AsyncMetrics``), the output is what a fixed capacity gives, and the
option is validated on the driver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait

pytestmark = pytest.mark.spark


async def slow(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.002 + (row["id"] * 7919 % 5) * 0.001)
    return [{"name": f"customer-{row['id']}"}]


@pytest.mark.parametrize("wait", [ordered_wait, unordered_wait], ids=["ordered", "unordered"])
def test_auto_capacity_gives_the_fixed_capacity_output(spark: SparkSession, wait: Any) -> None:
    df = spark.range(0, 6000, numPartitions=3)
    metrics = AsyncMetrics(spark)
    auto = wait(df, slow, timeout=30, output_schema="name string", capacity="auto",
                max_capacity=256, metrics=metrics).collect()  # fmt: skip
    fixed = wait(df, slow, timeout=30, output_schema="name string", capacity=64).collect()
    if wait is ordered_wait:
        assert auto == fixed
    else:
        assert sorted(auto) == sorted(fixed)
    limits = metrics.summary()["capacity_limits"]
    assert len(limits) == 3 and all(1 <= n <= 256 for n in limits), limits
    assert max(limits) > 16  # the limits grew from where they started
    low, high = metrics.summary()["capacity_range"]
    assert low <= min(limits) and high >= max(limits) and low <= 16 < high
    assert metrics.summary()["capacity_cuts"] == 0  # no timeout, no overload answer


def test_auto_capacity_is_validated(spark: SparkSession) -> None:
    df = spark.range(3)
    with pytest.raises(ConfigurationError, match=r"capacity must be an int > 0 or 'auto'"):
        ordered_wait(df, slow, timeout=1, output_schema="name string", capacity="adaptive")
    with pytest.raises(ConfigurationError, match=r"max_capacity must be an int > 0"):
        ordered_wait(df, slow, timeout=1, output_schema="name string", capacity="auto",
                     max_capacity=0)  # fmt: skip
