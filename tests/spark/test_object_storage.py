"""Checkpoints on an S3-compatible server (moto's, started by the tests on 127.0.0.1).

Object stores keep no modification time for directories: the order of batch runs
comes from their names (the application's start, then the execution id), so that
retention keeps the newest runs and a function's state comes from the newest run.

Every checkpoint path has its S3 twin here (the local-disk tests are named in each):
the replay log under a task retry, streaming carry-over across a restart, the
function's own state, and ``keyed_process`` state. Each checks the output (every row
once), that the files went to S3 (PUTs under the operator's uid in the server's
log) and that nothing of the location went to local disk.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import BatchStatistics, LookupCache
from asyncio_ops.connectors._base import BaseLookup
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import Kind
from asyncio_ops.spark import ordered_wait
from tests.conftest import S3Server

pytestmark = pytest.mark.spark


class Double(AsyncFunction[dict[str, Any], dict[str, Any]]):
    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{"twice": row["id"] * 2}]


def test_retention_on_s3_keeps_the_newest_runs_in_the_order_they_ran(
    spark: SparkSession, s3_server: S3Server
) -> None:
    location = s3_server("retention")
    storage = CheckpointStorage(location, "doubles")

    def build() -> Any:
        return ordered_wait(
            spark.range(0, 20, numPartitions=2), Double(), timeout=10, uid="doubles",
            output_schema="twice long", checkpoint_location=location, retain_versions=3,
        )  # fmt: skip

    ran: list[str] = []
    reused = build()
    for action in range(6):  # new DataFrames and a DataFrame run again
        df = reused if action % 2 else build()
        assert sorted(r.twice for r in df.collect()) == [2 * i for i in range(20)]
        new = [r for r in storage.runs() if r not in ran]
        assert len(new) == 1, new
        ran.append(new[0])
    assert storage.runs() == ran[-3:]  # the three newest, oldest first


def test_runs_sort_by_the_sequence_in_their_names_not_by_time() -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        storage = CheckpointStorage(tmp, "op")
        names = [
            "1700000000000-e0000000009-ffff",  # an earlier application: older
            "1800000000000-e0000000002-aaaa",
            "1800000000000-e0000000010-0000",  # execution 10 after 2, whatever the token
        ]
        for name in reversed(names):  # created newest first: mtimes say the opposite
            storage.write(name, "fnstate-p0.ckpt", Kind.REPLAY_LOG, pa.table({"x": [1]}))
        (Path(tmp) / "op" / "run-legacytoken-e5").mkdir()  # a name without the sequence
        assert storage.runs() == ["legacytoken-e5", *names]


def test_a_checkpoint_file_on_s3_is_one_upload_under_its_final_name(s3_server: S3Server) -> None:
    storage = CheckpointStorage(s3_server("uploads"), "op")
    s3_server.requests.clear()
    storage.write(3, "kg-p00000.ckpt", Kind.REPLAY_LOG, pa.table({"x": list(range(1000))}))
    # one PUT of the final key: no multipart upload's three requests, no temporary
    # name, no copy, no delete, no directory marker
    assert len(s3_server.requests) == 1, s3_server.requests
    assert s3_server.requests[0].startswith("PUT "), s3_server.requests
    assert all("/aops-tests/uploads/op/v0000000003/kg-p00000.ckpt" in r
               for r in s3_server.requests), s3_server.requests  # fmt: skip
    table = storage.read(3, "kg-p00000.ckpt", Kind.REPLAY_LOG)
    assert table.column("x").to_pylist() == list(range(1000))
    assert storage.list_files(3) == ["kg-p00000.ckpt"]
    assert storage.versions() == [3]


def test_a_write_into_a_missing_bucket_is_an_error_naming_the_file(s3_server: S3Server) -> None:
    """Writes open at close on S3 (one PUT): a bucket that is gone still fails the write,
    naming the file."""
    from asyncio_ops import CheckpointError

    location = s3_server("x").replace("@aops-tests/", "@no-such-bucket/")
    storage = CheckpointStorage(location, "op")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint file .*kg-p00000\.ckpt"):
        storage.write(1, "kg-p00000.ckpt", Kind.REPLAY_LOG, pa.table({"x": [1]}))


def test_credentials_in_a_location_never_reach_a_message(s3_server: S3Server) -> None:
    from asyncio_ops import CheckpointError
    from asyncio_ops._storage._checkpoint_storage import shown_location

    secret = "wJalr-THE-SECRET"
    location = s3_server("x").replace("testing:testing@aops-tests", f"AKID:{secret}@no-bucket")
    with pytest.raises(CheckpointError) as caught:
        CheckpointStorage(location, "op").check_writable()  # no such bucket
    assert secret not in str(caught.value) and "no-bucket" in str(caught.value)
    storage = CheckpointStorage(f"{location}&session_token=TOKEN-{secret}", "op")
    described = storage.describe(storage.path(4, "subtask-00000.ckpt"))
    assert described == "s3://no-bucket/x/op/v0000000004/subtask-00000.ckpt"
    shown = shown_location(f"s3://id:{secret}@b/p?secret_key={secret}&region=eu-west-1")
    assert shown == "s3://b/p?region=eu-west-1"


def test_endpoint_region_and_credentials_can_come_from_the_environment(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what an executor gets from spark.executorEnv.AWS_* (or an instance role): the
    # location itself holds no secret and no endpoint
    endpoint = s3_server.options.split("&")[0].removeprefix("endpoint_override=")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{endpoint}")
    storage = CheckpointStorage("s3://aops-tests/from-env", "op")
    storage.check_writable()
    storage.write(0, "fnstate-p0.ckpt", Kind.REPLAY_LOG, pa.table({"x": [7]}))
    assert storage.read(0, "fnstate-p0.ckpt", Kind.REPLAY_LOG).column("x").to_pylist() == [7]


def test_streaming_keyed_state_lives_on_s3_across_restarts_and_rescaling(
    spark: SparkSession, s3_server: S3Server, tmp_path: Path
) -> None:
    from asyncio_ops.spark import keyed_process
    from tests.spark.test_keyed_process import RunningCount, _write

    location = s3_server("keyed")

    def run(partitions: int) -> None:
        stream = (
            spark.readStream.schema("event long, user string, ts double")
            .option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        )  # fmt: skip
        out = keyed_process(
            stream, RunningCount(), key="user", event_time="ts", uid="counts",
            output_schema="event long, user string, n long, ok boolean",
            checkpoint_location=location, num_partitions=partitions,
        )  # fmt: skip
        query = (
            out.writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "spark"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(180)
        assert query.exception() is None

    (tmp_path / "in").mkdir()
    users = ["a", "b", "c"]
    for f in range(2):
        _write(tmp_path / "in", f"a-{f}.json", [(f * 10 + i, u, f * 10.0 + i)
                                                for i, u in enumerate(users)])  # fmt: skip
    run(2)
    _write(tmp_path / "in", "b-0.json", [(100 + i, u, 30.0) for i, u in enumerate(users)])
    s3_server.requests.clear()
    run(3)  # restarted at another number of partitions: state follows its key groups
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted((r.event, r.user, r.n) for r in rows) == [
        (0, "a", 1), (1, "b", 1), (2, "c", 1), (10, "a", 2), (11, "b", 2), (12, "c", 2),
        (100, "a", 3), (101, "b", 3), (102, "c", 3),
    ]  # fmt: skip
    assert all(r.ok for r in rows)
    # one small micro-batch at 3 partitions, read and written on S3 (the count is
    # reported by bench.object_storage; here it only has to be small and bounded)
    keyed = [r for r in s3_server.requests if "/aops-tests/keyed/" in r]
    assert 0 < len(keyed) <= 3 * 40, keyed


# -- every checkpoint path on S3 --------------------------------------------------------


@pytest.fixture(scope="module")
def worker_dirs(spark: SparkSession) -> set[Path]:
    """The working directories of the driver and of Spark's Python workers."""
    import os

    cwds = spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getcwd()).collect()
    return {Path.cwd(), *map(Path, cwds)}


def _on_s3_only(requests: list[str], path: str, uid: str, local: list[Path]) -> list[str]:
    """The PUTs of operator ``uid`` under ``path`` in ``requests`` (there are some); no
    checkpoint file under ``local`` (the test's own directories) and no ``s3:``
    directory where a location pyarrow could not open would have gone (a local path
    ``s3:/...`` in the working directory of the driver or a worker)."""
    puts = [r for r in requests
            if r.startswith("PUT ") and f"/aops-tests/{path}/{uid}/" in r]  # fmt: skip
    assert puts, requests
    for d in local:
        assert not (d / "s3:").exists(), d
        assert not [str(f) for f in d.rglob("*") if f.name.endswith(".ckpt") or f.name == uid]
    return puts


def test_a_retried_task_replays_on_s3_what_its_killed_attempt_completed(
    spark: SparkSession, s3_server: S3Server, tmp_path: Path, worker_dirs: set[Path]
) -> None:
    """S3 twin of test_checkpoints.py::
    test_killed_worker_retry_does_not_repeat_completed_lookups:
    the dead attempt's replay log is on S3, and the retry reads it back from there."""
    from tests.cross_process import requests
    from tests.spark.conftest import arrow_batch_rows
    from tests.spark.test_checkpoints import RequestLog

    location, log = s3_server("replay"), tmp_path / "requests.txt"
    s3_server.requests.clear()
    with arrow_batch_rows(spark, 100):
        out = ordered_wait(
            spark.range(0, 2000, numPartitions=2), RequestLog(str(log), kill_at=1500),
            timeout=10, capacity=50, output_schema="double long", uid="replayed",
            checkpoint_location=location, checkpoint_flush_rows=50,
        )  # fmt: skip
        rows = out.collect()
    assert [(r.id, r.double) for r in rows] == [(i, 2 * i) for i in range(2000)]
    counts = requests(log)
    assert set(counts) == set(range(2000))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    assert repeated, "the first attempt really crashed and was retried"
    # without the replay log 1000..1500 would repeat: at most capacity + one flush do
    assert min(repeated) >= 1400 and len(repeated) <= 50 + 50, repeated
    (run,) = CheckpointStorage(location, "replayed").runs()
    puts = _on_s3_only(s3_server.requests, "replay", "replayed", [tmp_path, *worker_dirs])

    # partition 1's replay log: files of the killed attempt and of its retry, on S3 ...
    def attempts(method: str) -> set[str]:
        prefix = f"{method} /aops-tests/replay/replayed/run-{run}/results-p00001-"
        return {r.removeprefix(prefix).split("-")[0] for r in s3_server.requests
                if r.startswith(prefix)}  # fmt: skip

    assert len(attempts("PUT")) == 2, puts
    # ... and the retry read the killed attempt's back from there
    read = attempts("GET")
    assert len(read) == 1 and read < attempts("PUT"), s3_server.requests


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("key", "before", "after"), [(None, 2, 2), ("id", 2, 3)], ids=["unkeyed", "keyed-rescaled"]
)
def test_streaming_carry_over_on_s3_survives_a_restart_exactly_once(
    spark: SparkSession, s3_server: S3Server, tmp_path: Path, worker_dirs: set[Path],
    key: str | None, before: int, after: int,
) -> None:  # fmt: skip
    """S3 twin of test_checkpoints.py::
    test_streaming_carry_over_survives_a_restart_exactly_once:
    rows still in flight when a micro-batch ends (drain_timeout) are carried over in the
    checkpoint on S3, through a restart of the query (at another number of partitions)."""
    import os

    from asyncio_ops.spark import unordered_wait
    from tests.spark.test_checkpoints import SlowFirstTime, _write_files

    path = f"carry-{key or 'unkeyed'}"
    location = s3_server(path)
    src, sink, markers = tmp_path / "in", tmp_path / "out", tmp_path / "markers"
    for d in (src, markers):
        d.mkdir()
    fn = SlowFirstTime(str(markers), slow_below=60)

    def run_query(partitions: int) -> None:
        stream = (
            spark.readStream.schema("id long, ts double").option("maxFilesPerTrigger", 1)
            .json(str(src))
        )  # fmt: skip
        enriched = unordered_wait(
            stream, fn, timeout=120, capacity=100, output_schema="double long",
            event_time="ts", watermark_delay=5, checkpoint_location=location, uid="carried",
            drain_timeout=0.5, num_partitions=partitions, key=key,
        )  # fmt: skip
        query = (
            enriched.writeStream.format("parquet").option("path", str(sink))
            .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None

    s3_server.requests.clear()
    _write_files(src, 0, 2)  # ids 0..59: multiples of 7 hang once and are carried over
    run_query(before)
    ids_first = {r.id for r in spark.read.parquet(str(sink)).collect()}
    assert ids_first and len(ids_first) < 60  # some rows were still in flight at the end
    _write_files(src, 2, 2)  # the query restarts from its checkpoint on S3; nothing slow in it
    run_query(after)
    out = spark.read.parquet(str(sink)).collect()
    assert sorted(r.id for r in out) == list(range(120))  # every row exactly once
    assert all(r.double == 2 * r.id for r in out)
    assert len(os.listdir(markers)) == len(range(0, 60, 7))  # each slow row hung once
    _on_s3_only(s3_server.requests, path, "carried", [tmp_path, *worker_dirs])


class _NamesLookup(BaseLookup[object]):
    """A connector lookup (``BaseLookup``, with its ``LookupCache`` checkpointed as the
    function's own state) of a service that answers ``n-<key>``; every key it is asked
    for is logged (workers are other processes)."""

    def __init__(self, log: str, cache: LookupCache[Any]) -> None:
        super().__init__(cache=cache)
        self.log = log

    async def _open_runtime(self) -> object:
        return object()

    async def _close_runtime(self, runtime: object) -> None:
        return None

    def _runtime_batch_statistics(self, runtime: object) -> BatchStatistics:
        return BatchStatistics(0, 0, 0, 0, 0)

    async def _fetch(self, keys: Any) -> dict[Any, Any]:
        from tests.cross_process import log_request

        for k in keys:
            log_request(self.log, k)
        return {k: ({"name": f"n-{k}"},) for k in keys}

    def request_fields(self) -> tuple[str, ...]:
        return ("k",)

    async def lookup(self, row: Any) -> list[dict[str, Any]]:
        key = row["k"]
        (match,) = (await self._matches_of([key], self._fetch, 100))[key]
        return [{"name": match["name"]}]


def test_a_function_state_on_s3_warms_the_next_run(
    spark: SparkSession, s3_server: S3Server, tmp_path: Path, worker_dirs: set[Path]
) -> None:
    """S3 twin of tests/connectors/test_cache_in_spark.py::
    test_cache_is_checkpointed_and_warms_the_next_run (which needs Postgres) and of
    tests/runtime/test_runtime.py::test_function_state_is_checkpointed_and_offered_to_the_next_version:
    a connector's cache, written to S3 by one action, is restored from there into the
    new function of the next action (another DataFrame: another run)."""
    from pyspark.sql import functions as F

    from asyncio_ops.spark import AsyncMetrics
    from tests.cross_process import requests

    location, log = s3_server("fnstate"), tmp_path / "requests.txt"

    def run() -> dict[str, Any]:
        metrics = AsyncMetrics(spark)
        rows = ordered_wait(
            spark.range(0, 60, numPartitions=2).withColumn("k", F.col("id") % 20),
            _NamesLookup(str(log), LookupCache(ttl=600)), timeout=10, uid="names",
            output_schema="name string", checkpoint_location=location, metrics=metrics,
        ).collect()  # fmt: skip
        assert [(r.id, r.name) for r in rows] == [(i, f"n-{i % 20}") for i in range(60)]
        return metrics.summary()

    s3_server.requests.clear()
    first = run()
    assert first["cache_misses"] >= 20
    first_puts = _on_s3_only(s3_server.requests, "fnstate", "names", [tmp_path, *worker_dirs])
    assert [r for r in first_puts if "/fnstate-p" in r], first_puts  # the caches, on S3
    fetched = requests(log)
    s3_server.requests.clear()
    second = run()  # a new function on each worker, its cache read back from S3
    assert second["cache_misses"] == 0 and second["cache_hits"] == 60
    assert requests(log) == fetched  # the service was asked nothing more
    reads = [r for r in s3_server.requests if r.startswith("GET ") and "/fnstate-p" in r]
    assert reads, s3_server.requests
    _on_s3_only(s3_server.requests, "fnstate", "names", [tmp_path, *worker_dirs])


def _counting_function(opens: str) -> Any:
    """test_keyed_process.RunningCount, which also logs the worker (process id) that
    opened it for each partition (workers are other processes)."""
    import os

    from tests.spark.test_keyed_process import RunningCount

    class LogsWorkers(RunningCount):
        def open(self, runtime_context: Any) -> None:
            super().open(runtime_context)
            with open(opens, "a") as f:
                f.write(f"{os.getpid()} {runtime_context.index_of_this_subtask}\n")

    return LogsWorkers()


def _workers(opens: Path) -> list[set[str]]:
    """Per micro-batch, the (worker, partition) pairs of its tasks."""
    batches = opens.read_text().split("end of micro-batch\n")[:-1]
    return [set(b.splitlines()) for b in batches]


@pytest.mark.timeout(300)
def test_a_small_keyed_micro_batch_on_warm_workers_makes_a_bounded_number_of_s3_requests(
    spark: SparkSession, s3_server: S3Server, tmp_path: Path, worker_dirs: set[Path]
) -> None:
    """One running query, one DataFrame for all micro-batches, state on S3: a micro-batch
    whose partitions run on the workers that ran them in the micro-batch before (they
    kept the state warm) reads manifests only, never a key-group file.

    Which worker takes which task is Spark's choice: the query gets one file at a time
    until a micro-batch (after the first two) ran each partition on the worker of the
    micro-batch before (each time about one chance in two), and that micro-batch is
    measured."""
    from asyncio_ops.spark import keyed_process
    from tests.spark.test_keyed_process import _write

    location, src, opens = s3_server("warm"), tmp_path / "in", tmp_path / "opens.txt"
    src.mkdir()
    users = list("abcdef")
    stream = (
        spark.readStream.schema("event long, user string, ts double")
        .option("maxFilesPerTrigger", 1).json(str(src))
    )  # fmt: skip
    # Spark keeps one pool of Python workers per environment and hands out its idle
    # workers first in, first out: with a third idle worker in the session's pool, no
    # two micro-batches in a row would run on the same two workers. An environment
    # variable of the query's own (taken when the DataFrame is built) gives it a pool of
    # its own, of two workers.
    environment = spark.sparkContext.environment
    environment["AOPS_TESTS_WORKER_POOL"] = "warm-s3"
    try:
        out = keyed_process(
            stream, _counting_function(str(opens)), key="user", event_time="ts", uid="counts",
            output_schema="event long, user string, n long, ok boolean",
            checkpoint_location=location, num_partitions=2,
            retain_versions=50,  # more than the micro-batches below: no retention's reads
        )  # fmt: skip
    finally:
        del environment["AOPS_TESTS_WORKER_POOL"]
    rows: list[Any] = []
    logs: dict[int, list[str]] = {}

    def each(df: Any, batch_id: int) -> None:
        rows.extend(df.collect())
        # the requests since the micro-batch before ended (the server logs a request
        # before it answers: the tasks' requests are all in)
        logs[batch_id] = list(s3_server.requests)
        s3_server.requests.clear()
        with open(opens, "a") as f:
            f.write("end of micro-batch\n")

    s3_server.requests.clear()
    query = (
        out.writeStream.foreachBatch(each).option("checkpointLocation", str(tmp_path / "spark"))
        .start()
    )  # fmt: skip
    try:
        for batch in range(40):
            _write(src, f"f-{batch:02d}.json", [(batch * 10 + i, u, batch * 10.0 + i)
                                                for i, u in enumerate(users)])  # fmt: skip
            while batch not in logs:  # one micro-batch for this file (a trigger that
                query.processAllAvailable()  # listed before it was written may end a wait)
            assert sorted(logs) == list(range(batch + 1))
            workers = _workers(opens)
            if batch >= 2 and workers[batch] == workers[batch - 1]:
                break
        else:
            pytest.fail(f"no micro-batch ran on the workers of the one before: {workers}")
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted((r.event, r.user, r.n) for r in rows) == [
        (b * 10 + i, u, b + 1) for b in range(batch + 1) for i, u in enumerate(users)
    ]  # every event once, its user's count carried from micro-batch to micro-batch
    assert all(r.ok for r in rows)
    _on_s3_only([r for log in logs.values() for r in log], "warm", "counts",
                [tmp_path, *worker_dirs])  # fmt: skip

    warm = logs[batch]
    # Measured 12 requests (pyarrow 26, moto): per partition, the manifests of both
    # partitions of N - 1 (HEAD + GET each: 4; with event_time a partition reads every
    # partition's, for the highest watermark; without, partition 0's and its own), 1 PUT
    # of its key-group file and 1 of its manifest (allow_delayed_open): 6. (Once a query
    # has more than retain_versions versions, partition 0 also lists the versions and
    # the oldest retained one, and deletes what no chain names: counted by
    # tests/runtime/test_incremental_state.py. A partition on another machine than the
    # micro-batch before reads its key groups' chains, 2 requests per file.) Bound: 15,
    # room for a client retry; what proves the state was warm is the assertion after it.
    assert len(warm) <= 15, warm
    assert all("warm/counts/" in r for r in warm), warm  # nothing but this operator's
    assert not [r for r in warm if "/kg-" in r and not r.startswith("PUT ")], warm
    puts = [r.split(" ")[1] for r in warm if r.startswith("PUT ")]
    assert all(f"/warm/counts/v{batch:010d}/" in p for p in puts), puts
    names = sorted(
        re.sub(r"-[0-9a-f]{12}-from\d{10}\.ckpt$", "", p.rsplit("/", 1)[1]) for p in puts
    )
    assert names == ["kg-p00000", "kg-p00001", "subtask-00000.ckpt", "subtask-00001.ckpt"]
