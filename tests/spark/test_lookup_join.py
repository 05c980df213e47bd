"""``lookup_join`` answers, as a multiset of rows, what per-row ``ordered_wait`` answers, by
every strategy, against a real PostgreSQL, the customer HTTP service and the example model
service: NULL keys, keys with no match, duplicate keys, one-to-many answers, error rows,
decimal and timestamptz columns, left and inner; each strategy's lookups are counted
(the operator's metrics, the services' own counters); ``auto`` chooses by its estimates
(a small analyzed table is read in bulk, decided without reading a larger input when
the statistics and a probe of the table's keys suffice; a table the statistics call huge
is not); a bulk
read's parts hold each key once, and its failures of keys no row has fail nothing; the
cost model decides on given estimates; what a strategy cannot take is refused."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from asyncio_ops.connectors import LookupQueryError
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.services.customers import ServiceThread
from asyncio_ops.services.models import OpenAIServiceThread
from pyspark.sql import DataFrame, SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import AsyncMetrics, lookup_join, ordered_wait
from asyncio_ops.spark._lookup_join import JoinChoice, JoinEstimates, choose
from tests.connectors.conftest import pg_dsn
from tests.connectors.support import pg_execute, run_isolated
from tests.spark.conftest import spark

__all__ = ["pg_dsn", "spark"]

pytestmark = [pytest.mark.spark]

SCHEMA = "name string, balance decimal(12,2), opened timestamp"
N = 600


@pytest.fixture(scope="module")
def accounts(pg_dsn: str) -> Iterator[str]:
    """Accounts 1..120 (id 7 twice: ambiguous one-to-one, two answers one-to-many; one
    row with a NULL id, which matches nothing), a decimal and a timestamptz column;
    analyzed. No autovacuum: the statistics stay as the tests set them."""
    table = f"aops_lj_accounts_{uuid.uuid4().hex[:10]}"
    pg_execute(pg_dsn, f"""
        CREATE TABLE {table} (id int, name text, balance numeric(12,2), opened timestamptz)
            WITH (autovacuum_enabled = false);
        INSERT INTO {table}
          SELECT i, 'account-' || i, i * 10.25,
                 timestamptz '2024-01-01 00:00+00' + i * interval '1 hour'
          FROM generate_series(1, 120) AS i;
        INSERT INTO {table} VALUES (7, 'account-7b', -3.5, timestamptz '2023-06-30 12:00+02'),
                                   (NULL, 'nobody', 0, NULL);
        ANALYZE {table};
    """)  # fmt: skip
    try:
        yield table
    finally:
        pg_execute(pg_dsn, f"DROP TABLE IF EXISTS {table}")


def _orders(spark: SparkSession) -> DataFrame:
    """N orders over 3 partitions: accounts 1..150 (121..150 unknown), repeated; every
    37th a NULL account."""
    rows = [(i, None if i % 37 == 3 else (i * 7) % 150 + 1) for i in range(N)]
    return spark.createDataFrame(rows, "order_id long, account_id int").repartition(3)


def _accounts(dsn: str, table: str, many: bool) -> PostgresLookup:
    return PostgresLookup(dsn, f"SELECT id, name, balance, opened FROM {table} WHERE id = ANY($1)",
                          key="account_id", on="id", many=many, table=table)  # fmt: skip


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _choice(caplog: pytest.LogCaptureFixture) -> JoinChoice:
    made = [r.lookup_join for r in caplog.records if hasattr(r, "lookup_join")]
    assert made, "lookup_join logged no choice"
    choice: JoinChoice = made[-1]
    return choice


@pytest.mark.postgres
@pytest.mark.parametrize(("how", "many"), [("left", False), ("inner", True)])
def test_every_strategy_is_per_row_ordered_wait_on_postgres(
    spark: SparkSession, pg_dsn: str, accounts: str, how: str, many: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    orders = _orders(spark)
    options: dict[str, Any] = {"timeout": 30, "output_schema": SCHEMA, "on_error": "error_column"}
    expected = _rows(ordered_wait(orders, _accounts(pg_dsn, accounts, many),
                                  on_empty="keep" if how == "left" else "drop", **options))
    keys = {(i * 7) % 150 + 1 for i in range(N) if i % 37 != 3}
    # the cases are there: NULL keys, unknown keys, one key's error (one-to-one) or two answers
    assert any(r[1] is None for r in expected) == (how == "left")
    assert any(r[1] is not None and r[1] > 120 for r in expected) == (how == "left")
    sevens = [r for r in expected if r[1] == 7]
    if many:
        assert {r[2] for r in sevens} == {"account-7", "account-7b"}
    else:
        assert sevens and all(r[2] is None and r[5].exception == "LookupAmbiguousError"
                              for r in sevens)  # fmt: skip
    looked_up = {"rows": N - len(range(3, N, 37)), "distinct": len(keys), "bulk": 120}
    caplog.set_level(logging.INFO, logger="asyncio_ops.spark")
    # rows is ordered_wait itself, and auto's choice has a test of its own: both once
    for strategy in ("rows", "distinct", "bulk", "auto") if how == "left" else ("distinct", "bulk"):
        metrics = AsyncMetrics(spark)
        out = lookup_join(orders, _accounts(pg_dsn, accounts, many), strategy=strategy, how=how,
                          metrics=metrics, **options)  # fmt: skip
        assert out.columns == ["order_id", "account_id", "name", "balance", "opened", "_error"]
        assert _rows(out) == expected, strategy
        chosen = _choice(caplog).strategy
        assert chosen == strategy or strategy == "auto"
        # rows: every row with a key; distinct: each key once; bulk: each key of the table
        assert metrics.value.received - metrics.value.skipped_null_keys == looked_up[chosen]


@pytest.mark.postgres
def test_a_bulk_read_fails_only_on_the_failed_keys_a_row_has(
    spark: SparkSession, pg_dsn: str, accounts: str
) -> None:
    """The bulk read looks every key of the table up, id 7 (ambiguous) too: with
    on_error="fail" the job fails, as per row, only when an input row has it."""
    lookup = _accounts(pg_dsn, accounts, many=False)
    without = spark.createDataFrame([(i, i % 30 + 10) for i in range(90)],
                                    "order_id long, account_id int")  # fmt: skip
    expected = _rows(ordered_wait(without, lookup, timeout=30, output_schema=SCHEMA))
    assert _rows(lookup_join(without, lookup, timeout=30, output_schema=SCHEMA,
                             strategy="bulk")) == expected  # fmt: skip
    with_seven = without.union(spark.createDataFrame([(90, 7)], without.schema))
    with pytest.raises(Exception, match=r"LookupAmbiguousError: key 7 matched 2 rows"):
        lookup_join(with_seven, lookup, timeout=30, output_schema=SCHEMA, strategy="bulk").collect()


@pytest.mark.postgres
def test_bulk_keys_fall_in_exactly_one_part_and_a_wrong_table_is_named(
    pg_dsn: str, accounts: str
) -> None:
    """A composite key's parts (the hash of the row of its columns) hold each distinct
    non-NULL key once; statistics of a table the server does not know name it."""
    pairs = f"{accounts}_pairs"
    pg_execute(pg_dsn, f"CREATE TABLE {pairs} AS SELECT (i % 3)::text AS region, i % 50 AS id,"
               f" i AS n FROM generate_series(1, 400) AS i;"
               f"INSERT INTO {pairs} VALUES (NULL, 1, 0), ('0', NULL, 0); ANALYZE {pairs}")
    query = (f"SELECT p.region, p.id, p.n FROM {pairs} p JOIN unnest($1::text[], $2::int[])"
             " AS k(region, id) ON p.region = k.region AND p.id = k.id")  # fmt: skip
    lookup = PostgresLookup(pg_dsn, query, key=("r", "i"), on=("region", "id"), many=True,
                            table=pairs)  # fmt: skip
    schema = pa.schema([("r", pa.string()), ("i", pa.int64())])

    async def parts() -> tuple[list[pa.Table], Any]:
        async with lookup:
            found = [await lookup.bulk_keys(part, 3, schema) for part in range(3)]
            return found, await lookup.table_statistics()

    try:
        found, stats = run_isolated(parts())
        keys = [tuple(row.values()) for table in found for row in table.to_pylist()]
        assert sorted(keys) == sorted({(str(i % 3), i % 50) for i in range(1, 401)})
        assert all(table.num_rows for table in found) and stats.rows == 402
        assert lookup.join_strategies() == ("rows", "distinct", "bulk")
    finally:
        pg_execute(pg_dsn, f"DROP TABLE IF EXISTS {pairs}")
    missing = PostgresLookup(pg_dsn, query, key=("r", "i"), on=("region", "id"),
                             table="no_such_table_here")  # fmt: skip

    async def stats_of_missing() -> Any:
        async with missing:
            return await missing.table_statistics()

    with pytest.raises(LookupQueryError, match=r"table='no_such_table_here' is not a table"):
        run_isolated(stats_of_missing())
    # no table: no bulk read; answers carrying the input depend on the whole row: per row
    assert _accounts(pg_dsn, accounts, False).join_strategies()[-1] == "bulk"
    plain = PostgresLookup(pg_dsn, query, key=("r", "i"), on=("region", "id"))
    assert plain.join_strategies() == ("rows", "distinct")
    carrying = PostgresLookup(pg_dsn, query, key=("r", "i"), on=("region", "id"),
                              include_input=True, table=pairs)  # fmt: skip
    assert carrying.join_strategies() == ("rows",)


@pytest.fixture(scope="module")
def customers() -> Iterator[ServiceThread]:
    with ServiceThread(customers=100, latency=0.002) as service:
        yield service


def _answered(service: ServiceThread) -> int:
    async def go() -> int:
        async with (aiohttp.ClientSession() as session,
                    session.get(f"{service.url}/stats") as response):  # fmt: skip
            return int(sum((await response.json())["answered"]))

    return run_isolated(go())


def test_http_distinct_pays_once_per_key_and_equals_per_row(
    spark: SparkSession, customers: ServiceThread, caplog: pytest.LogCaptureFixture
) -> None:
    # refs: known ids, unknown ones (404: no answer), NULLs, and "x.." that the service
    # refuses (400: an error row), each many times
    refs = [None if i % 17 == 0 else (f"x{i % 3}" if i % 23 == 0 else str(i % 40 * 3 + 1))
            for i in range(400)]  # fmt: skip
    orders = spark.createDataFrame(list(enumerate(refs)), "order_id long, ref string")
    orders = orders.repartition(2)
    lookup = HttpLookup(customers.url + "/customers/{ref}")
    options: dict[str, Any] = {"timeout": 30, "output_schema": "name string, tier string",
                               "on_error": "error_column", "capacity": 20}  # fmt: skip
    # the service counts the ids it serves (the refused ones are answered before)
    sent = sum(r is not None and r.isdigit() for r in refs)
    distinct = len({r for r in refs if r is not None and r.isdigit()})
    for how, on_empty in (("left", "keep"), ("inner", "drop")):
        before = _answered(customers)
        expected = _rows(ordered_wait(orders, lookup, on_empty=on_empty, **options))
        assert _answered(customers) - before == sent
        assert any(r[4] is not None and r[4].exception == "LookupResponseError" for r in expected)
        assert any(r[2] is None and r[4] is None for r in expected) == (how == "left")
        strategies = (("rows", sent), ("distinct", distinct)) if how == "left" else (
            ("distinct", distinct),)
        for strategy, calls in strategies:
            before = _answered(customers)
            assert _rows(lookup_join(orders, lookup, strategy=strategy, how=how,
                                     **options)) == expected, (how, strategy)  # fmt: skip
            assert _answered(customers) - before == calls
    # auto: 400 rows over 65 keys of a service answering in milliseconds
    caplog.set_level(logging.INFO, logger="asyncio_ops.spark")
    before = _answered(customers)
    out = _rows(lookup_join(orders, lookup, **options))
    made = _choice(caplog)
    assert made.strategy in ("rows", "distinct") and made.estimates is not None
    assert made.estimates.rows == len(refs)
    keys = len({r for r in refs if r is not None})
    assert abs((made.estimates.distinct_keys or 0) - keys) <= keys // 10
    assert made.calls["distinct"] == made.estimates.distinct_keys
    paid = sent if made.strategy == "rows" else distinct
    assert paid < _answered(customers) - before <= paid + made.estimates.probe_calls
    assert out == _rows(ordered_wait(orders, lookup, on_empty="keep", **options))
    with pytest.raises(ConfigurationError, match=r"strategy='bulk'.*\['rows', 'distinct'\]"):
        lookup_join(orders, lookup, strategy="bulk", **options)


@pytest.mark.postgres
def test_auto_reads_a_small_table_and_not_a_huge_one(
    spark: SparkSession, pg_dsn: str, accounts: str, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="asyncio_ops.spark")
    orders = _orders(spark)
    expected = _rows(ordered_wait(orders, _accounts(pg_dsn, accounts, True), timeout=30,
                                  output_schema=SCHEMA))  # fmt: skip
    # a slow database (given rate): 150 distinct keys cost more than the 121 rows analyzed
    out = lookup_join(orders, _accounts(pg_dsn, accounts, True), timeout=30,
                      output_schema=SCHEMA, rate=200, explain=True)  # fmt: skip
    made = _choice(caplog)
    assert made.strategy == "bulk" and made.broadcast
    assert made.estimates is not None and made.estimates.table_rows == 122
    assert "strategy 'bulk' (auto)" in capsys.readouterr().out
    assert _rows(out) == expected
    # the statistics now call the table huge: auto looks the keys up, whatever the probe says
    huge = f"{accounts}_huge"
    pg_execute(pg_dsn, f"CREATE TABLE {huge} (LIKE {accounts}) WITH (autovacuum_enabled = false);"
               f"INSERT INTO {huge} SELECT * FROM {accounts};"
               f"UPDATE pg_class SET reltuples = 1e9 WHERE oid = '{huge}'::regclass")  # fmt: skip
    try:
        for rate in (200, None):
            out = lookup_join(orders, _accounts(pg_dsn, huge, True), timeout=30,
                              output_schema=SCHEMA, rate=rate)  # fmt: skip
            made = _choice(caplog)
            assert made.strategy in ("rows", "distinct"), made.explain()
            assert made.estimates is not None and made.estimates.table_rows == 10**9
            assert _rows(out) == expected
    finally:
        pg_execute(pg_dsn, f"DROP TABLE IF EXISTS {huge}")


@pytest.mark.postgres
def test_auto_reads_a_small_table_without_reading_the_input(
    spark: SparkSession, pg_dsn: str, accounts: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 1,000,000 planned rows (Spark's statistics of a range: no job), a 122-row table: the
    # table's statistics and a probe of its own keys decide, distinct is never counted
    caplog.set_level(logging.INFO, logger="asyncio_ops.spark")
    orders = spark.range(0, 10**6, numPartitions=2).selectExpr(
        "id AS order_id", "CAST(id % 150 + 1 AS INT) AS account_id")  # fmt: skip
    context = spark.sparkContext
    group = f"lookup-join-{uuid.uuid4().hex[:8]}"
    context.setJobGroup(group, "lookup_join's decision")
    try:
        out = lookup_join(orders, _accounts(pg_dsn, accounts, True), timeout=30,
                          output_schema=SCHEMA)  # fmt: skip
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert list(context.statusTracker().getJobIdsForGroup(group)) == []  # no Spark job
    made = _choice(caplog)
    e = made.estimates
    assert made.strategy == "bulk" and made.broadcast, made.explain()
    assert e is not None and e.rows == 10**6 and "rowCount of Range" in e.rows_source
    assert e.distinct_keys is None and e.distinct_source.startswith("skipped: distinct costs")
    assert e.table_rows == 122 and "table's keys" in e.rate_source
    assert 2 <= e.probe_calls <= 121  # the table's non-NULL keys, half of them timed
    assert made.seconds["bulk"] < min(made.seconds["rows"], made.seconds["distinct"])
    assert "distinct keys     not estimated (skipped" in made.explain()
    assert out.columns == ["order_id", "account_id", "name", "balance", "opened"]
    # an input that Spark sizes by bytes only (local rows, repartitioned), and a given rate
    # at which distinct may still win: the input is counted, the rate not probed
    lookup_join(_orders(spark), _accounts(pg_dsn, accounts, True), timeout=30,
                output_schema=SCHEMA, rate=200)  # fmt: skip
    made = _choice(caplog)
    assert made.estimates is not None and made.estimates.rows == N
    assert made.estimates.rows_source == "count" and made.estimates.distinct_keys is not None
    assert made.estimates.probe_calls == 0 and made.estimates.rate == 200


def test_model_endpoints_pay_once_per_distinct_prompt(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    notes = ["a great film", "dull", None, "I love it", "meh", "good enough"]
    rows = [(i, notes[i % len(notes)]) for i in range(90)]
    reviews = spark.createDataFrame(rows, "review_id long, note string").repartition(3)
    prompts = len({n for n in notes if n is not None})
    with OpenAIServiceThread() as models:
        chat = ChatLookup(models.url, "m", prompt="Sentiment of: {note}", api_key_env="")
        embed = EmbeddingLookup(models.url, "e", input="{note}", api_key_env="")
        for lookup, schema, counted in ((chat, "answer string", "requests"),
                                        (embed, "embedding array<float>", "inputs")):  # fmt: skip
            def paid(counted: str = counted) -> int:
                stats = models.stats
                return int(stats["requests"] if counted == "requests" else sum(stats["batches"]))

            before = paid()
            expected = _rows(ordered_wait(reviews, lookup, timeout=30, output_schema=schema))
            per_row = paid() - before
            before = paid()
            metrics = AsyncMetrics(spark)
            out = lookup_join(reviews, lookup, timeout=30, output_schema=schema,
                              strategy="distinct", metrics=metrics)  # fmt: skip
            assert _rows(out) == expected
            assert paid() - before == prompts < per_row
            assert metrics.value.received == prompts  # the operator saw each prompt once
    # auto explains the lookups it saves (a given rate: no probe at the model's cost)
    caplog.set_level(logging.INFO, logger="asyncio_ops.spark")
    with OpenAIServiceThread() as models:
        chat = ChatLookup(models.url, "m", prompt="Sentiment of: {note}", api_key_env="")
        lookup_join(reviews, chat, timeout=30, output_schema="answer string", rate=50)
        made = _choice(caplog)
        assert made.strategy == "distinct"
        assert made.calls == {"rows": 90, "distinct": prompts}
        assert f"lookups saved     ~{90 - prompts:,} of ~90" in made.explain()
        assert models.stats["requests"] == 0  # the estimates asked the model nothing


def test_the_cost_model_on_given_estimates() -> None:
    http = ("rows", "distinct")
    pg = ("rows", "distinct", "bulk")
    # 1M rows over 10k keys of a 20 ms service (10k lookups/s): distinct, broadcast
    made = choose(http, JoinEstimates(rows=10**6, distinct_keys=10**4, rate=1e4, slots=2), 2**26)
    assert made.strategy == "distinct" and made.broadcast
    assert made.calls == {"rows": 10**6, "distinct": 10**4}
    # every key distinct: nothing to save, rows
    assert choose(http, JoinEstimates(rows=10**5, distinct_keys=10**5, rate=1e4, slots=2),
                  2**26).strategy == "rows"  # fmt: skip
    # a 100k-row table of 10 MB, 1M rows over 100k keys, columnar Postgres: bulk, broadcast
    small = JoinEstimates(rows=10**6, distinct_keys=10**5, table="t", table_rows=10**5,
                          table_bytes=10**7, rate=4e5, slots=2)  # fmt: skip
    made = choose(pg, small, 2**26)
    assert made.strategy == "bulk" and made.broadcast
    # the same over a 10M-row table: the keys are looked up
    huge = JoinEstimates(rows=10**6, distinct_keys=10**5, table="t", table_rows=10**7,
                         table_bytes=10**9, rate=4e5, slots=2)  # fmt: skip
    assert choose(pg, huge, 2**26).strategy == "distinct"
    # a table too big to broadcast is joined by a shuffle, and costs it
    made = choose(pg, small, 10**6)
    assert not made.broadcast or made.strategy != "bulk"


def test_what_a_strategy_cannot_take_is_refused(spark: SparkSession) -> None:
    async def plain(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"n": row["id"]}]

    df = spark.range(5)
    with pytest.raises(ConfigurationError, match=r"strategy must be one of"):
        lookup_join(df, plain, timeout=5, output_schema="n long", strategy="hash")
    with pytest.raises(ConfigurationError, match=r"how must be one of"):
        lookup_join(df, plain, timeout=5, output_schema="n long", how="outer")
    with pytest.raises(ConfigurationError, match=r"takes no on_empty .*how="):
        lookup_join(df, plain, timeout=5, output_schema="n long", on_empty="drop")
    with pytest.raises(ConfigurationError, match=r"strategy='distinct'.*\['rows'\] only"):
        lookup_join(df, plain, timeout=5, output_schema="n long", strategy="distinct")
    with pytest.raises(ConfigurationError, match=r"has no option 'stratgy'"):
        lookup_join(df, plain, timeout=5, output_schema="n long", stratgy="rows")
    # a plain function is joined per row, as ordered_wait with on_empty="keep"
    assert _rows(lookup_join(df, plain, timeout=5, output_schema="n long")) == [
        (i, i) for i in range(5)
    ]
    lookup = HttpLookup("http://127.0.0.1:9/customers/{id}")
    with pytest.raises(ConfigurationError, match=r"does not take \['key'\].*strategy='rows'"):
        lookup_join(df, lookup, timeout=5, output_schema="name string", strategy="distinct",
                    key="id", preflight=False)  # fmt: skip
    stream = spark.readStream.format("rate").load().selectExpr("value AS id")
    with pytest.raises(ConfigurationError, match=r"needs a batch DataFrame.*foreachBatch"):
        lookup_join(stream, lookup, timeout=5, output_schema="name string",
                    strategy="distinct", preflight=False)  # fmt: skip
