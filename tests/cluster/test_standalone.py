"""A real Spark standalone cluster on 127.0.0.1: a master and two workers started with
``spark-class`` from the pyspark package, jobs submitted with ``spark-submit`` as
docs/quickstart.md says (the project shipped as a zip with ``--py-files``). An
enrichment job must run on the executors, import the shipped archive there, and give
exact output; a streaming ``keyed_process`` job with its state on S3 must give each
event once, with counts that continue, when an executor is killed mid-micro-batch and
when a whole worker is lost between micro-batches."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.cluster.conftest import ROOT, SPARK_HOME, _env
from tests.conftest import S3Server

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _write_events(
    source: Path, keys: list[str], batches: list[tuple[int, int]]
) -> list[tuple[str, int]]:
    """One JSON file per micro-batch of ``(start, n)`` events ``{"key", "seq"}`` (keys in
    turn, seq from ``start``); the events written."""
    source.mkdir()
    events: list[tuple[str, int]] = []
    for batch, (start, n) in enumerate(batches):
        lines = [(keys[i % len(keys)], start + i) for i in range(n)]
        events += lines
        body = "".join(json.dumps({"key": k, "seq": q}) + "\n" for k, q in lines)
        (source / f"part-{batch}.json").write_text(body)
    return events


def _assert_each_event_once_and_counts_continue(
    rows: list[dict[str, Any]], events: list[tuple[str, int]], keys: list[str]
) -> None:
    assert sorted(r["seq"] for r in rows) == sorted(q for _, q in events)  # each event once
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["key"], []).append(r["n"])
    expected = {k: sum(1 for key, _ in events if key == k) for k in keys}
    assert {k: sorted(ns) for k, ns in per_key.items()} == {
        k: list(range(1, c + 1)) for k, c in expected.items()
    }  # counts continue across micro-batches, kills and lost workers


def test_a_submitted_job_runs_on_the_executor_with_the_shipped_package(
    cluster: tuple[str, Path], shipped_zip: Path, tmp_path: Path
) -> None:
    url, work = cluster
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files",
         str(shipped_zip), "--conf", "spark.ui.enabled=false",
         str(ROOT / "tests" / "cluster" / "cluster_job.py"), str(out), "200"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["master"] == url  # session() kept spark-submit's master
    rows = result["rows"]
    assert [(r["id"], r["doubled"]) for r in rows] == [(i, 2 * i) for i in range(200)]
    assert all(Path(r["cwd"]).is_relative_to(work) for r in rows), rows[0]["cwd"]
    assert all("asyncio_ops.zip" in r["module"] for r in rows), rows[0]["module"]
    assert "is a local path, but the master" in result["refused"]
    assert f"file://{tmp_path / 'ckpt'}" in result["refused"]
    assert result["checkpointed_rows"] == 200
    assert list((tmp_path / "ckpt" / "shared").glob("run-*/results-*.ckpt"))


@pytest.mark.timeout(480)
def test_a_streaming_job_on_s3_gives_each_event_once_when_an_executor_is_killed(
    cluster: tuple[str, Path], shipped_zip: Path, s3_server: S3Server, tmp_path: Path
) -> None:
    """Three micro-batches of a running count per key, state on S3; in micro-batch 1 the
    function SIGKILLs its executor's JVM. The micro-batch runs again on the executors
    left (or a new one), which restore version 0 from S3: every event is counted once,
    and every key's counts are 1..n with nothing lost or repeated."""
    url, work = cluster
    source = tmp_path / "in"
    keys = [f"k{i}" for i in range(20)]
    events = _write_events(source, keys, [(0, 20), (1_000, 40), (2_000, 40)])
    out = tmp_path / "out.json"
    s3_server.requests.clear()
    run = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files",
         str(shipped_zip), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2",
         str(ROOT / "tests" / "cluster" / "stream_kill_job.py"), s3_server("cluster-kill"),
         str(source), str(tmp_path / "work"), str(out)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=420, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["killed"]
    rows = result["rows"]
    _assert_each_event_once_and_counts_continue(rows, events, keys)
    assert all(Path(r["executor"]).is_relative_to(work) for r in rows)
    assert any("/cluster-kill/counts/v" in r for r in s3_server.requests)  # state on S3


@pytest.mark.timeout(360)
def test_a_speculative_copy_on_s3_gives_each_row_once(
    cluster: tuple[str, Path], shipped_zip: Path, s3_server: S3Server, tmp_path: Path
) -> None:
    """With speculation on, a straggling partition's copy runs on the other executor
    and wins; the output holds every row once."""
    url, _ = cluster
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files",
         str(shipped_zip), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.speculation=true", "--conf", "spark.speculation.interval=100ms",
         "--conf", "spark.speculation.quantile=0.5", "--conf", "spark.speculation.multiplier=1.5",
         "--conf", "spark.speculation.minTaskRuntime=1s",
         str(ROOT / "tests" / "cluster" / "speculation_job.py"), s3_server("speculation"),
         str(tmp_path / "work"), str(out)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert sorted(r["doubled"] for r in result["rows"]) == [2 * i for i in range(400)]
    attempts = {tuple(map(int, line.split()[:2])) for line in result["log"].split("\n") if line}
    # a speculative copy of partition 0 ran (attempt 1; its first attempt, slow to start
    # or waiting on its lookups, was killed when the copy won)
    assert (0, 1) in attempts, sorted(attempts)


@pytest.mark.timeout(600)
def test_a_worker_lost_between_micro_batches_leaves_the_counts_exact(
    cluster: tuple[str, Path],
    shipped_zip: Path,
    s3_server: S3Server,
    tmp_path: Path,
    lose_a_worker: Callable[[int], None],
) -> None:
    """Three micro-batches of a running count per key, state on S3. After micro-batch 1
    the worker that ran (some of) it is SIGKILLed with its executor and Python workers,
    whose partitions' state was warm there: micro-batch 2 runs on the worker left, which
    reads from S3 what it never held. Every event is counted once and every key's counts
    are 1..n; micro-batch 2's rows all come from the worker left."""
    url, work = cluster
    source = tmp_path / "in"
    keys = [f"k{i}" for i in range(30)]
    events = _write_events(source, keys, [(0, 60), (1_000, 60), (2_000, 60)])
    job_work, out = tmp_path / "work", tmp_path / "out.json"
    log = (tmp_path / "submit.log").open("w")
    submit = subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files",
         str(shipped_zip), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2",
         str(ROOT / "tests" / "cluster" / "stream_lose_worker_job.py"),
         s3_server("cluster-lose"), str(source), str(job_work), str(out)],
        cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (job_work / "markers" / "batch-1-written").exists():
            assert submit.poll() is None, (tmp_path / "submit.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "micro-batch 1 did not finish"
            time.sleep(0.2)
        ran = pq.read_table(job_work / "out" / "batch=1").column("executor").to_pylist()
        workers = sorted({Path(e).relative_to(work).parts[0] for e in ran})  # w0, w1
        lost = int(workers[0][1:])
        lose_a_worker(lost)
        (job_work / "markers" / "worker-lost").touch()
        assert submit.wait(timeout=300) == 0, (tmp_path / "submit.log").read_text()[-4000:]
    finally:
        if submit.poll() is None:
            submit.kill()
        log.close()
    rows = json.loads(out.read_text())["rows"]
    _assert_each_event_once_and_counts_continue(rows, events, keys)
    after = {Path(r["executor"]).relative_to(work).parts[0] for r in rows if r["batch"] == 2}
    assert after and f"w{lost}" not in after, after  # micro-batch 2 ran on the worker left
    assert any("/cluster-lose/counts/v" in r for r in s3_server.requests)  # state on S3
    # the worker left read the lost partition's chains from S3: the local copies of its
    # key-group files were on the lost host's disk
    assert any(r.startswith("GET ") and "/cluster-lose/counts/v" in r and "/kg-p" in r
               for r in s3_server.requests), s3_server.requests  # fmt: skip
