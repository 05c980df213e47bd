"""A real Spark standalone cluster on 127.0.0.1: a master and two workers started with
``spark-class`` from the pyspark package, jobs submitted with ``spark-submit`` as
docs/quickstart.md says (the project shipped as a zip with ``--py-files``). An
enrichment job must run on the executors, import the shipped archive there, and give
exact output; a streaming ``keyed_process`` job with its state on S3 must give each
event once, with counts that continue, when an executor is killed mid-micro-batch and
when a whole worker is lost between micro-batches. These three jobs run in turn in one
application (``submitted``), each test checking its own job's output."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.cluster.conftest import ROOT, SPARK_HOME, _Cluster, _env
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


# First in the file: the application below loses a worker, which the next test to use the
# cluster would have to start again first.
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


@dataclass
class Submitted:
    """One application of cluster_job.py running its own job, then stream_kill_job.py's
    and stream_lose_worker_job.py's (each job's output in its own file), and what the
    test saw of it."""

    url: str  # the master
    work: Path  # the workers' work directories
    tmp: Path
    events: dict[str, list[tuple[str, int]]]  # the input written for each streaming job
    keys: dict[str, list[str]]
    lost: int | None  # the worker killed after the lose-worker job's micro-batch 1
    requests: list[str]  # the S3 server's, during the application
    log: str  # spark-submit's output

    def output(self, name: str) -> dict[str, Any]:
        path = self.tmp / f"{name}.json"
        assert path.exists(), f"{name}.json was not written:\n{self.log[-4000:]}"
        result: dict[str, Any] = json.loads(path.read_text())
        assert "error" not in result, result["error"]
        return result


@pytest.fixture(scope="module")
def submitted(
    running_cluster: _Cluster,
    shipped_zip: Path,
    s3_server: S3Server,
    tmp_path_factory: pytest.TempPathFactory,
) -> Submitted:
    """The three jobs in one application (an application's driver, executors and their
    Python workers take tens of seconds to start on two cores): the enrichment job; three
    micro-batches of a running count per key with its state on S3, whose function SIGKILLs
    its executor's JVM in micro-batch 1; and three more whose worker that ran (some of)
    micro-batch 1 is SIGKILLed here, with its executor and Python workers, before
    micro-batch 2. A worker a test before killed is started again first."""
    running_cluster.restart_lost_workers()
    url, work = running_cluster.url, running_cluster.work
    tmp = tmp_path_factory.mktemp("standalone")
    keys = {"kill": [f"k{i}" for i in range(20)], "lose": [f"k{i}" for i in range(30)]}
    events = {
        "kill": _write_events(tmp / "in-kill", keys["kill"], [(0, 20), (1_000, 40), (2_000, 40)]),
        "lose": _write_events(tmp / "in-lose", keys["lose"], [(0, 60), (1_000, 60), (2_000, 60)]),
    }
    lose_work = tmp / "work-lose"
    s3_server.requests.clear()
    log_path = tmp / "submit.log"
    lost = None
    with log_path.open("w") as log:
        submit = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files",
             str(shipped_zip), "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2",
             str(ROOT / "tests" / "cluster" / "cluster_job.py"), str(tmp / "enrich.json"), "200",
             s3_server("cluster-kill"), str(tmp / "in-kill"), str(tmp / "work-kill"),
             str(tmp / "kill.json"),
             s3_server("cluster-lose"), str(tmp / "in-lose"), str(lose_work),
             str(tmp / "lose.json")],
            cwd=tmp, env=_env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 420
            while not (lose_work / "markers" / "batch-1-written").exists():
                if submit.poll() is not None or time.monotonic() > deadline:
                    break  # the lose-worker test fails on its output; the others need not
                time.sleep(0.2)
            else:
                ran = pq.read_table(lose_work / "out" / "batch=1").column("executor").to_pylist()
                workers = sorted({Path(e).relative_to(work).parts[0] for e in ran})  # w0, w1
                lost = int(workers[0][1:])
                running_cluster.kill_worker(lost)
                (lose_work / "markers" / "worker-lost").touch()
            submit.wait(timeout=300)
        finally:
            if submit.poll() is None:
                submit.kill()
                submit.wait(timeout=30)
    return Submitted(url, work, tmp, events, keys, lost, list(s3_server.requests),
                     log_path.read_text())  # fmt: skip


@pytest.mark.timeout(900)
def test_a_submitted_job_runs_on_the_executor_with_the_shipped_package(
    submitted: Submitted,
) -> None:
    result = submitted.output("enrich")
    assert result["master"] == submitted.url  # session() kept spark-submit's master
    rows = result["rows"]
    assert [(r["id"], r["doubled"]) for r in rows] == [(i, 2 * i) for i in range(200)]
    assert all(Path(r["cwd"]).is_relative_to(submitted.work) for r in rows), rows[0]["cwd"]
    assert all("asyncio_ops.zip" in r["module"] for r in rows), rows[0]["module"]
    assert "is a local path, but the master" in result["refused"]
    assert f"file://{submitted.tmp / 'ckpt'}" in result["refused"]
    assert result["checkpointed_rows"] == 200
    assert list((submitted.tmp / "ckpt" / "shared").glob("run-*/results-*.ckpt"))


@pytest.mark.timeout(900)
def test_a_streaming_job_on_s3_gives_each_event_once_when_an_executor_is_killed(
    submitted: Submitted,
) -> None:
    """Three micro-batches of a running count per key, state on S3; in micro-batch 1 the
    function SIGKILLs its executor's JVM. The micro-batch runs again on the executors
    left (or a new one), which restore version 0 from S3: every event is counted once,
    and every key's counts are 1..n with nothing lost or repeated."""
    result = submitted.output("kill")
    assert result["killed"]
    rows = result["rows"]
    _assert_each_event_once_and_counts_continue(
        rows, submitted.events["kill"], submitted.keys["kill"]
    )
    assert all(Path(r["executor"]).is_relative_to(submitted.work) for r in rows)
    assert any("/cluster-kill/counts/v" in r for r in submitted.requests)  # state on S3


@pytest.mark.timeout(900)
def test_a_worker_lost_between_micro_batches_leaves_the_counts_exact(
    submitted: Submitted,
) -> None:
    """Three micro-batches of a running count per key, state on S3. After micro-batch 1
    the worker that ran (some of) it is SIGKILLed with its executor and Python workers,
    whose partitions' state was warm there: micro-batch 2 runs on the worker left, which
    reads from S3 what it never held. Every event is counted once and every key's counts
    are 1..n; micro-batch 2's rows all come from the worker left."""
    assert submitted.lost is not None, f"micro-batch 1 did not finish:\n{submitted.log[-4000:]}"
    rows = submitted.output("lose")["rows"]
    _assert_each_event_once_and_counts_continue(
        rows, submitted.events["lose"], submitted.keys["lose"]
    )
    work, requests = submitted.work, submitted.requests
    after = {Path(r["executor"]).relative_to(work).parts[0] for r in rows if r["batch"] == 2}
    assert after and f"w{submitted.lost}" not in after, after  # micro-batch 2 on the worker left
    assert any("/cluster-lose/counts/v" in r for r in requests)  # state on S3
    # the worker left read the lost partition's chains from S3: the local copies of its
    # key-group files were on the lost host's disk
    assert any(r.startswith("GET ") and "/cluster-lose/counts/v" in r and "/kg-p" in r
               for r in requests), requests  # fmt: skip
