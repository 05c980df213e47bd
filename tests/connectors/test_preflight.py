"""The driver's preflight: each connector checks what it can once, before any Spark job.

Against a real PostgreSQL and a real HTTP server: a wrong role, a closed port, a query
without the key column, an output column the query lacks, a key of another kind, a
missing table, an input without the key or a template field, an unreachable URL — each
raised on the driver by ``ordered_wait`` itself as the connectors' exception, naming the
DSN (without password), the column or the URL, while Spark's status tracker counts no
job; ``preflight=False`` skips the check.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import (
    LookupAuthError,
    LookupConnectionError,
    LookupKeyError,
    LookupQueryError,
)
from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops import (
    AsyncFunction,
    ConfigurationError,
    PreflightContext,
    SupportsPreflight,
)
from asyncio_ops.spark import AsyncDataStream, keyed_process, ordered_wait, unordered_wait
from asyncio_ops.state import KeyedProcessFunction
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]

pytestmark = [pytest.mark.spark]

CONTEXT = PreflightContext(
    input_schema=pa.schema([("customer_id", pa.int32()), ("region", pa.string())]),
    output_schema=pa.schema([("name", pa.string())]),
)


def _check(lookup: Any, context: PreflightContext = CONTEXT) -> None:
    asyncio.run(lookup.preflight(context))


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def _jobs(spark: SparkSession, name: str) -> Iterator[list[int]]:
    """The ids of the Spark jobs started inside the block, filled in when it ends."""
    context = spark.sparkContext
    group = f"preflight-{name}"
    context.setJobGroup(group, name)
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        jobs.extend(context.statusTracker().getJobIdsForGroup(group))


def _orders(spark: SparkSession) -> DataFrame:
    return spark.range(0, 6, numPartitions=1).select(
        (F.col("id") + 1).cast("int").alias("customer_id")
    )


# -- PostgresLookup ---------------------------------------------------------------------------
@pytest.mark.postgres
def test_postgres_preflight_passes_a_good_lookup(pg_tables: PgTables) -> None:
    query = f"SELECT id, name, tier FROM {pg_tables.customers} WHERE id = ANY($1)"
    _check(PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id"))
    composite = (
        f"SELECT r.region, r.id, r.name FROM {pg_tables.regional} r "
        "JOIN unnest($1::text[], $2::int[]) AS k(region, id) ON r.region = k.region AND r.id = k.id"
    )
    _check(PostgresLookup(pg_tables.dsn, composite, key=("region", "customer_id"),
                          on=("region", "id")))  # fmt: skip


@pytest.mark.postgres
def test_postgres_preflight_names_what_is_wrong(pg_tables: PgTables) -> None:
    table = pg_tables.customers
    dsn = pg_tables.dsn
    good = f"SELECT id, name FROM {table} WHERE id = ANY($1)"
    host = dsn.split("@", 1)[1]
    cases: list[tuple[PostgresLookup, type[Exception], str]] = [
        (
            PostgresLookup(f"postgresql://nobody:s3cret@{host}", good, key="customer_id", on="id"),
            LookupAuthError,
            r"connect on postgresql://nobody:\*\*\*@.*role \"nobody\"",
        ),
        (
            PostgresLookup(f"postgresql://postgres@127.0.0.1:{_closed_port()}/test", good,
                           key="customer_id", on="id", connect_timeout=5),
            LookupConnectionError,
            r"connect on postgresql://postgres@127\.0\.0\.1:\d+/test failed",
        ),
        (
            PostgresLookup(dsn, f"SELECT name FROM {table} WHERE id = ANY($1)",
                           key="customer_id", on="id"),
            LookupQueryError,
            r"no column 'id' to match keys on; it returned \['name'\]",
        ),
        (
            PostgresLookup(dsn, f"SELECT id, tier FROM {table} WHERE id = ANY($1)",
                           key="customer_id", on="id"),
            LookupQueryError,
            r"output_schema column\(s\) \['name'\] are not in the query's result",
        ),
        (
            PostgresLookup(dsn, f"SELECT id::text AS id, name FROM {table} WHERE id = ANY($1)",
                           key="customer_id", on="id"),
            LookupQueryError,
            r"column 'id' is text \(a string\), but the key column 'customer_id' is int32",
        ),
        (
            PostgresLookup(dsn, f"SELECT id, name FROM {table}_missing WHERE id = ANY($1)",
                           key="customer_id", on="id"),
            LookupQueryError,
            r"prepare the lookup query on .*UndefinedTableError",
        ),
        (
            PostgresLookup(dsn, good, key="cust_id", on="id"),
            LookupKeyError,
            r"input has no key column 'cust_id'.*'customer_id'",
        ),
    ]  # fmt: skip
    for lookup, kind, message in cases:
        with pytest.raises(kind, match=message) as info:
            _check(lookup)
        assert "s3cret" not in str(info.value)
    # columns= chooses the output columns over output_schema's, as at run time
    chosen = PostgresLookup(dsn, f"SELECT id, tier FROM {table} WHERE id = ANY($1)",
                            key="customer_id", on="id", columns=["tier"])  # fmt: skip
    _check(chosen)


@pytest.mark.postgres
def test_a_failed_preflight_starts_no_job_and_preflight_false_skips_it(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    query = f"SELECT name FROM {pg_tables.customers} WHERE id = ANY($1)"  # no "id" column
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    with _jobs(spark, "refused") as jobs, pytest.raises(LookupQueryError) as info:
        ordered_wait(_orders(spark), lookup, timeout=10, output_schema="name string")
    assert jobs == []
    assert "no column 'id' to match keys on" in str(info.value)
    assert "preflight=False skips it" in "".join(info.value.__notes__)

    # skipped: the DataFrame is built, and the mistake is left to the job to find (as
    # tests/connectors/test_declared_columns_in_spark.py shows it does)
    out = ordered_wait(_orders(spark), lookup, timeout=10, output_schema="name string",
                       preflight=False)  # fmt: skip
    assert out.columns == ["customer_id", "name"]


@pytest.mark.postgres
def test_a_good_lookup_passes_without_a_job_and_runs(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    query = f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    with _jobs(spark, "passed") as jobs:
        out = unordered_wait(_orders(spark), lookup, timeout=10, output_schema="name string")
    assert jobs == []
    with _jobs(spark, "ran") as jobs:
        names = sorted(r.name for r in out.collect())
    assert names == [f"customer-{i}" for i in range(1, 7)]
    assert jobs  # the counter counts: the action's jobs are there


# -- HttpLookup -------------------------------------------------------------------------------
def test_http_preflight_reaches_the_endpoint_and_names_what_is_wrong() -> None:
    with ServiceThread(customers=10) as service:
        _check(HttpLookup(service.url + "/customers/{customer_id}"))
        # any answer is an answer: the prefix /nothing/ is a 404 there
        _check(HttpLookup(service.url + "/nothing/{customer_id}"))
        _check(HttpLookup(service.url + "/customers/batch", method="POST",
                          batch=HttpBatch(key="customer_id", result_key="id",
                                          json_field="ids")))  # fmt: skip
        with pytest.raises(LookupKeyError, match=r"no field 'cust' used by the request template"):
            _check(HttpLookup(service.url + "/customers/{cust}"))
        with pytest.raises(LookupKeyError, match=r"no field 'cid' used by the batch key"):
            _check(HttpLookup(service.url + "/customers", batch=HttpBatch(
                key="cid", result_key="id", param="ids")))  # fmt: skip
    port = _closed_port()
    url = rf"HEAD http://user:\*\*\*@127\.0\.0\.1:{port}/c/ failed"
    with pytest.raises(LookupConnectionError, match=url):
        _check(HttpLookup(f"http://user:s3cret@127.0.0.1:{port}/c/{{customer_id}}"))
    # a placeholder in the host: nothing to reach before a row gives it
    _check(HttpLookup(f"http://{{region}}.127.0.0.1:{port}/c/{{customer_id}}"))


def test_http_preflight_fails_ordered_wait_before_any_job(spark: SparkSession) -> None:
    lookup = HttpLookup(f"http://127.0.0.1:{_closed_port()}/customers/{{customer_id}}")
    with _jobs(spark, "http") as jobs, pytest.raises(LookupConnectionError, match="HEAD http"):
        ordered_wait(_orders(spark), lookup, timeout=10, output_schema="name string")
    assert jobs == []


# -- the hook: functions of one's own, AsyncDataStream, keyed_process -----------------------
class Checked(AsyncFunction[Any, Any]):
    """A function with a preflight that records what it was given, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[PreflightContext] = []

    async def preflight(self, context: PreflightContext) -> None:
        self.seen.append(context)
        if self.fail:
            raise ConfigurationError("service_url 'http://nowhere' is not reachable")

    async def async_invoke(self, value: Any) -> list[Any]:
        return [(value[0] * 2,)]


class CheckedKeyed(KeyedProcessFunction[Any, Any, Any]):
    def __init__(self) -> None:
        self.seen: list[PreflightContext] = []

    async def preflight(self, context: PreflightContext) -> None:
        self.seen.append(context)

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect({"customer_id": value["customer_id"]})


def test_the_hook_runs_once_on_the_driver_for_every_entry_point(spark: SparkSession) -> None:
    assert isinstance(Checked(), SupportsPreflight)
    orders = _orders(spark)
    checked = Checked()
    with _jobs(spark, "hook") as jobs:
        AsyncDataStream.ordered_wait(orders, checked, 5, 10, "doubled int")
        unordered_wait(orders, checked, timeout=5, output_schema="doubled int", preflight=False)
        keyed = CheckedKeyed()
        keyed_process(orders, keyed, key="customer_id", output_schema="customer_id int")
    assert jobs == []
    (context,) = checked.seen
    assert context.input_schema.names == ["customer_id"]
    assert context.input_schema.field("customer_id").type == pa.int32()
    assert context.output_schema.names == ["doubled"]
    assert [c.output_schema.names for c in keyed.seen] == [["customer_id"]]

    with _jobs(spark, "hook-fails") as jobs, pytest.raises(ConfigurationError) as info:
        AsyncDataStream.unordered_wait(orders, Checked(fail=True), 5, 10, "doubled int")
    assert jobs == [] and "service_url" in str(info.value)
    assert "on the driver, before any Spark job" in "".join(info.value.__notes__)
    with pytest.raises(ConfigurationError, match="preflight must be True or False, got 'no'"):
        ordered_wait(orders, Checked(), timeout=5, output_schema="d int", preflight="no")
