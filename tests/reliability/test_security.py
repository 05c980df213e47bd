"""Security promises of the connectors and the checkpoints, each proven on real parts.

- Lookups only use bound parameters: SQL-injection strings given as keys are data.
- DSN passwords, Authorization headers and credential query values never appear in logs,
  errors (their whole cause chain), reprs or metrics -- for failing and succeeding lookups,
  in the operator and through Spark (the ``_error`` column, the job's failure).
- Checkpoint files are written with the process umask; the docs say what they contain.
- The HTTP connector verifies TLS by default; only an explicit trust (``ca_file``) or an
  explicit opt-out (``verify_ssl=False``) lets a self-signed server through.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import pickle
import socket
import stat
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped,unused-ignore]
import pytest
import pytest_asyncio
from aiohttp import web
from asyncio_ops.connectors import (
    ConnectorError,
    LookupAuthError,
    LookupConnectionError,
    LookupQueryError,
    LookupTimeout,
    LookupTLSError,
    is_retryable,
)
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup

from asyncio_ops import AsyncOperatorError, AsyncRetryStrategy, Record, run_async_wait
from tests.connectors.support import PgTables, run_isolated
from tests.helpers import unavailable

from .conftest import RestartablePostgres

ROOT = Path(__file__).resolve().parents[2]

# -- bound parameters ---------------------------------------------------------------------------

INJECTIONS = [
    "1; DROP TABLE {canary}; --",
    "x'; DROP TABLE {canary}; --",
    "' OR '1'='1",
    "' OR 1=1 --",
    "alice' --",
    "alice'; DELETE FROM {table}; --",
    "') OR ('1'='1",
    '"; DROP TABLE {canary}; --',
    "$1",
    "\\'; DROP TABLE {canary}; --",
    "alice\u2019; DROP TABLE {canary}; --",
    "*/ DROP TABLE {canary} /*",
]


@pytest.fixture
def injection_tables(pg_tables: PgTables) -> Iterator[tuple[str, str, str]]:
    """A lookup table (alice, bob) and a canary table; (dsn, table, canary)."""
    suffix = uuid.uuid4().hex[:8]
    table, canary = f"aops_inj_{suffix}", f"aops_canary_{suffix}"

    async def setup() -> None:
        c = await asyncpg.connect(pg_tables.dsn, timeout=10)
        try:
            await c.execute(
                f"CREATE TABLE {table} (name text PRIMARY KEY, id int NOT NULL);"
                f"INSERT INTO {table} VALUES ('alice', 1), ('bob', 2);"
                f"CREATE TABLE {canary} (x int); INSERT INTO {canary} VALUES (42);"
            )
        finally:
            await c.close(timeout=5)

    async def teardown() -> None:
        c = await asyncpg.connect(pg_tables.dsn, timeout=10)
        try:
            await c.execute(f"DROP TABLE IF EXISTS {table}, {canary}")
        finally:
            await c.close(timeout=5)

    run_isolated(setup())
    try:
        yield pg_tables.dsn, table, canary
    finally:
        run_isolated(teardown())


async def _table_state(dsn: str, table: str, canary: str) -> tuple[list[Any], list[Any]]:
    c = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = [tuple(r) for r in await c.fetch(f"SELECT name, id FROM {table} ORDER BY name")]
        canaries = [r[0] for r in await c.fetch(f"SELECT x FROM {canary}")]
        return rows, canaries
    finally:
        await c.close(timeout=5)


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_sql_injection_strings_as_keys_are_data(
    injection_tables: tuple[str, str, str],
) -> None:
    dsn, table, canary = injection_tables
    keys = [k.format(table=table, canary=canary) for k in INJECTIONS]
    # a batch window far longer than submitting the rows takes on a loaded machine, so
    # that they are sure to travel as one batch (the default 2 ms is not)
    lookup = PostgresLookup(
        dsn,
        f"SELECT name, id FROM {table} WHERE name = ANY($1)",
        key="name",
        many=True,
        max_batch_delay=1.0,
    )
    rows = [{"name": k} for k in [*keys, "alice"]]
    out = await run_async_wait(lookup, rows, timeout=10.0, capacity=100)
    # Only the real key matched; every injection string was compared as a value.
    assert [e.value for e in out if isinstance(e, Record)] == [{"name": "alice", "id": 1}]
    assert await _table_state(dsn, table, canary) == ([("alice", 1), ("bob", 2)], [42])
    # One query for all of them: the strings travelled as one bound text[] parameter.
    assert lookup.statistics().batching.batches == 1


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_sql_injection_into_a_typed_or_composite_key_is_refused_or_data(
    injection_tables: tuple[str, str, str],
) -> None:
    dsn, table, canary = injection_tables
    # An int column: the string cannot even be encoded as the parameter's type.
    typed = PostgresLookup(dsn, f"SELECT name, id FROM {table} WHERE id = ANY($1)", key="id")
    async with typed:
        with pytest.raises(LookupQueryError):
            await typed.async_invoke({"id": f"1; DROP TABLE {canary}; --"})
    composite = PostgresLookup(
        dsn,
        f"SELECT t.name, t.id FROM {table} t JOIN unnest($1::text[], $2::int[]) AS k(name, id) "
        "ON t.name = k.name AND t.id = k.id",
        key=("name", "id"),
    )
    async with composite:
        for k in INJECTIONS:
            bad = k.format(table=table, canary=canary)
            assert await composite.async_invoke({"name": bad, "id": 1}) == []
        assert await composite.async_invoke({"name": "bob", "id": 2}) == [{"name": "bob", "id": 2}]
    assert await _table_state(dsn, table, canary) == ([("alice", 1), ("bob", 2)], [42])


# -- secrets never shown: helpers ---------------------------------------------------------------


def chain_text(exc: BaseException) -> str:
    """Everything an exception can show: str, repr, and the formatted chain with causes."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    parts += traceback.format_exception(exc)
    return "\n".join(parts)


def assert_no_secret(secrets: list[str], texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"secret {secret[:4]}... found in {where}: {text[:500]}"


# The test's own HTTP servers log requests (query strings included) as servers do; those
# are not the connector's logs.
_SERVER_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web")


def client_logs(caplog: pytest.LogCaptureFixture) -> str:
    records = [r for r in caplog.records if not r.name.startswith(_SERVER_LOGGERS)]
    assert records, "nothing was logged at all: is the capture working?"
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in records)


@pytest.fixture
def capture_all(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG (asyncpg, aiohttp, asyncio, asyncio_ops and its connectors)."""
    caplog.set_level(logging.DEBUG)
    for name in ("asyncpg", "aiohttp", "asyncio", "asyncio_ops"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


# -- secrets: Postgres with password authentication (a throwaway server) ------------------------

PG_PASSWORD = "pw-S3CRET-a91f2c"
WRONG_PASSWORD = "pw-WR0NG-5d2e1b"


@pytest.fixture
def pg_with_password(throwaway_pg: RestartablePostgres) -> tuple[RestartablePostgres, str]:
    """The throwaway server with a role that must log in with PG_PASSWORD (scram-sha-256)."""

    async def setup() -> None:
        c = await asyncpg.connect(throwaway_pg.dsn, timeout=10)
        try:
            await c.execute(f"CREATE ROLE aops_app LOGIN PASSWORD '{PG_PASSWORD}'")
            await c.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
            await c.execute(
                "INSERT INTO customers SELECT i, 'customer-' || i FROM generate_series(1, 50) i"
            )
            await c.execute("GRANT SELECT ON customers TO aops_app")
            throwaway_pg.hba_prepend("host all aops_app 127.0.0.1/32 scram-sha-256")
            await c.execute("SELECT pg_reload_conf()")
        finally:
            await c.close(timeout=5)

    run_isolated(setup())
    time.sleep(0.2)  # the postmaster re-reads pg_hba.conf on SIGHUP
    return (
        throwaway_pg,
        f"postgresql://aops_app:{PG_PASSWORD}@127.0.0.1:{throwaway_pg.port}/postgres",
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_pg_password_never_in_logs_errors_reprs_or_metrics(
    pg_with_password: tuple[RestartablePostgres, str],
    capture_all: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    server, dsn = pg_with_password
    port = server.port
    query = "SELECT id, name FROM customers WHERE id = ANY($1)"
    texts: dict[str, str] = {}
    retry = AsyncRetryStrategy.fixed_delay(2, 10, exception_predicate=is_retryable)

    # Succeeding, through the operator.
    good = PostgresLookup(dsn, query, key="id", columns=("name",))
    out = await run_async_wait(good, [{"id": 1}, {"id": 2}], timeout=10.0, retry=retry)
    assert [e.value for e in out if isinstance(e, Record)] == [
        {"name": "customer-1"},
        {"name": "customer-2"},
    ]
    texts["repr"] = repr(good)
    texts["statistics"] = repr(good.statistics())

    failing = {
        "wrong password": (
            PostgresLookup(dsn.replace(PG_PASSWORD, WRONG_PASSWORD), query, key="id"),
            LookupAuthError,
        ),
        "password as query parameter": (
            PostgresLookup(
                f"postgresql://aops_app@127.0.0.1:{port}/postgres?password={WRONG_PASSWORD}",
                query,
                key="id",
            ),
            LookupAuthError,
        ),
        "unknown table": (
            PostgresLookup(dsn, "SELECT id FROM no_such_table WHERE id = ANY($1)", key="id"),
            LookupQueryError,
        ),
        "refused": (
            PostgresLookup(
                dsn.replace(f":{port}/", f":{_closed_port()}/"), query, key="id", connect_timeout=2
            ),
            LookupConnectionError,
        ),
        "statement timeout": (
            PostgresLookup(
                dsn,
                "SELECT id FROM customers CROSS JOIN pg_sleep(5) WHERE id = ANY($1)",
                key="id",
                statement_timeout=0.2,
            ),
            LookupTimeout,
        ),
    }
    for name, (lookup, kind) in failing.items():
        texts[f"{name}: repr"] = repr(lookup)
        # Directly, as a user outside the operator sees it ...
        with pytest.raises(ConnectorError) as direct:
            async with lookup:
                await lookup.async_invoke({"id": 1})
        assert isinstance(direct.value, kind), (name, repr(direct.value))
        texts[f"{name}: error"] = chain_text(direct.value)
        # ... and as the operator reports it, after its retries (or as open() raised it).
        with pytest.raises((AsyncOperatorError, ConnectorError)) as operator:
            await run_async_wait(lookup, [{"id": 1}], timeout=10.0, retry=retry)
        texts[f"{name}: operator error"] = chain_text(operator.value)
        texts[f"{name}: statistics"] = repr(lookup.statistics())
        assert "127.0.0.1:" in str(direct.value)  # the server is named ...
    captured = capfd.readouterr()
    texts["stdout"], texts["stderr"] = captured.out, captured.err
    texts["logs"] = client_logs(capture_all)
    assert_no_secret([PG_PASSWORD, WRONG_PASSWORD], texts)  # ... never the password


# -- secrets: HTTP headers, query values, URL userinfo -----------------------------------------

TOKEN = "tok-S3CRET-7f3a9c0b"
API_KEY = "key-S3CRET-2b8e41d7"
URL_PASSWORD = "upw-S3CRET-c5d9e3"
# What aiohttp sends for the userinfo aops:URL_PASSWORD: the password, merely encoded.
BASIC = base64.b64encode(f"aops:{URL_PASSWORD}".encode()).decode()
HTTP_SECRETS = [TOKEN, API_KEY, URL_PASSWORD, BASIC]


@pytest_asyncio.fixture
async def echo_server() -> AsyncIterator[str]:
    """A server that echoes credentials back in bodies and reasons, as careless ones do."""

    async def customer(request: web.Request) -> web.StreamResponse:
        cid = request.match_info["id"]
        echoed = f"{request.headers.get('Authorization')} {request.query_string}"
        if cid == "401":
            return web.Response(status=401, text=f"bad credentials: {echoed}")
        if cid == "503":
            return web.Response(status=503, text=f"busy: {echoed}", headers={"Retry-After": "0"})
        if cid == "500":
            reason = f"Oops {request.headers.get('Authorization')} {request.query_string}"
            return web.Response(status=500, reason=reason, text=echoed)
        if cid == "slow":
            await asyncio.sleep(5)
        if cid == "garbage":
            return web.Response(status=200, text=f"not json {echoed}")
        return web.json_response({"id": cid, "name": f"customer-{cid}"})

    app = web.Application()
    app.router.add_get("/customers/{id}", customer)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _http_lookups(host: str) -> dict[str, HttpLookup]:
    common: dict[str, Any] = {"max_retries": 1, "backoff": 0.01, "timeout": 0.5}
    return {
        "header+query": HttpLookup(
            f"http://{host}/customers/{{cid}}",
            headers={"Authorization": f"Bearer {TOKEN}", "X-Api-Key": API_KEY},
            params={"api_key": API_KEY},
            **common,
        ),
        "userinfo": HttpLookup(f"http://aops:{URL_PASSWORD}@{host}/customers/{{cid}}", **common),
        "query in url": HttpLookup(
            f"http://{host}/customers/{{cid}}?access_token={TOKEN}", **common
        ),
    }


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_http_credentials_never_in_logs_errors_reprs_or_metrics(
    echo_server: str,
    capture_all: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    texts: dict[str, str] = {}
    refused = f"127.0.0.1:{_closed_port()}"
    retry = AsyncRetryStrategy.fixed_delay(1, 10, exception_predicate=is_retryable)
    lookups = [
        *_http_lookups(echo_server).items(),
        *[(f"refused {n}", lk) for n, lk in _http_lookups(refused).items()],
    ]
    for name, lookup in lookups:
        texts[f"{name}: repr"] = repr(lookup)
        texts[f"{name}: pickle-free repr"] = str(lookup)
        cases = ["1", "401", "500", "slow", "garbage"] if "refused" not in name else ["1"]
        async with lookup:
            for cid in cases:
                try:
                    result = await lookup.async_invoke({"cid": cid})
                except ConnectorError as exc:
                    texts[f"{name} {cid}: error"] = chain_text(exc)
                else:
                    assert cid == "1" and result[0]["name"] == "customer-1", (name, cid)
        with pytest.raises(AsyncOperatorError) as operator:
            await run_async_wait(lookup, [{"cid": "401"}], timeout=5.0, retry=retry)
        texts[f"{name}: operator error"] = chain_text(operator.value)
    # The 503s last: a "slow down" paces every later request to the service for seconds
    # (connectors/_slow_down.py), which would only hold up the answers above.
    for name, lookup in lookups:
        if "refused" not in name:  # a 503 is "slow down": sent again until the timeout,
            # whose error is the service's last answer
            with pytest.raises(AsyncOperatorError) as slowed:
                await run_async_wait(lookup, [{"cid": "503"}], timeout=1.5)
            texts[f"{name} 503: operator error"] = chain_text(slowed.value)
        texts[f"{name}: statistics"] = repr(lookup.statistics())
    assert any("answered 401" in t for t in texts.values())
    assert any("answered 503" in t for t in texts.values())
    assert any("LookupTimeout" in t for t in texts.values())
    assert any("LookupConnectionError" in t for t in texts.values())
    captured = capfd.readouterr()
    texts["stdout"], texts["stderr"] = captured.out, captured.err
    texts["logs"] = client_logs(capture_all)
    assert_no_secret(HTTP_SECRETS, texts)


# -- secrets through Spark: the _error column and a failed job ---------------------------------


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_spark_error_column_and_job_failure_never_show_secrets(
    spark: Any, pg_with_password: tuple[RestartablePostgres, str]
) -> None:
    from asyncio_ops.spark import AsyncMetrics, ordered_wait

    server, dsn = pg_with_password
    wrong = dsn.replace(PG_PASSWORD, WRONG_PASSWORD)
    df = spark.createDataFrame([(1,), (2,), (3,)], "id int")
    texts: dict[str, str] = {}

    bad_query = PostgresLookup(dsn, "SELECT id FROM nothing_here WHERE id = ANY($1)", key="id")
    bad_auth = PostgresLookup(wrong, "SELECT id FROM customers WHERE id = ANY($1)", key="id")
    metrics = AsyncMetrics(spark)
    # A row that fails becomes an error row; its message names the server, not the password.
    rows = ordered_wait(
        df, bad_query, timeout=10.0, output_schema="name string", on_error="error_column",
        metrics=metrics, preflight=False,  # the executors' path; the driver's is below
    ).collect()  # fmt: skip
    assert len(rows) == 3 and all(r["_error"] is not None for r in rows), rows
    assert {r["_error"]["exception"] for r in rows} == {"LookupQueryError"}
    assert all(f"127.0.0.1:{server.port}" in r["_error"]["message"] for r in rows)
    texts["query: _error"] = "\n".join(str(r["_error"].asDict()) for r in rows)
    texts["metrics"] = str(metrics.summary())

    # A refused password fails open() on the worker, hence the task and the job (it is not
    # a row's failure): the error Spark reports, worker traceback included, is clean too.
    with pytest.raises(Exception) as failed:
        ordered_wait(
            df, bad_auth, timeout=10.0, output_schema="name string", on_error="error_column",
            preflight=False,
        ).collect()  # fmt: skip
    texts["job failure"] = chain_text(failed.value)
    assert "LookupAuthError" in texts["job failure"]
    assert f"127.0.0.1:{server.port}" in texts["job failure"]
    # The driver's preflight refuses the password before any job, as cleanly.
    with pytest.raises(ConnectorError) as refused:
        ordered_wait(df, bad_auth, timeout=10.0, output_schema="name string")
    texts["preflight"] = chain_text(refused.value) + "".join(refused.value.__notes__)
    assert type(refused.value).__name__ == "LookupAuthError"
    assert f"127.0.0.1:{server.port}" in texts["preflight"]

    tokens = HttpLookup(
        "http://127.0.0.1:1/customers/{id}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        params={"api_key": API_KEY},
        max_retries=0,
        timeout=1.0,
    )
    rows = ordered_wait(
        df, tokens, timeout=10.0, output_schema="name string", on_error="error_column",
        preflight=False,
    ).collect()  # fmt: skip
    texts["http: _error"] = "\n".join(str(r["_error"].asDict()) for r in rows)
    with pytest.raises(ConnectorError) as unreachable:
        ordered_wait(df, tokens, timeout=10.0, output_schema="name string")
    texts["http preflight"] = chain_text(unreachable.value)
    assert all(r["_error"]["exception"] == "LookupConnectionError" for r in rows)
    assert_no_secret([PG_PASSWORD, WRONG_PASSWORD, TOKEN, API_KEY], texts)


# -- checkpoint files: the process umask, and the docs say what they hold -------------------------

_WRITE_CHECKPOINT = textwrap.dedent(
    """
    import os, sys
    os.umask(int(sys.argv[2], 8))
    import pyarrow as pa
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
    from asyncio_ops._storage._container import Kind
    storage = CheckpointStorage(sys.argv[1], "op")
    storage.check_writable()
    storage.write(1, "subtask-0.ckpt", Kind.REPLAY_LOG, pa.table({"card": ["4111-1111"]}))
    storage.write(1, "kg-7.ckpt", Kind.REPLAY_LOG, pa.table({"n": [1, 2, 3]}))
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o027, 0o640, 0o750), (0o077, 0o600, 0o700)]
)
def test_checkpoint_files_are_written_with_the_process_umask(
    tmp_path: Path, umask: int, file_mode: int, dir_mode: int
) -> None:
    location = tmp_path / "ckpt"
    subprocess.run(
        [sys.executable, "-c", _WRITE_CHECKPOINT, str(location), oct(umask)],
        check=True,
        timeout=50,
        cwd=ROOT,
    )
    files = [p for p in location.rglob("*") if p.is_file()]
    dirs = [p for p in location.rglob("*") if p.is_dir()]
    assert sorted(p.name for p in files) == ["kg-7.ckpt", "subtask-0.ckpt"]  # no temp left
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(file_mode)}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in dirs} == {oct(dir_mode)}


def test_docs_say_what_checkpoint_files_contain() -> None:
    spark_doc = " ".join((ROOT / "docs" / "spark.md").read_text().split())
    assert "Checkpoint files hold the payloads of in-flight rows" in spark_doc
    assert "umask" in spark_doc
    storage = ROOT / "asyncio_ops" / "_storage" / "_checkpoint_storage.py"
    module_doc = " ".join(storage.read_text().split())
    assert "Files hold the payloads of in-flight rows" in module_doc
    guarantees = " ".join((ROOT / "docs" / "guarantees.md").read_text().split())
    assert "hold the payloads of in-flight rows" in guarantees and "umask" in guarantees


# -- TLS is verified by default -------------------------------------------------------------------


def _openssl_cert(directory: Path, name: str, san: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Self-signed certificates: one valid for 127.0.0.1, one only for another name."""
    if not _which("openssl"):
        reason = "openssl is not installed"
        unavailable(reason)
    directory = tmp_path_factory.mktemp("tls")
    return {
        "ip": _openssl_cert(directory, "aops-ip", "IP:127.0.0.1"),
        "other-name": _openssl_cert(directory, "aops-other", "DNS:not-this-host.example"),
    }


def _which(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


async def _tls_server(cert: Path, key: Path) -> tuple[web.AppRunner, int, list[str]]:
    import ssl

    seen: list[str] = []

    async def customer(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"name": f"customer-{request.match_info['id']}"})

    app = web.Application()
    app.router.add_get("/customers/{id}", customer)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port: int = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port, seen


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_tls_is_verified_by_default(
    certificates: dict[str, tuple[Path, Path]],
) -> None:
    cert, key = certificates["ip"]
    runner, port, seen = await _tls_server(cert, key)
    url = f"https://127.0.0.1:{port}/customers/{{id}}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        default = HttpLookup(url, headers=headers, timeout=5.0)
        async with default:
            with pytest.raises(LookupTLSError) as caught:
                await default.async_invoke({"id": 1})
        error = caught.value
        assert not is_retryable(error)  # a certificate does not get better by retrying
        assert f"127.0.0.1:{port}/customers/1" in str(error)
        assert "certificate" in str(error).lower()
        assert TOKEN not in chain_text(error)
        assert seen == []  # no request, and so no credential, ever reached the server

        trusted = HttpLookup(url, headers=headers, ca_file=str(cert), timeout=5.0)
        async with trusted:
            assert await trusted.async_invoke({"id": 2}) == [{"name": "customer-2"}]
        unverified = HttpLookup(url, headers=headers, verify_ssl=False, timeout=5.0)
        async with unverified:
            assert await unverified.async_invoke({"id": 3}) == [{"name": "customer-3"}]
        assert seen == [f"Bearer {TOKEN}"] * 2
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_tls_hostname_is_checked_even_for_a_trusted_certificate(
    certificates: dict[str, tuple[Path, Path]],
) -> None:
    cert, key = certificates["other-name"]
    runner, port, seen = await _tls_server(cert, key)
    try:
        lookup = HttpLookup(
            f"https://127.0.0.1:{port}/customers/{{id}}", ca_file=str(cert), timeout=5.0
        )
        async with lookup:
            with pytest.raises(LookupTLSError) as caught:
                await lookup.async_invoke({"id": 1})
        assert "127.0.0.1" in str(caught.value)
        assert seen == []
    finally:
        await runner.cleanup()


def test_lookups_pickle_without_opening_anything() -> None:
    """What travels to executors is configuration: the DSN must (it is how workers connect),
    but nothing opened -- and reprs, which end up in Spark plans and logs, stay masked."""
    lookup = PostgresLookup(
        f"postgresql://aops_app:{PG_PASSWORD}@127.0.0.1:5/db", "SELECT $1::int AS id", key="id"
    )
    copy = pickle.loads(pickle.dumps(lookup))
    assert copy._runtime is None
    assert PG_PASSWORD not in repr(copy) and PG_PASSWORD not in repr(lookup)
