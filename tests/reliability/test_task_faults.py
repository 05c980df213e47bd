"""Faults of the task: an exception after rows were emitted, a worker that dies;
Spark retries the task and the output holds every row exactly once."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops.spark import ordered_wait, unordered_wait
from tests.cross_process import first_attempt, log_request, requests
from tests.spark.conftest import arrow_batch_rows

pytestmark = pytest.mark.spark


class FailsFirstAttempt(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Logs every request to a file; on attempt 0 of a task, row ``at`` raises or kills."""

    def __init__(self, log: str, at: int, how: str) -> None:
        self.log, self.at, self.how = log, at, how

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.log, row["id"])
        if row["id"] == self.at and first_attempt():
            if self.how == "kill":
                os._exit(31)
            raise RuntimeError(f"executor-side failure at row {row['id']}")
        await asyncio.sleep(0.0005)
        return [{"v": row["id"] * 3}]


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    with arrow_batch_rows(spark, 200):
        yield


@pytest.mark.parametrize("how", ["raise", "kill"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["no-checkpoint", "checkpoint"])
def test_failed_attempt_after_emitting_rows_retries_to_exactly_once(
    spark: SparkSession, tmp_path: Path, small_arrow_batches: None, how: str, checkpoint: bool
) -> None:
    log = tmp_path / "requests"
    fn = FailsFirstAttempt(str(log), at=2600, how=how)
    # batch_size 100: the failed attempt has already handed many output batches to Spark
    out = unordered_wait(
        spark.range(0, 4000, numPartitions=2), fn, timeout=10, capacity=64,
        output_schema="v long", batch_size=100,
        checkpoint_location=str(tmp_path / "ckpt") if checkpoint else None,
        checkpoint_flush_rows=200,
    )  # fmt: skip
    rows = out.collect()
    assert Counter(r.id for r in rows) == Counter(range(4000))
    assert all(r.v == 3 * r.id for r in rows)
    counts = requests(log)
    assert set(counts) == set(range(4000))
    repeated = [i for i, n in counts.items() if n > 1]
    if checkpoint:
        # completed lookups logged before the failure are not requested again: at most
        # what was in flight (capacity) and what was not flushed yet (flush count)
        tree = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "ckpt").rglob("*"))
        assert repeated and len(repeated) <= 200 + 64, tree
    else:
        assert len(repeated) >= 500  # everything the failed attempt did, done again


def test_ordered_output_survives_a_retry_in_order(
    spark: SparkSession, tmp_path: Path, small_arrow_batches: None
) -> None:
    fn = FailsFirstAttempt(str(tmp_path / "requests"), at=1234, how="raise")
    out = ordered_wait(
        spark.range(0, 2000, numPartitions=2), fn, timeout=10, output_schema="v long",
        checkpoint_location=str(tmp_path / "ckpt"),
    )  # fmt: skip
    assert [r.id for r in out.collect()] == list(range(2000))
