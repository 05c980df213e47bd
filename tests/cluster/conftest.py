"""The real Spark standalone cluster of the cluster tests, one per test session: a master
and two workers of one core each, on 127.0.0.2 and .3, started with ``spark-class`` from
the pyspark package; and the project as docs/quickstart.md ships it (``--py-files``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from tests.helpers import with_jvm_options

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")  # fmt: skip
    for name in ("SPARK_MASTER", "MASTER", "PYSPARK_SUBMIT_ARGS"):
        env.pop(name, None)
    return with_jvm_options(env)


def _start(
    args: list[str], log: Path, host: str = "127.0.0.1", env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
            stderr=subprocess.STDOUT, env={**_env(), "SPARK_LOCAL_IP": host, **(env or {})},
            start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


WORKERS = 2


class _Cluster:
    """The running master and workers (a test may kill a worker: :meth:`kill_worker`)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port, self.ui = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.work = tmp / "work"
        self.master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                              "--port", str(self.port), "--webui-port", str(self.ui)],
                             tmp / "master.log")  # fmt: skip
        self.workers = [self._worker(i) for i in range(WORKERS)]

    def _worker(self, i: int) -> subprocess.Popen[bytes]:
        # a host each (127.0.0.2, .3: loopback too), as machines of a cluster have:
        # Spark never runs a speculative copy on the host of the attempt it copies
        host = f"127.0.0.{2 + i}"
        args = ["org.apache.spark.deploy.worker.Worker", self.url, "--host", host,
                "--cores", "1", "--memory", "1g", "--webui-port", "0",
                "--work-dir", str(self.work / f"w{i}")]  # fmt: skip
        # and a local disk each: the local copies of checkpoint files its executors write
        # (asyncio_ops._storage._local_copies) and the databases they park (_runtime._parked) are
        # not the other host's
        copies = {"ASYNCIO_OPS_LOCAL_COPIES": str(self.tmp / f"local-copies-w{i}"),
                  "ASYNCIO_OPS_PARKED": str(self.tmp / f"parked-w{i}")}  # fmt: skip
        return _start(args, self.tmp / f"worker{i}.log", host, copies)

    def wait_for_workers(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                url = f"http://127.0.0.1:{self.ui}/json/"
                with urllib.request.urlopen(url, timeout=5) as r:
                    if json.load(r).get("aliveworkers", 0) >= WORKERS:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.master.poll() is not None:
                logs = (self.tmp / "master.log").read_text()[-2000:]
                pytest.fail(f"the workers did not register with the master:\n{logs}")
            time.sleep(0.5)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` with its executors and their Python workers (one process
        group): the machine is gone."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(timeout=20)

    def restart_lost_workers(self) -> None:
        """Start again each worker that was killed, and wait until all have registered."""
        for i, worker in enumerate(self.workers):
            if worker.poll() is not None:
                self.workers[i] = self._worker(i)
        self.wait_for_workers()

    def stop(self) -> None:
        for worker in self.workers:
            _stop(worker)
        _stop(self.master)


@pytest.fixture(scope="session")
def running_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cluster]:
    """The session's master and two workers of one core each, started (not yet waited
    for: ``cluster`` waits)."""
    running = _Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def cluster(running_cluster: _Cluster) -> tuple[str, Path]:
    """``(master URL, the directory of the workers' work directories)`` of the running
    master with two workers of one core each: a worker a test before killed
    (:meth:`_Cluster.kill_worker`) is started again first, and both have registered."""
    running_cluster.restart_lost_workers()
    return running_cluster.url, running_cluster.work


@pytest.fixture(scope="session")
def shipped_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project as docs/quickstart.md ships it: a wheel, renamed .zip for --py-files."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)],
        check=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("asyncio_ops-*.whl")
    target = dist / "asyncio_ops.zip"
    shutil.copy(wheel, target)
    return target
