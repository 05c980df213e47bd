"""session()'s master: one chosen elsewhere (spark-submit, an active session, the
environment, conf) wins; session() only fills in what is missing. Its conf leaves
the UI to Spark (on by default)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncio_ops.spark._session import DEFAULT_MASTER, resolve_master


@pytest.mark.parametrize(
    ("master", "conf", "environ", "active", "expected"),
    [
        ("local[2]", None, {"PYSPARK_GATEWAY_PORT": "1"}, True, "local[2]"),  # given: wins
        (None, {"spark.master": "spark://h:7077"}, {}, False, None),  # conf: Spark applies it
        (None, None, {"PYSPARK_GATEWAY_PORT": "4041"}, False, None),  # spark-submit --master
        (None, None, {"MASTER": "local[3]"}, True, None),  # the active session's
        (None, None, {"SPARK_MASTER": "spark://h:7077", "MASTER": "local[1]"}, False,
         "spark://h:7077"),
        (None, None, {"MASTER": "yarn"}, False, "yarn"),
        (None, None, {}, False, DEFAULT_MASTER),
    ],
)  # fmt: skip
def test_a_master_chosen_elsewhere_wins(
    master: str | None,
    conf: dict[str, str] | None,
    environ: dict[str, str],
    active: bool,
    expected: str | None,
) -> None:
    assert resolve_master(master, conf, environ, active) == expected


class _Builder:
    """Records what session() asks of SparkSession.builder; starts nothing."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def appName(self, name: str) -> _Builder:
        self.conf["spark.app.name"] = name
        return self

    def master(self, master: str) -> _Builder:
        self.conf["spark.master"] = master
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> dict[str, str]:
        return self.conf


class _FakeSparkSession:
    builder = _Builder()

    @staticmethod
    def getActiveSession() -> None:
        return None


def test_session_leaves_the_ui_to_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The UI (progress, stages, task times) stays as Spark has it: on, also under spark-submit."""
    from asyncio_ops.spark import _session

    for environ in ({}, {"PYSPARK_GATEWAY_PORT": "4041"}):  # plain python, spark-submit
        for k in ("PYSPARK_GATEWAY_PORT", "SPARK_MASTER", "MASTER"):
            monkeypatch.delenv(k, raising=False)
        for k, v in environ.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(_FakeSparkSession, "builder", _Builder())
        monkeypatch.setattr(_session, "SparkSession", _FakeSparkSession)
        conf: Any = _session.session(app_name="app")
        assert conf["spark.app.name"] == "app"  # the fake saw session()'s whole conf
        assert "spark.ui.enabled" not in conf, conf
        assert not any(k.startswith("spark.ui.") for k in conf), conf
        given: Any = _session.session(conf={"spark.ui.enabled": "false"})
        assert given["spark.ui.enabled"] == "false"  # the caller's choice still wins


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_killed_worker_is_retried_under_the_default_master(tmp_path: Path) -> None:
    """session()'s default master retries a task as a cluster does: a job whose Python
    worker is killed in a task's first attempt still writes every row (local[*] tried
    each task once, so the job failed)."""
    from tests.helpers import with_jvm_options

    env = with_jvm_options(dict(os.environ))
    for k in ("SPARK_MASTER", "MASTER", "PYSPARK_GATEWAY_PORT"):
        env.pop(k, None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.killed_worker_job", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=280,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["True", "20"], done.stdout
    assert (tmp_path / "7").exists()  # the worker was killed once
