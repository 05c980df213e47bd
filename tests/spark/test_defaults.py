"""The defaults give the output the explicit settings give: every option spelled out at
its documented default, and Flink's exact capacity (``output_buffer=0``), produce the same
rows (in the same order where the mode promises one) as a call with no options, for
ordered, unordered, keyed, event-time, checkpointed and error-row runs."""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import ordered_wait, unordered_wait

pytestmark = pytest.mark.spark

N = 1500


async def lookup(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Deterministic latencies of 0 to 3 ms, so completions overtake each other."""
    i = row["id"]
    await asyncio.sleep((i * 7919 % 7) * 0.0005)
    if i % 97 == 13:
        raise ValueError(f"no customer {i}")
    return [{"name": f"customer-{i}"}] * (2 if i % 11 == 0 else 1)


def documented(spark: SparkSession) -> dict[str, Any]:
    """Every option of ordered_wait / unordered_wait at its documented default."""
    return {
        "capacity": 100, "retry": None, "key": None, "event_time": None,
        "watermark_delay": None, "watermark_interval": 1000, "late_records": "keep",
        "on_error": "fail", "on_empty": None, "rows_as": "dict", "max_parallelism": 128,
        "num_partitions": None,
        "batch_size": int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")),
        "keep_input_columns": True, "metrics": None, "uid": None,
        "checkpoint_location": None, "checkpoint_version": None, "drain_timeout": None,
        "retain_versions": 10, "chunk_size": "auto", "output_buffer": 400,
        "checkpoint_flush_rows": 1000, "checkpoint_flush_interval": 1.0,
        "state_backend": "heap", "max_capacity": 1024, "preflight": True,
    }  # fmt: skip


def test_the_documented_defaults_are_the_signatures(spark: SparkSession) -> None:
    for wait in (ordered_wait, unordered_wait):
        defaults = {name: p.default for name, p in inspect.signature(wait).parameters.items()
                    if p.default is not inspect.Parameter.empty}  # fmt: skip
        # derived: capacity (100 here, a columnar connector's own), batch_size, output_buffer
        want = documented(spark) | {"capacity": None, "batch_size": None, "output_buffer": None}
        assert defaults == want


def _df(spark: SparkSession) -> DataFrame:
    return spark.range(0, N, numPartitions=3).select(
        "id", (F.col("id") % 13).alias("k"),
        F.timestamp_seconds(F.col("id") % 40 + F.col("id") / 20).alias("ts"),
    )  # fmt: skip


SCENARIOS: dict[str, dict[str, Any]] = {
    "ordered": {},
    "unordered": {},
    "keyed": {"key": "k"},
    "event time": {"event_time": "ts", "watermark_delay": 5, "watermark_interval": 50},
    "error rows": {"on_error": "error_column"},
    "checkpointed": {"checkpoint_location": None},  # a fresh directory per run, below
}


def _rows(out: DataFrame, ordered: bool, keyed: bool) -> Any:
    rows = [r.asDict(recursive=True) for r in out.collect()]
    if keyed:  # one key's rows keep their input order, keys interleave freely
        by_key: dict[int, list[Any]] = defaultdict(list)
        for r in rows:
            by_key[r["k"]].append(r)
        return dict(by_key)
    return rows if ordered else sorted(rows, key=repr)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_defaults_equal_explicit_settings(
    spark: SparkSession, tmp_path: Path, scenario: str
) -> None:
    wait = unordered_wait if scenario in ("unordered", "keyed") else ordered_wait
    given = dict(SCENARIOS[scenario])
    df = _df(spark)
    if scenario != "error rows":
        df = df.where(F.col("id") % 97 != 13)  # no failing rows
    runs = []
    for variant, options in (
        ("defaults", {}),
        ("explicit", documented(spark)),
        ("flink capacity", {"output_buffer": 0}),
    ):
        kwargs = {**options, **given}
        if scenario == "checkpointed":
            kwargs["checkpoint_location"] = str(tmp_path / variant)
        out = wait(df, lookup, timeout=30, output_schema="name string", **kwargs)
        runs.append(_rows(out, wait is ordered_wait, "key" in given))
    assert runs[0], "no rows"
    assert runs[1] == runs[0], "explicit settings differ from the defaults"
    assert runs[2] == runs[0], "output_buffer=0 differs from the defaults"
    if scenario == "error rows":
        errors = [r for r in runs[0] if r["_error"] is not None]
        assert len(errors) == len([i for i in range(N) if i % 97 == 13])
    if scenario == "event time":
        late = [r for r in runs[0] if r["_late"]]
        assert late and len(late) < len(runs[0])  # both kinds of rows were compared
