"""The Postgres example against a real PostgreSQL: run as a user runs it, and with a given
DSN in this process (tests/examples/conftest.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest
from asyncio_ops.connectors.postgres.testing import ThrowawayPostgres, find_server_bin
from asyncio_ops.services.customers import customer

from examples import _pg, enrich_orders_postgres
from tests.helpers import with_jvm_options

from .conftest import Run, unavailable

INIT_SQL = Path(__file__).resolve().parents[2] / "examples" / "sql" / "init.sql"


def check_sample(result: dict[str, Any], n: int) -> None:
    sample = result["sample"]
    assert [r["order_id"] for r in sample] == list(range(n))
    for row in sample:
        expected = customer(row["customer_id"])
        assert (row["name"], row["tier"], row["country"]) == (
            expected["name"],
            expected["tier"],
            expected["country"],
        ), row


def test_init_sql_is_the_generated_seed() -> None:
    assert INIT_SQL.read_text() == _pg.init_sql_text(), (
        "examples/sql/init.sql differs from examples/_pg.py:init_sql_text(); regenerate it"
    )


@pytest.mark.postgres
def test_seeded_customers_equal_the_http_service_records(pg_dsn: str, customers_table: str) -> None:
    assert _pg.run(_pg.seed(pg_dsn, customers_table, 300)) == 300
    # Seeding again changes nothing (the example may be run twice on one table).
    assert _pg.run(_pg.seed(pg_dsn, customers_table, 300)) == 300

    async def fetch() -> list[dict[str, Any]]:
        connection = await asyncpg.connect(pg_dsn, timeout=10)
        try:
            rows = await connection.fetch(
                f"SELECT id, name, tier, country FROM {_pg.quote_ident(customers_table)} "
                "ORDER BY id"
            )
            return [dict(r) for r in rows]
        finally:
            await connection.close(timeout=5)

    rows = _pg.run(fetch())
    assert rows == [customer(i) for i in range(1, 301)]
    assert {r["tier"] for r in rows} == {"bronze", "silver", "gold", "platinum"}


@pytest.mark.spark
@pytest.mark.postgres
def test_enrich_orders_postgres_example(
    pg_dsn: str, customers_table: str, spark_in_process: Any
) -> None:
    """With a given DSN, in this process (the script's run as a user runs it is
    test_example_without_dsn_uses_a_throwaway_postgres's)."""
    run = spark_in_process(
        enrich_orders_postgres.main,
        "--dsn", pg_dsn, "--table", customers_table, "--seed",
        "--orders", "5000", "--customers", "1200", "--partitions", "2",
        "--capacity", "200", "--batch-size", "100", "--json",
    )  # fmt: skip
    result = run.result
    assert result["rows"] == 5000
    assert result["missing"] == 0
    assert result["mismatches"] == 0
    assert result["throwaway"] is False
    check_sample(result, 5)
    metrics = result["metrics"]
    assert metrics["emitted"] == 5000
    # rows, carried in chunks of batch_size * pool_size = 400 rows, cut from each
    # partition's Arrow batches (2,500 rows each: 7 chunks)
    assert metrics["received"] == metrics["completed"] == 5000
    assert metrics["chunks"] == 14
    assert metrics["failed"] == 0
    assert metrics["max_in_flight"] <= 200
    assert "sample (5 rows)" in run.stdout


@pytest.mark.postgres
def test_missing_table_is_a_clear_error(pg_dsn: str, run_example: Any) -> None:
    run = run_example(
        "enrich_orders_postgres.py", "--dsn", pg_dsn, "--table", "aops_no_such_table_x"
    )
    assert run.returncode != 0
    assert "does not exist" in run.stderr
    assert "docker compose up -d" in run.stderr
    assert "--seed" in run.stderr


def _server_bin() -> Path:
    found = find_server_bin()
    if found is None:
        unavailable("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib")
    assert found is not None
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.postgres
def test_throwaway_postgres_starts_seeds_and_cleans_up() -> None:
    server = ThrowawayPostgres(_server_bin())
    with server:
        directory = server.directory
        assert directory is not None and directory.exists()
        assert _pg.run(_pg.seed(server.dsn, "customers", 1000)) == 1000
        assert _port_open(server.port)
        port = server.port
    assert not directory.exists()
    assert not _port_open(port)
    server.stop()  # idempotent


@pytest.mark.spark
@pytest.mark.postgres
def test_the_demo_command_runs_from_a_clean_clone(tmp_path: Path) -> None:
    """The README's demo command, ``./demo``, from a clean clone of this checkout in a
    temporary directory, as a user runs it (small sizes), against the throwaway
    PostgreSQL it starts. Its environment is this test session's (a second run reuses
    the environment: the install a first run makes is what ``.ci/run``, the README's
    other command, does on every clean clone)."""
    import hashlib
    import os
    import subprocess
    import sys

    _server_bin()
    root = Path(__file__).resolve().parents[2]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
    venv = tmp_path / "venv"  # this session's interpreter, as scripts/setup.sh finds a venv
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "bin" / "activate").write_text(f'PATH="{Path(sys.executable).parent}:$PATH"\n')
    digest = hashlib.sha256((clone / "pyproject.toml").read_bytes()
                            + (clone / "setup.py").read_bytes()).hexdigest()[:16]  # fmt: skip
    (venv / ".asyncio_ops-install").write_text(f"{clone} {digest}\n")
    env = {k: v for k, v in os.environ.items() if k != _pg.DSN_ENV}
    env = with_jvm_options({**env, "ASYNCIO_OPS_VENV": str(venv)})
    done = subprocess.run(
        ["./demo", "--orders", "3000", "--customers", "500", "--json"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    run = Run(done.returncode, done.stdout, done.stderr)
    assert run.returncode == 0, run.describe()
    assert "== reusing" in run.stdout and "== running examples/enrich_orders_postgres.py" in (
        run.stdout
    )  # fmt: skip
    result = run.result
    assert result["throwaway"] is True
    assert result["rows"] == 3000 and result["missing"] == 0 and result["mismatches"] == 0
    check_sample(result, 5)
    assert "starting a throwaway PostgreSQL" in run.stdout
    port = int(result["dsn"].rsplit(":", 1)[1].split("/")[0])
    assert not _port_open(port), "the throwaway server outlived the example"
    # a Python below 3.11 is named before anything is installed
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.9.18"; exit 1\n')
    old.chmod(0o755)
    refused = subprocess.run(
        ["./demo"], cwd=clone, capture_output=True, text=True, timeout=60, check=False,
        env={**env, "PYTHON": str(old), "ASYNCIO_OPS_VENV": str(tmp_path / "new")},
    )  # fmt: skip
    assert refused.returncode == 1
    assert "needs Python 3.11 or newer" in refused.stderr and "Python 3.9.18" in refused.stderr
    assert not (tmp_path / "new").exists()
