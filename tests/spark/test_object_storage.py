"""Checkpoints on an S3-compatible server (moto's, started by the tests on 127.0.0.1).

Object stores keep no modification time for directories: the order of batch runs
comes from their names (the application's start, then the execution id), so that
retention keeps the newest runs and a function's state comes from the newest run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops._checkpoint import CheckpointStorage
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
            storage.write(name, "fnstate-p0.ckpt", pa.table({"x": [1]}))
        (Path(tmp) / "op" / "run-legacytoken-e5").mkdir()  # a name without the sequence
        assert storage.runs() == ["legacytoken-e5", *names]


def test_a_checkpoint_file_on_s3_is_one_upload_under_its_final_name(s3_server: S3Server) -> None:
    storage = CheckpointStorage(s3_server("uploads"), "op")
    s3_server.requests.clear()
    storage.write(3, "kg-p00000.ckpt", pa.table({"x": list(range(1000))}))
    # one PUT of the final key: no multipart upload's three requests, no temporary
    # name, no copy, no delete, no directory marker
    assert len(s3_server.requests) == 1, s3_server.requests
    assert s3_server.requests[0].startswith("PUT "), s3_server.requests
    assert all("/aops-tests/uploads/op/v0000000003/kg-p00000.ckpt" in r
               for r in s3_server.requests), s3_server.requests  # fmt: skip
    assert storage.read(3, "kg-p00000.ckpt").column("x").to_pylist() == list(range(1000))
    assert storage.list_files(3) == ["kg-p00000.ckpt"]
    assert storage.versions() == [3]


def test_a_write_into_a_missing_bucket_is_an_error_naming_the_file(s3_server: S3Server) -> None:
    """Writes open at close on S3 (one PUT): a bucket that is gone still fails the write,
    naming the file."""
    from asyncio_ops import CheckpointError

    location = s3_server("x").replace("@aops-tests/", "@no-such-bucket/")
    storage = CheckpointStorage(location, "op")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint file .*kg-p00000\.ckpt"):
        storage.write(1, "kg-p00000.ckpt", pa.table({"x": [1]}))


def test_credentials_in_a_location_never_reach_a_message(s3_server: S3Server) -> None:
    from asyncio_ops import CheckpointError
    from asyncio_ops._checkpoint import shown_location

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
    storage.write(0, "fnstate-p0.ckpt", pa.table({"x": [7]}))
    assert storage.read(0, "fnstate-p0.ckpt").column("x").to_pylist() == [7]


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
