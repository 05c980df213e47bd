"""``keyed_process`` in real Spark: keyed state of every kind, both timer domains, TTL,
batch and streaming, restarts with exactly-once output, rescaling, heap and RocksDB."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import keyed_process
from asyncio_ops.state import (
    AggregatingStateDescriptor,
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    TimeDomain,
    TtlTimeCharacteristic,
    ValueStateDescriptor,
)
from tests.state.test_backends import Average

Row = dict[str, Any]


class CountWithTimeout(KeyedProcessFunction[str, Row, Row]):
    """Counts events per user; an event-time timer 10 s after the last event reports the
    count (a session closed by inactivity)."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int]("count"))
        self.last = runtime_context.get_state(ValueStateDescriptor[float]("last"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.count.update((self.count.value() or 0) + 1)
        last = self.last.value()
        if last is not None:
            ctx.timer_service().delete_event_time_timer(last + 10)
        self.last.update(value["ts"])
        ctx.timer_service().register_event_time_timer(value["ts"] + 10)

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        out.collect({"user": ctx.get_current_key(), "n": self.count.value(), "at": timestamp})
        self.count.clear()
        self.last.clear()


def test_batch_counts_per_key_and_fires_every_event_time_timer_at_the_end(
    spark: SparkSession,
) -> None:
    events = [("a", 1.0), ("b", 2.0), ("a", 3.0), ("a", 30.0), ("c", 4.0), ("b", 50.0)]
    df = spark.createDataFrame(events, "user string, ts double")
    schema = "user string, n long, at double"
    out = keyed_process(df, CountWithTimeout(), key="user", event_time="ts",
                        output_schema=schema, num_partitions=3)  # fmt: skip
    got = sorted((r.user, r.n, r.at) for r in out.collect())
    # no watermark passes a timer before the end of input (one per 1,000 rows); there the
    # watermark goes to +inf and each user's last timer fires with the user's count
    assert got == [("a", 3, 40.0), ("b", 2, 60.0), ("c", 1, 14.0)]


class EveryKind(KeyedProcessFunction[str, Row, Row]):
    """One state of each kind; yields a summary per element (PyFlink style)."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        get = runtime_context.get_state
        self.seen = get(ValueStateDescriptor[int]("seen"))
        self.items = get(ListStateDescriptor[str]("items"))
        self.per_item = get(MapStateDescriptor[str, int]("per_item"))
        self.total = get(ReducingStateDescriptor[float]("total", lambda a, b: a + b))
        self.avg = get(AggregatingStateDescriptor("avg", Average()))

    def process_element(
        self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]
    ) -> Iterator[Row]:
        self.seen.update((self.seen.value() or 0) + 1)
        self.items.add(value["item"])
        self.per_item.put(value["item"], (self.per_item.get(value["item"]) or 0) + 1)
        self.total.add(value["price"])
        self.avg.add(value["price"])
        yield {
            "user": ctx.get_current_key(),
            "seen": self.seen.value(),
            "items": ",".join(self.items.get()),
            "distinct": len(list(self.per_item.keys())),
            "total": self.total.get(),
            "avg": self.avg.get(),
        }


def test_every_state_kind_per_key_in_input_order(spark: SparkSession) -> None:
    rows = [("u1", "x", 1.0), ("u2", "y", 10.0), ("u1", "y", 3.0), ("u1", "x", 5.0)]
    df = spark.createDataFrame(rows, "user string, item string, price double").coalesce(1)
    schema = "user string, seen long, items string, distinct long, total double, avg double"
    out = keyed_process(df, EveryKind(), key="user", num_partitions=2, output_schema=schema)
    last = {}
    for r in out.collect():
        if r.user not in last or r.seen > last[r.user].seen:
            last[r.user] = r
    u1, u2 = last["u1"], last["u2"]
    assert (u1.seen, u1.items, u1.distinct, u1.total, u1.avg) == (3, "x,y,x", 2, 9.0, 3.0)
    assert (u2.seen, u2.items, u2.distinct, u2.total, u2.avg) == (1, "y", 1, 10.0, 10.0)


class Echo(KeyedProcessFunction[int, Row, Row]):
    """A processing-time timer due at once per element: it fires when the batch runs past it."""

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        ctx.timer_service().register_processing_time_timer(
            ctx.timer_service().current_processing_time()
        )

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        assert ctx.time_domain() is TimeDomain.PROCESSING_TIME
        out.collect({"id": ctx.get_current_key()})


def test_processing_time_timers_fire_when_the_batch_runs_past_them(spark: SparkSession) -> None:
    out = keyed_process(spark.range(20), Echo(), key="id", output_schema="id long")
    assert sorted(r.id for r in out.collect()) == list(range(20))


class Fails(KeyedProcessFunction[int, Row, Row]):
    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        if value["id"] == 7:
            raise ValueError("no sevens")


def test_an_error_names_the_key_and_the_row(spark: SparkSession) -> None:
    out = keyed_process(spark.range(10), Fails(), key="id", output_schema="id long")
    with pytest.raises(Exception, match=r"(?s)no sevens.*keyed_process: key 7, row"):
        out.collect()


class Heartbeat(KeyedProcessFunction[str, Row, Row]):
    """An event-time timer at each user's first event; each beat reports and registers the
    next one 10 s later, for ever."""

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        ctx.timer_service().register_event_time_timer(value["ts"])

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        out.collect({"user": ctx.get_current_key(), "at": timestamp})
        ctx.timer_service().register_event_time_timer(timestamp + 10)


@pytest.mark.timeout(60)
def test_a_batch_job_ends_when_on_timer_registers_timers_at_the_end(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a", 1.0), ("b", 2.0)], "user string, ts double")
    out = keyed_process(df, Heartbeat(), key="user", event_time="ts",
                        output_schema="user string, at double", num_partitions=2)  # fmt: skip
    # the final watermark fires the beats registered at the end of input (one per user);
    # the beats those register are dropped with the input
    assert sorted((r.user, r.at) for r in out.collect()) == [("a", 1.0), ("b", 2.0)]


class FailsOnTimer(KeyedProcessFunction[int, Row, Row]):
    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        ctx.timer_service().register_event_time_timer(float(value["id"]))

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        if ctx.get_current_key() == 7:
            raise ValueError("no sevens")


def test_an_error_in_on_timer_names_the_key_and_the_timer(spark: SparkSession) -> None:
    df = spark.range(10).selectExpr("id", "cast(id as double) as ts")
    out = keyed_process(df, FailsOnTimer(), key="id", event_time="ts", output_schema="id long")
    with pytest.raises(
        Exception, match=r"(?s)no sevens.*keyed_process: key 7, on_timer of the event_time timer"
    ):
        out.collect()


def test_options_are_checked_on_the_driver(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.range(3)
    with pytest.raises(ConfigurationError, match="KeyedProcessFunction"):
        keyed_process(df, object(), key="id", output_schema="id long")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"state_backend.*'lmdb'"):
        keyed_process(df, Echo(), key="id", output_schema="id long", state_backend="lmdb")
    with pytest.raises(ConfigurationError, match=r"key column\(s\) \['nope'\]"):
        keyed_process(df, Echo(), key="nope", output_schema="id long")
    stream = spark.readStream.schema("id long").json(str(tmp_path))
    with pytest.raises(ConfigurationError, match="streaming DataFrame needs checkpoint_location"):
        keyed_process(stream, Echo(), key="id", output_schema="id long")


# -- streaming ------------------------------------------------------------------------------------
class RunningCount(KeyedProcessFunction[str, Row, Row]):
    """Per event: the user's running count, kept in every state kind at once; event-time
    TTL of 100 s on each forgets idle users."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        ttl = StateTtlConfig(100, time_characteristic=TtlTimeCharacteristic.EVENT_TIME)
        get = runtime_context.get_state
        self.count = get(ValueStateDescriptor[int]("count", ttl=ttl))
        self.events = get(ListStateDescriptor[int]("events", ttl=ttl))
        self.by_parity = get(MapStateDescriptor[int, int]("by_parity", ttl=ttl))
        self.total = get(ReducingStateDescriptor[int]("total", lambda a, b: a + b, ttl=ttl))
        self.avg = get(AggregatingStateDescriptor("avg", Average(), ttl=ttl))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.events.add(value["event"])
        parity = value["event"] % 2
        self.by_parity.put(parity, (self.by_parity.get(parity) or 0) + 1)
        self.total.add(1)
        self.avg.add(1.0)
        kinds_agree = (
            len(self.events.get()) == n
            and sum(self.by_parity.values()) == n
            and self.total.get() == n
            and self.avg.get() == 1.0
        )
        out.collect({"event": value["event"], "user": value["user"], "n": n, "ok": kinds_agree})


def _write(src: Path, name: str, events: list[tuple[int, str, float]]) -> None:
    """One file, one micro-batch: Spark takes files in modification-time order, so each
    file gets a time of its own, later than every earlier file's."""
    lines = [json.dumps({"event": e, "user": u, "ts": ts}) for e, u, ts in events]
    path = src / name
    path.write_text("\n".join(lines))
    stamp = 1_700_000_000 + len(list(src.iterdir())) * 10
    os.utime(path, (stamp, stamp))


def _run(spark: SparkSession, tmp: Path, partitions: int, backend: str) -> None:
    stream = (
        spark.readStream.schema("event long, user string, ts double")
        .option("maxFilesPerTrigger", 1).json(str(tmp / "in"))
    )  # fmt: skip
    out = keyed_process(
        stream, RunningCount(), key="user", event_time="ts",
        output_schema="event long, user string, n long, ok boolean",
        checkpoint_location=str(tmp / "state"),
        num_partitions=partitions, state_backend=backend,
    )  # fmt: skip
    query = (
        out.writeStream.format("parquet").option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(180)
    assert query.exception() is None


def _stream_scenario(spark: SparkSession, tmp: Path, backend: str) -> list[tuple[int, str, int]]:
    (tmp / "in").mkdir()
    users = [f"u{i}" for i in range(12)]
    event = 0
    for f in range(3):  # 3 micro-batches at 2 partitions: counts grow across batches
        batch = []
        for j, u in enumerate(users * 2):
            batch.append((event, u, f * 10.0 + j / 10))
            event += 1
        _write(tmp / "in", f"a-{f}.json", batch)
    _run(spark, tmp, 2, backend)
    # the query restarts at 3 partitions: state follows its key groups
    _write(tmp / "in", "b-0.json", [(event + i, u, 35.0) for i, u in enumerate(users)])
    event += len(users)
    # u0 is idle until ts 500: its count (TTL 100 s of event time) expires
    _write(tmp / "in", "b-1.json", [(event, "u1", 450.0)])
    _write(tmp / "in", "b-2.json", [(event + 1, "u0", 500.0)])
    _run(spark, tmp, 3, backend)
    rows = spark.read.parquet(str(tmp / "out")).collect()
    assert all(r.ok for r in rows), [r for r in rows if not r.ok][:3]  # every kind, same count
    return sorted((r.event, r.user, r.n) for r in rows)


@pytest.fixture(scope="module")
def heap_output(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[int, str, int]]:
    return _stream_scenario(spark, tmp_path_factory.mktemp("heap"), "heap")


def test_streaming_state_survives_micro_batches_restarts_and_rescaling(
    heap_output: list[tuple[int, str, int]],
) -> None:
    events = [e for e, _, _ in heap_output]
    assert events == list(range(len(events))) and len(events) == 12 * 2 * 3 + 12 + 2  # once each
    counts = {(e, u): n for e, u, n in heap_output}
    last_before_restart = 12 * 2 * 3 - 1
    assert max(n for e, u, n in heap_output if e <= last_before_restart) == 6
    after = {u: n for e, u, n in heap_output if last_before_restart < e < 84}
    assert after == {f"u{i}": 7 for i in range(12)}  # 2 partitions -> 3, nothing lost
    assert counts[(84, "u1")] == 8  # the watermark then (35) had not passed u1's TTL
    assert counts[(85, "u0")] == 1  # u0 idle from ts 35 to 500 (> 100 s): state expired


def test_rocksdb_gives_the_same_output_as_the_heap(
    spark: SparkSession, tmp_path: Path, heap_output: list[tuple[int, str, int]]
) -> None:
    assert _stream_scenario(spark, tmp_path, "rocksdb") == heap_output


class CountPerId(KeyedProcessFunction[int, Row, Row]):
    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int]("count"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.count.update((self.count.value() or 0) + 1)
        out.collect({"id": value["id"], "n": self.count.value()})


def _count_query(spark: SparkSession, tmp: Path, name: str, state: Path) -> Any:
    """A streaming count per id (rate source, 3 ids) writing parquet under ``tmp/name``."""
    stream = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    stream = stream.selectExpr("value % 3 as id")
    out = keyed_process(stream, CountPerId(), key="id", output_schema="id long, n long",
                        checkpoint_location=str(state), num_partitions=2)  # fmt: skip
    return (
        out.writeStream.format("parquet").queryName(name)
        .option("path", str(tmp / name / "out"))
        .option("checkpointLocation", str(tmp / name / "spark"))
        .trigger(processingTime="1 second").start()
    )  # fmt: skip


def _counts(spark: SparkSession, tmp: Path, name: str) -> list[tuple[int, int]]:
    """(id, n) rows the query wrote so far."""
    if not (tmp / name / "out" / "_spark_metadata").exists():
        return []
    out = spark.read.schema("id long, n long").parquet(str(tmp / name / "out"))
    return [(r.id, r.n) for r in out.collect()]


@pytest.mark.timeout(180)
def test_two_streaming_queries_on_one_location_and_uid_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = _count_query(spark, tmp_path, "counts_one", state)
    try:
        while not _counts(spark, tmp_path, "counts_one"):  # a micro-batch has counted
            first.awaitTermination(0.5)
        with pytest.raises(ConfigurationError) as info:
            _count_query(spark, tmp_path, "counts_two", state)
        message = str(info.value)
        assert f"checkpoint_location {str(state)!r}" in message
        assert "uid 'keyed-process-" in message and "counts_one" in message
        assert "distinct uid=" in message
    finally:
        first.stop()
    # the same query restarted (its Spark checkpoint, so its query id) runs on, its counts
    # going on from where it stopped
    before = _counts(spark, tmp_path, "counts_one")
    again = _count_query(spark, tmp_path, "counts_one", state)
    try:
        while len(_counts(spark, tmp_path, "counts_one")) == len(before):
            again.awaitTermination(0.5)
    finally:
        again.stop()
    rows = _counts(spark, tmp_path, "counts_one")
    for i in range(3):  # per id, the counts run 1, 2, 3, ... across the restart, none twice
        counts = sorted(n for id_, n in rows if id_ == i)
        assert counts == list(range(1, len(counts) + 1))


def test_max_parallelism_is_checked_on_the_driver(spark: SparkSession) -> None:
    """``max_parallelism=True`` is not 1, and more shuffle partitions than key groups is
    refused when the DataFrame is built, naming spark.sql.shuffle.partitions."""
    df = spark.range(10).selectExpr("id % 3 as id")
    with pytest.raises(ConfigurationError, match=r"max_parallelism must be an int.*got True"):
        keyed_process(df, CountPerId(), key="id", output_schema="id long, n long",
                      max_parallelism=True)  # type: ignore[arg-type]  # fmt: skip
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    try:
        with pytest.raises(ConfigurationError, match=r"spark.sql.shuffle.partitions is 8, "
                           r"more partitions than max_parallelism=4"):  # fmt: skip
            keyed_process(df, CountPerId(), key="id", output_schema="id long, n long",
                          max_parallelism=4)  # fmt: skip
        out = keyed_process(df, CountPerId(), key="id", output_schema="id long, n long",
                            max_parallelism=4, num_partitions=2)  # fmt: skip
        assert out.count() == 10
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
