"""session()'s master: one chosen elsewhere (spark-submit, an active session, the
environment, conf) wins; session() only fills in what is missing."""

from __future__ import annotations

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
