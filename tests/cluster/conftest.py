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
    return env


def _start(args: list[str], log: Path, host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
            stderr=subprocess.STDOUT, env={**_env(), "SPARK_LOCAL_IP": host},
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


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(master URL, the directory of the workers' work directories)`` of a running
    master with two workers of one core each."""
    tmp = tmp_path_factory.mktemp("cluster")
    port, ui = _free_port(), _free_port()
    master = _start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(port), "--webui-port", str(ui)], tmp / "master.log")  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    work = tmp / "work"
    workers = []
    for i in range(WORKERS):
        # a host each (127.0.0.2, .3: loopback too), as machines of a cluster have:
        # Spark never runs a speculative copy on the host of the attempt it copies
        host = f"127.0.0.{2 + i}"
        args = ["org.apache.spark.deploy.worker.Worker", url, "--host", host,
                "--cores", "1", "--memory", "1g", "--webui-port", "0",
                "--work-dir", str(work / f"w{i}")]  # fmt: skip
        workers.append(_start(args, tmp / f"worker{i}.log", host))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    if json.load(r).get("aliveworkers", 0) >= WORKERS:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or master.poll() is not None:
                logs = (tmp / "master.log").read_text()[-2000:]
                pytest.fail(f"the workers did not register with the master:\n{logs}")
            time.sleep(0.5)
        yield url, work
    finally:
        for worker in workers:
            _stop(worker)
        _stop(master)


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


