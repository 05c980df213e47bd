"""The DataFrame API and the SQL functions (``register``, ``register_table``) through Spark
Connect (a local Connect server, in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import with_jvm_options

pytestmark = pytest.mark.spark


@pytest.mark.timeout(240)
def test_ordered_keyed_unordered_and_sql_functions_work_over_spark_connect() -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_job"],
        cwd=root, env=with_jvm_options(dict(os.environ)), capture_output=True, text=True,
        timeout=220, check=False,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["session"].startswith("pyspark.sql.connect")
    assert result["ordered_in_order"] and result["keyed_ids"] and result["keyed_values"]
    assert "Spark Connect" in result["metrics_error"]
    # a lookup registered as a SQL function from the Connect client, called in SQL
    assert result["sql_rows"] == 998 and result["sql_values"]
    assert "connect_strict(id bigint)" in result["sql_error"] and "999" in result["sql_error"]
    # a table function registered from the Connect client: zero to two rows per input row
    assert result["sql_table_values"] and result["sql_table_rows"] > 300
