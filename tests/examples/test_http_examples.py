"""The HTTP customer service, and the HTTP and streaming examples: each script run as a user
runs it, and again with other options in this process (tests/examples/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from asyncio_ops.services.customers import ServiceThread, customer

from examples import enrich_http, enrich_with_llm


def test_service_answers_single_batch_and_errors() -> None:
    async def calls(base: str) -> list[tuple[int, Any]]:
        out = []
        async with aiohttp.ClientSession() as session:
            for method, path, body in [
                ("GET", "/customers/30", None),
                ("GET", "/customers/51", None),  # beyond the 50 customers
                ("GET", "/customers/x", None),
                ("GET", "/customers?ids=1,50,51,100", None),
                ("POST", "/customers/batch", {"ids": [3, 4]}),
                ("POST", "/customers/batch", {"ids": "3"}),
                ("GET", "/healthz", None),
            ]:
                async with session.request(method, base + path, json=body) as r:
                    out.append((r.status, await r.json()))
        return out

    with ServiceThread(customers=50, latency=0.001) as service:
        results = asyncio.run(calls(service.url))
    assert results[0] == (200, customer(30))
    assert results[0][1]["tier"] == "gold"
    assert results[1][0] == 404
    assert results[2][0] == 400
    assert results[3] == (200, {"items": [customer(1), customer(50)]})
    assert results[4] == (200, {"items": [customer(3), customer(4)]})
    assert results[5][0] == 400
    assert results[6] == (200, {"status": "ok"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(url: str, body: dict[str, Any] | None, proc: subprocess.Popen[str]) -> Any:
    """The JSON answer of ``url`` once the command's server listens (30 s at most)."""
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + 30
    while True:
        try:
            request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, f"the command exited: {proc.communicate()}"
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


@pytest.mark.parametrize(
    ("module", "path", "body", "expected"),
    [
        ("asyncio_ops.services.customers", "/customers/7", None, customer(7)),
        (
            "asyncio_ops.services.models",
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "a great day"}]},
            "positive",
        ),
    ],
    ids=["customers", "models"],
)
def test_the_services_run_as_commands_from_any_directory(
    tmp_path: Path, module: str, path: str, body: Any, expected: Any
) -> None:
    """``python -m asyncio_ops.services.<name>`` from a directory that is not the
    repository (nothing of it on the path): the installed package holds the services."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        answer = _call(f"http://127.0.0.1:{port}{path}", body, proc)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"127.0.0.1:{port}" in out.splitlines()[0]
    if body is None:
        assert answer == expected
    else:
        assert answer["choices"][0]["message"]["content"] == expected


def test_service_latency_is_applied() -> None:
    async def timed(base: str) -> float:
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as session:
            start = loop.time()
            async with session.get(base + "/customers/1") as r:
                assert r.status == 200
            return loop.time() - start

    with ServiceThread(latency=0.1) as service:
        assert asyncio.run(timed(service.url)) >= 0.1


def test_a_saturating_service_queues_beyond_its_workers() -> None:
    """6 requests at once, 2 workers, 50 ms each: three turns, so at least 150 ms."""

    async def all_at_once(base: str) -> float:
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> None:
                async with session.get(f"{base}/customers/{i}") as r:
                    assert r.status == 200

            start = loop.time()
            await asyncio.gather(*(one(i) for i in range(1, 7)))
            return loop.time() - start

    with ServiceThread(latency=0.05, max_concurrent=2) as service:
        assert asyncio.run(all_at_once(service.url)) >= 0.15
    with pytest.raises(ValueError, match="max_concurrent"):
        ServiceThread(max_concurrent=-1)


def test_a_service_that_fails_fast_or_gets_slower_and_counts_what_it_answered() -> None:
    """``reject_above=2``: of 6 lookups at once 2 are served (50 ms), 4 answered 500 at
    once; ``latency_after``: from 0 s after the first lookup on, 100 ms; ``/stats``
    counts the answers per second and the refusals."""

    async def at_once(base: str, n: int) -> tuple[list[int], float, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> int:
                async with session.get(f"{base}/customers/{i}") as r:
                    return r.status

            start = loop.time()
            statuses = await asyncio.gather(*(one(i) for i in range(1, n + 1)))
            took = loop.time() - start
            async with session.get(f"{base}/stats") as r:
                return sorted(statuses), took, await r.json()

    with ServiceThread(latency=0.05, reject_above=2) as service:
        statuses, _, counted = asyncio.run(at_once(service.url, 6))
    assert statuses == [200, 200, 500, 500, 500, 500]
    assert counted == {"answered": [2], "rejected": 4}
    with ServiceThread(latency=0.0, latency_after=(0.0, 0.1)) as service:
        statuses, took, counted = asyncio.run(at_once(service.url, 3))
    assert statuses == [200] * 3 and took >= 0.1 and counted["answered"] == [3]


def test_the_model_service_takes_its_latency_per_request() -> None:
    from asyncio_ops.services.models import OpenAIServiceThread

    async def ask(base: str) -> float:
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as session:
            start = loop.time()
            body = {"model": "m", "messages": [{"role": "user", "content": "great"}]}
            async with session.post(f"{base}/v1/chat/completions", json=body) as r:
                assert (await r.json())["choices"][0]["message"]["content"] == "positive"
            return loop.time() - start

    with OpenAIServiceThread(latency=0.05) as service:
        assert asyncio.run(ask(service.url)) >= 0.05
    with pytest.raises(ValueError, match="latency"):
        OpenAIServiceThread(latency=-1.0)


def check_sample(result: dict[str, Any], n: int) -> None:
    sample = result["sample"]
    assert [r["order_id"] for r in sample] == list(range(n))
    for row in sample:
        expected = customer(row["customer_id"])
        assert {k: row[k] for k in expected} == expected, row


ENRICH_HTTP = ["--orders", "3000", "--customers", "2000", "--partitions", "2", "--latency-ms", "2"]


def check_enrich_http(result: dict[str, Any], batch: bool) -> None:
    assert result["local_service"] is True and result["batch"] is batch
    assert result["rows"] == 3000 and result["missing"] == 0 and result["mismatches"] == 0
    check_sample(result, 5)
    metrics = result["metrics"]
    assert metrics["emitted"] == 3000
    assert metrics["received"] == metrics["completed"] == 3000  # rows, on either path
    # columnar: a chunk of 100 rows per element (HttpBatch.max_size); per row: none
    assert metrics["chunks"] == (30 if batch else 0)
    assert metrics["failed"] == 0 and metrics["timed_out"] == 0


@pytest.mark.spark
def test_enrich_http_example(run_example: Any) -> None:
    """A request per row, the script run as a user runs it."""
    run = run_example("enrich_http.py", *ENRICH_HTTP, "--json")
    assert run.returncode == 0, run.describe()
    check_enrich_http(run.result, batch=False)


@pytest.mark.spark
def test_enrich_http_example_with_the_batch_endpoint(spark_in_process: Any) -> None:
    """The same orders through the batch endpoint (the columnar path), in this process."""
    run = spark_in_process(enrich_http.main, *ENRICH_HTTP, "--batch", "--json")
    check_enrich_http(run.result, batch=True)


@pytest.mark.spark
def test_enrich_http_against_a_given_url(spark_in_process: Any) -> None:
    with ServiceThread(customers=100, latency=0.001) as service:
        # Customers 1..100 exist; orders ask for 1..150: a third is missing (404 -> kept,
        # its columns NULL: a connector is a left join)
        run = spark_in_process(
            enrich_http.main, "--url", service.url, "--orders", "300", "--customers", "150",
            "--partitions", "2", "--json",
        )  # fmt: skip
    result = run.result
    assert result["local_service"] is False
    assert result["rows"] == 300 and result["missing"] == 100 and result["mismatches"] == 0


@pytest.mark.spark
def test_streaming_watermark_example(run_example: Any) -> None:
    run = run_example(
        "streaming_watermark.py", "--rows-per-batch", "200", "--batches", "2", "--json",
        timeout=110,
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    result = run.result
    first, second = result["runs"]
    assert len(first) >= 2 and len(second) >= 2
    assert min(second) > max(first), "the restarted query must continue, not start over"
    rows = result["rows"]
    assert rows >= 800 and rows % 200 == 0
    assert result["duplicates"] == 0 and result["lost"] == 0 and result["mismatches"] == 0
    assert result["min_order_id"] == 0
    # Event times are up to 9 s out of order and the watermark delay is 5 s:
    # some rows are behind the watermark, flagged and kept.
    assert 0 < result["late_rows"] < rows
    assert result["metrics"]["late"] >= result["late_rows"]
    assert result["metrics"]["dropped_late"] == 0


@pytest.mark.spark
def test_sessionize_stream_example(run_example: Any) -> None:
    """Enriched views into sessions by event-time timers; the query stops halfway and
    restarts at one more partition: every closed session once, whole across the restart."""
    run = run_example("sessionize_stream.py", "--customers", "20", "--files", "6", "--json",
                      timeout=180)  # fmt: skip
    assert run.returncode == 0, run.describe()
    result = run.result
    assert result["first_run_sessions"] > 0 and result["sessions"] > result["first_run_sessions"]
    assert result["duplicates"] == 0 and result["not_expected"] == 0 and result["missing"] == 0
    assert result["spanning_restart"] > 0  # sessions open at the stop, closed after it
    assert result["tiers_missing"] == 0


def check_enrich_with_llm(result: dict[str, Any]) -> None:
    assert result["local_service"] is True
    assert result["rows"] == 60 and result["positive"] == 30
    assert result["server"]["rejected"] == 0 and result["server"]["requests"] == 60
    assert {r["label"] for r in result["sample"]} <= {"positive", "negative"}
    assert all(isinstance(r["score"], float) for r in result["sample"])


@pytest.mark.spark
def test_enrich_with_llm_example(run_example: Any) -> None:
    """The LLM example against its own model server, run as a user runs it: every review
    labelled, typed, half of them positive, within the quota (no 429), the limit per
    worker."""
    run = run_example("enrich_with_llm.py", "--reviews", "60", "--tpm", "600000", "--json")
    assert run.returncode == 0, run.describe()
    check_enrich_with_llm(run.result)


@pytest.mark.spark
def test_enrich_with_llm_example_sharing_the_limit_through_redis(spark_in_process: Any) -> None:
    """The same, the limit shared by the workers through Redis, in this process."""
    run = spark_in_process(
        enrich_with_llm.main, "--reviews", "60", "--tpm", "600000",
        "--redis", "redis://127.0.0.1:6379/0", "--json",
    )  # fmt: skip
    check_enrich_with_llm(run.result)
