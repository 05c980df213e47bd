"""Fixtures for the example tests: a real PostgreSQL, and runners for the example scripts.

Each example script runs at least once as a subprocess, exactly as a user runs it
(``python examples/NAME.py ...``), from a temporary working directory, with
small sizes. Further runs of a script with other options call its ``main(argv)``
in this process, on the test session's SparkSession (``spark_in_process``): the
script finds that session running, uses it and leaves it running. Postgres comes
from ``ASYNCIO_OPS_PG_DSN`` (default: trust auth on 127.0.0.1:5432, database
``test``); when it cannot be reached the Postgres tests are skipped with the
reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from examples import _pg
from examples._common import JSON_MARKER
from tests.helpers import unavailable, with_jvm_options
from tests.spark.conftest import spark

__all__ = ["spark"]

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """A reachable DSN, or skip (fail under CI=true)."""
    dsn = os.environ.get(_pg.DSN_ENV, DEFAULT_DSN)
    try:
        _pg.run(_pg.probe(dsn))
    except Exception as exc:  # any failure to connect means "no Postgres here"
        unavailable(
            f"PostgreSQL not reachable ({type(exc).__name__}); set {_pg.DSN_ENV} or start "
            "one (docker compose up -d)"
        )
    return dsn


@pytest.fixture
def customers_table(pg_dsn: str) -> Iterator[str]:
    """A unique table name for one test (the test seeds it); dropped afterwards."""
    name = f"aops_example_customers_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        _pg.run(_pg.drop(pg_dsn, name))


@dataclass(frozen=True)
class Run:
    """A finished example run: exit code, output, and the ``RESULT`` document if printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith(JSON_MARKER)]
        assert len(lines) == 1, f"expected one RESULT line:\n{self.describe()}"
        return json.loads(lines[0][len(JSON_MARKER) :])  # type: ignore[no-any-return]

    def describe(self) -> str:
        return (
            f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr[-4000:]}"
        )


@pytest.fixture
def run_example(tmp_path: Path) -> Any:
    """``run_example("enrich_orders_postgres.py", "--orders", "10", env={...})`` -> :class:`Run`."""

    def run(
        script: str, *args: str, env: dict[str, str | None] | None = None, timeout: float = 100
    ) -> Run:
        environ = dict(os.environ)
        for k, v in (env or {}).items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / script), *args],
            cwd=tmp_path,
            env=with_jvm_options(environ),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    return run


@dataclass(frozen=True)
class InProcessRun:
    """A finished in-process run: what ``main(argv)`` returned and what it printed."""

    result: dict[str, Any]
    stdout: str


@pytest.fixture
def spark_in_process(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> Callable[..., InProcessRun]:
    """``spark_in_process(enrich_http.main, "--batch", ...)`` -> :class:`InProcessRun`:
    the script's ``main`` on the test session's SparkSession, which it must leave
    running; the runtime settings it set on that session are put back afterwards."""

    def run(main: Callable[[list[str]], dict[str, Any]], *args: str) -> InProcessRun:
        before = dict(spark.conf.getAll)
        capsys.readouterr()
        try:
            result = main(list(args))
        finally:
            after = dict(spark.conf.getAll)
            for key in after.keys() - before.keys():
                spark.conf.unset(key)
            for key, value in before.items():
                if after.get(key) != value:
                    spark.conf.set(key, value)
        assert spark.range(3).count() == 3, "the script stopped the session"
        # the types a program reads from the RESULT line, as in a subprocess run
        return InProcessRun(json.loads(json.dumps(result, default=str)), capsys.readouterr().out)

    return run
