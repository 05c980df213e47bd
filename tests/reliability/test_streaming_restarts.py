"""A streaming query killed mid-batch (SIGKILL, JVM and workers included) and restarted
from its checkpoint, twice in a row (the second run restores the first's checkpoint, the
last run the second's): the sink holds every row exactly once, and rows in flight at the
end of a micro-batch survive the restarts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.helpers import with_jvm_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS_PER_FILE = 40
# Each killed run commits one micro-batch, and at most a few more before the kill (the
# hanging rows hold every micro-batch for drain_timeout): after two, a few are left for the
# last run, which carries rows over between micro-batches too.
FILES = 8


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = with_jvm_options(dict(os.environ, PYTHONUNBUFFERED="1"))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.stream_job", *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip


def _commits(work: Path) -> int:
    commits = work / "spark" / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


@pytest.mark.timeout(420)
def test_killed_and_restarted_query_writes_each_row_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    src, sink, work, log = tmp_path / "in", tmp_path / "out", tmp_path / "work", tmp_path / "log"
    src.mkdir()
    first_mtime = int(time.time()) - FILES - 1
    for f in range(FILES):
        lines = [
            json.dumps({"id": f * ROWS_PER_FILE + j, "ts": float(f * ROWS_PER_FILE + j)})
            for j in range(ROWS_PER_FILE)
        ]
        path = src / f"part-{f:03d}.json"
        path.write_text("\n".join(lines))
        # Spark reads files in modification-time order (milliseconds; ties in any order):
        # a second apart, the last part is surely the last batch's file.
        os.utime(path, (first_mtime + f, first_mtime + f))
    rng = random.Random(2026)
    args = [str(src), str(sink), str(work)]

    kills = 0
    for _ in range(2):
        before = _commits(work)
        proc = _start([*args, "forever"], log)
        deadline = time.monotonic() + 180  # a JVM's start on a loaded machine
        while _commits(work) <= before and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)  # wait until this run commits a batch: it is mid-stream now
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(rng.uniform(0.05, 0.6))  # ... and land the kill inside a later batch
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        kills += 1
    assert kills == 2 and _commits(work) < FILES  # we really stopped mid-stream

    final = _start([*args, "available-now"], log)
    assert final.wait(180) == 0, log.read_text()[-3000:]

    rows = spark.read.parquet(str(sink)).collect()
    counts = Counter(r.id for r in rows)
    expected = FILES * ROWS_PER_FILE
    slow = [i for i in range(expected) if i % 11 == 0]
    # rows still in flight at the end of the very last batch stay carried over, to be
    # emitted by the next batch; every other row is in the sink exactly once
    last_file_slow = {i for i in slow if i >= expected - ROWS_PER_FILE}
    missing = set(range(expected)) - set(counts)
    assert missing <= last_file_slow
    assert not [i for i, n in counts.items() if n > 1]
    assert all(r.v == r.id * 7 for r in rows)
    # rows carried over by earlier batches (some across a kill) all reached the sink
    assert {i for i in slow if i not in last_file_slow} <= set(counts)
