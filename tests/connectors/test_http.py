"""HttpLookup against a real aiohttp server on 127.0.0.1 (random port)."""

from __future__ import annotations

import asyncio
import email.utils
import pickle
import socket
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio
from aiohttp import web
from asyncio_ops.connectors import (
    LookupCache,
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupResponseError,
    LookupTimeout,
    is_retryable,
)
from asyncio_ops.connectors.http import HttpBatch, HttpLookup, active_sessions, parse_retry_after

from asyncio_ops import ConfigurationError
from asyncio_ops._exceptions import MAX_MESSAGE
from asyncio_ops.testing import ManualClock

TOKEN = "tok-SECRET-8c1f2e"
CUSTOMERS = {str(i): {"id": i, "name": f"customer-{i}"} for i in range(1, 51)}


@dataclass
class Server:
    """The test server's address and what it has seen."""

    base: str
    hits: dict[str, list[float]] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.base + path

    def count(self, name: str) -> int:
        return len(self.hits.get(name, []))


def _app(server: Server) -> web.Application:
    def hit(name: str) -> None:
        server.hits.setdefault(name, []).append(time.monotonic())

    def scripted(name: str) -> web.Response | None:
        # Answers queued by a test (status, headers) come first; then the real answer.
        queue = server.script.get(name)
        if queue:
            status, headers = queue.pop(0)
            return web.json_response({"error": status}, status=status, headers=headers)
        return None

    async def customer(request: web.Request) -> web.StreamResponse:
        hit("customer")
        server.seen.append(
            {
                "raw_path": request.raw_path,
                "id": request.match_info["id"],
                "query": list(request.query.items()),
                "authorization": request.headers.get("Authorization"),
            }
        )
        answer = scripted("customer")
        if answer is not None:
            return answer
        found = CUSTOMERS.get(request.match_info["id"])
        if found is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response(found)

    async def echo(request: web.Request) -> web.StreamResponse:
        hit("echo")
        body = await request.json() if request.can_read_body else None
        return web.json_response(
            {"data": {"query": list(request.query.items()), "json": body, "n": 42}}
        )

    async def batch(request: web.Request) -> web.StreamResponse:
        hit("batch")
        if request.method == "POST":
            ids = [str(i) for i in (await request.json())["ids"]]
        else:
            ids = request.query.get("ids", "").split(",")
        server.seen.append({"batch": ids})
        return web.json_response({"items": [CUSTOMERS[i] for i in ids if i in CUSTOMERS]})

    async def unauthorized(request: web.Request) -> web.StreamResponse:
        hit("unauthorized")
        # Echoes the credential back, as some servers do: it must stay out of messages.
        return web.Response(
            status=401, text=f"bad credentials: {request.headers.get('Authorization')}"
        )

    async def slow(request: web.Request) -> web.StreamResponse:
        hit("slow")
        await asyncio.sleep(5)
        return web.json_response({})

    async def text(request: web.Request) -> web.StreamResponse:
        hit("text")
        return web.Response(text="<html>not json</html>")

    async def score(request: web.Request) -> web.StreamResponse:
        hit("score")
        return web.json_response(0.93)

    app = web.Application()
    app.router.add_get("/customers/{id}", customer)
    app.router.add_route("*", "/echo", echo)
    app.router.add_route("*", "/batch", batch)
    app.router.add_get("/unauthorized", unauthorized)
    app.router.add_get("/slow", slow)
    app.router.add_get("/text", text)
    app.router.add_get("/score", score)
    return app


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    state = Server(base=f"http://127.0.0.1:{port}")
    runner = web.AppRunner(_app(state), shutdown_timeout=1.0)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield state
    finally:
        await runner.cleanup()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- requests and answers -------------------------------------------------------------


@pytest.mark.asyncio
async def test_url_template_escapes_values(server: Server) -> None:
    weird = "a b/c?d&e=%f#ü"
    async with HttpLookup(
        server.url("/customers/{cid}"), params={"q": "{note}", "fixed": 1}
    ) as lookup:
        assert await lookup.async_invoke({"cid": weird, "note": "x&y=z"}) == []
        assert await lookup.async_invoke({"cid": 7, "note": "n"}) == [
            {"id": 7, "name": "customer-7"}
        ]
    first, second = server.seen
    assert first["id"] == weird  # one path segment, decoded back exactly
    assert "/" not in first["raw_path"].removeprefix("/customers/").split("?")[0]
    assert ("q", "x&y=z") in first["query"]
    assert second["query"] == [("q", "n"), ("fixed", "1")]


@pytest.mark.asyncio
async def test_json_body_keeps_value_types_and_result_path(server: Server) -> None:
    async with HttpLookup(
        server.url("/echo"),
        method="POST",
        json={"id": "{cid}", "label": "customer {cid}", "tags": ["{tag}"]},
        result_path="data.json",
    ) as lookup:
        result = await lookup.async_invoke({"cid": 5, "tag": True})
    assert result == [{"id": 5, "label": "customer 5", "tags": [True]}]


@pytest.mark.asyncio
async def test_scalar_answers_and_missing_paths(server: Server) -> None:
    async with HttpLookup(server.url("/score"), value_field="score") as lookup:
        assert await lookup.async_invoke({}) == [{"score": 0.93}]
    async with HttpLookup(server.url("/echo"), result_path="data.absent") as lookup:
        assert await lookup.async_invoke({}) == []


@pytest.mark.asyncio
async def test_not_found_is_empty_and_other_4xx_is_an_error(server: Server) -> None:
    async with HttpLookup(server.url("/customers/{id}")) as lookup:
        assert await lookup.async_invoke({"id": 999}) == []
        server.script["customer"] = [(400, {})]
        with pytest.raises(LookupResponseError) as info:
            await lookup.async_invoke({"id": 1})
    assert info.value.status == 400
    assert not is_retryable(info.value)
    assert server.count("customer") == 2  # a 400 is not retried


@pytest.mark.asyncio
async def test_a_body_that_is_not_json(server: Server) -> None:
    async with HttpLookup(server.url("/text")) as lookup:
        with pytest.raises(LookupDecodeError, match="not JSON"):
            await lookup.async_invoke({})


# -- retries --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_429_honours_retry_after_seconds(server: Server) -> None:
    server.script["customer"] = [(429, {"Retry-After": "1"})]
    async with HttpLookup(server.url("/customers/{id}"), backoff=0.0) as lookup:
        started = time.monotonic()
        result = await lookup.async_invoke({"id": 3})
        elapsed = time.monotonic() - started
    assert result == [{"id": 3, "name": "customer-3"}]
    hits = server.hits["customer"]
    assert len(hits) == 2
    assert hits[1] - hits[0] >= 0.95, f"retried after {hits[1] - hits[0]:.3f}s, not 1s"
    assert elapsed >= 0.95


@pytest.mark.asyncio
async def test_503_honours_retry_after_http_date(server: Server) -> None:
    # HTTP dates have one-second resolution: ask for "now + 2s", expect at least ~1s.
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    server.script["customer"] = [(503, {"Retry-After": when})]
    async with HttpLookup(server.url("/customers/{id}")) as lookup:
        result = await lookup.async_invoke({"id": 4})
    hits = server.hits["customer"]
    assert result == [{"id": 4, "name": "customer-4"}]
    assert hits[1] - hits[0] >= 0.95


@pytest.mark.asyncio
async def test_5xx_is_retried_with_backoff(server: Server) -> None:
    server.script["customer"] = [(500, {}), (502, {})]
    async with HttpLookup(server.url("/customers/{id}"), backoff=0.05, max_retries=3) as lookup:
        assert await lookup.async_invoke({"id": 2}) == [{"id": 2, "name": "customer-2"}]
    assert server.count("customer") == 3


@pytest.mark.asyncio
async def test_retries_exhausted_raise_a_retryable_error(server: Server) -> None:
    server.script["customer"] = [(502, {}), (502, {}), (502, {})]
    async with HttpLookup(server.url("/customers/{id}"), backoff=0.01, max_retries=1) as lookup:
        with pytest.raises(LookupResponseError) as info:
            await lookup.async_invoke({"id": 2})
    assert info.value.status == 502
    assert is_retryable(info.value)  # the operator's retry strategy may still try later
    assert server.count("customer") == 2


@pytest.mark.asyncio
async def test_a_day_long_retry_after_is_clipped_and_slow_downs_are_not_retries(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A 429 or 503 is "slow down", not a failure: sent again after its Retry-After,
    clipped to max_retry_after (logged), as often as it takes, whatever max_retries
    says."""
    server.script["customer"] = [(429, {"Retry-After": "86400"}), (503, {}), (503, {})]
    async with HttpLookup(server.url("/customers/{id}"), max_retry_after=0.3,
                          max_retries=0) as lookup:  # fmt: skip
        with caplog.at_level("WARNING", logger="asyncio_ops.connectors"):
            assert await lookup.async_invoke({"id": 2}) == [{"id": 2, "name": "customer-2"}]
        assert lookup.service_retries()[:2] == (3, 3)
    assert "clipped to 0.3 s" in caplog.text
    hits = server.hits["customer"]
    assert len(hits) == 4 and 0.25 <= hits[1] - hits[0] < 30


@pytest.mark.asyncio
async def test_request_timeout(server: Server) -> None:
    async with HttpLookup(server.url("/slow"), timeout=0.2, max_retries=0) as lookup:
        started = time.monotonic()
        with pytest.raises(LookupTimeout):
            await lookup.async_invoke({})
        assert time.monotonic() - started < 2.0


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("3", now=now) == 3.0
    assert parse_retry_after(" 0 ", now=now) == 0.0
    assert parse_retry_after("-5", now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("nan") is None


# -- rate limit -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_rate_limit_is_respected(server: Server) -> None:
    rate, n = 20.0, 21
    async with HttpLookup(server.url("/customers/{id}"), rate_limit=rate) as lookup:
        started = time.monotonic()
        results = await asyncio.gather(*(lookup.async_invoke({"id": i}) for i in range(1, n + 1)))
        elapsed = time.monotonic() - started
    assert all(len(r) == 1 for r in results)
    # Burst 1: the first request goes at once, each later one waits 1/rate.
    # A lower bound only (slower machines are fine), with 10% tolerance for timers.
    expected = (n - 1) / rate
    assert elapsed >= 0.9 * expected, f"{n} requests in {elapsed:.3f}s, limit {rate}/s"
    hits = server.hits["customer"]
    assert hits[-1] - hits[0] >= 0.9 * expected


@pytest.mark.asyncio
async def test_rate_limit_is_shared_by_lookups_of_one_host(server: Server) -> None:
    rate = 20.0
    a = HttpLookup(server.url("/customers/{id}"), rate_limit=rate)
    b = HttpLookup(server.url("/echo"), rate_limit=rate)
    async with a, b:
        started = time.monotonic()
        await asyncio.gather(
            *(a.async_invoke({"id": i}) for i in range(1, 11)),
            *(b.async_invoke({}) for _ in range(10)),
        )
        elapsed = time.monotonic() - started
    assert elapsed >= 0.9 * 19 / rate


# -- batch endpoint -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_batch_endpoint_with_query_parameter(server: Server) -> None:
    lookup = HttpLookup(
        server.url("/batch"),
        batch=HttpBatch(key="customer_id", result_key="id", param="ids", max_delay=0.05),
        result_path="items",
    )
    rows = [{"customer_id": k} for k in (1, 2, 2, 3, 999, 1)]
    async with lookup:
        results = await asyncio.gather(*(lookup.async_invoke(r) for r in rows))
    assert server.count("batch") == 1
    assert sorted(server.seen[0]["batch"]) == ["1", "2", "3", "999"]
    assert [r[0]["id"] if r else None for r in results] == [1, 2, 2, 3, None, 1]
    assert lookup.statistics().batching.deduplicated == 2


@pytest.mark.asyncio
async def test_batch_endpoint_with_json_body_and_size_cap(server: Server) -> None:
    lookup = HttpLookup(
        server.url("/batch"),
        method="POST",
        batch=HttpBatch(
            key="customer_id", result_key="id", json_field="ids", max_size=4, max_delay=0.05
        ),
        result_path="items",
    )
    async with lookup:
        results = await asyncio.gather(
            *(lookup.async_invoke({"customer_id": str(i)}) for i in range(1, 11))
        )
    assert server.count("batch") == 3  # 4 + 4 + 2 keys
    assert [r[0]["name"] for r in results] == [f"customer-{i}" for i in range(1, 11)]


@pytest.mark.asyncio
async def test_batch_endpoint_answers_arrow_chunks_as_rows_do(server: Server) -> None:
    """The columnar path: one request per max_size distinct keys, each row its key's
    items; the same answers as one row at a time through the batcher."""
    lookup = HttpLookup(
        server.url("/batch"),
        batch=HttpBatch(key="customer_id", result_key="id", param="ids", max_size=3),
        result_path="items",
        cache=LookupCache(ttl=60),
    )
    lookup.bind_output_columns(["name"])
    keys = [1, 2, None, 2, 999, 3, 4, 1]
    chunk = pa.RecordBatch.from_pydict({"customer_id": pa.array(keys, pa.int64())})
    async with lookup:
        assert lookup.preferred_chunk_rows() == 3
        index, columns = await lookup.async_invoke_arrow(chunk)
        per_row = [await lookup.async_invoke({"customer_id": k}) for k in keys]
        again = await lookup.async_invoke_arrow(chunk)  # from the cache: no request
    assert server.count("batch") == 2  # 1, 2, 999 | 3, 4: distinct keys, 3 per request
    pairs = list(zip(index, columns["name"], strict=True))
    assert pairs == [(i, r["name"]) for i, rs in enumerate(per_row) for r in rs]
    assert pairs == [(0, "customer-1"), (1, "customer-2"), (3, "customer-2"),
                     (5, "customer-3"), (6, "customer-4"), (7, "customer-1")]  # fmt: skip
    assert again == (index, columns)


@pytest.mark.asyncio
async def test_without_a_batch_endpoint_rows_go_one_at_a_time(server: Server) -> None:
    lookup = HttpLookup(server.url("/customers/{id}"))
    assert lookup.preferred_chunk_rows() is None  # chunk_size="auto": the per-row path
    async with lookup:
        with pytest.raises(ConfigurationError, match="only with batch=HttpBatch"):
            await lookup.async_invoke_arrow(pa.RecordBatch.from_pydict({"id": [1]}))


def test_batch_requests_cannot_use_row_fields() -> None:
    with pytest.raises(ConfigurationError, match="row fields"):
        HttpLookup(
            "http://h/batch/{region}", batch=HttpBatch(key="id", result_key="id", param="ids")
        )
    with pytest.raises(ConfigurationError, match="exactly one"):
        HttpBatch(key="id", result_key="id")


# -- credentials ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_authorization_never_in_errors_or_repr(server: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "key-9f8e7d6c"}
    refused = HttpLookup(
        f"http://127.0.0.1:{closed_port()}/customers/{{id}}",
        headers=headers,
        max_retries=1,
        backoff=0.01,
    )
    assert TOKEN not in repr(refused) and "key-9f8e7d6c" not in repr(refused)
    async with refused:
        with pytest.raises(LookupConnectionError) as info:
            await refused.async_invoke({"id": 1})
    assert is_retryable(info.value)
    rendered = "".join(traceback.format_exception(info.value))
    assert TOKEN not in rendered and "key-9f8e7d6c" not in rendered

    async with HttpLookup(server.url("/unauthorized"), headers=headers) as lookup:
        with pytest.raises(LookupResponseError) as denied:
            await lookup.async_invoke({})
    assert denied.value.status == 401
    assert not is_retryable(denied.value)
    assert TOKEN not in str(denied.value) and TOKEN not in repr(denied.value)
    assert TOKEN.encode() in denied.value.body  # kept for diagnosis, outside the message


@pytest.mark.asyncio
async def test_headers_are_sent(server: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with HttpLookup(server.url("/customers/{id}"), headers=headers) as lookup:
        await lookup.async_invoke({"id": 1})
    assert server.seen[0]["authorization"] == f"Bearer {TOKEN}"


def test_url_credentials_are_redacted_in_repr() -> None:
    lookup = HttpLookup("https://user:pa55w0rd@h/x/{id}?api_key=abc123&x=1")
    assert "pa55w0rd" not in repr(lookup) and "abc123" not in repr(lookup)
    assert "{id}" in repr(lookup)


# -- lifecycle, cache -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_pickle_and_shared_session(server: Server) -> None:
    before = active_sessions()
    lookup = HttpLookup(server.url("/customers/{id}"), headers={"Authorization": "Bearer x-y-z"})
    clone = pickle.loads(pickle.dumps(lookup))
    async with lookup, clone:
        assert active_sessions() == before + 1
        shipped = pickle.loads(pickle.dumps(lookup))
        assert (await clone.async_invoke({"id": 6}))[0]["id"] == 6
    assert active_sessions() == before
    async with shipped:
        assert (await shipped.async_invoke({"id": 8}))[0]["id"] == 8


@pytest.mark.asyncio
async def test_cache_spares_requests(server: Server) -> None:
    clock = ManualClock(0.0)
    cache: LookupCache[Any] = LookupCache(ttl=60.0, clock=clock)
    async with HttpLookup(server.url("/customers/{id}"), cache=cache) as lookup:
        for _ in range(3):
            assert (await lookup.async_invoke({"id": 1}))[0]["id"] == 1
        clock.advance(61.0)
        await lookup.async_invoke({"id": 1})
    assert server.count("customer") == 2
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.expirations) == (2, 2, 1)


def test_template_rejects_attribute_access() -> None:
    with pytest.raises(ConfigurationError, match="plain field name"):
        HttpLookup("http://h/{row.__class__}")
    with pytest.raises(ConfigurationError, match="plain field name"):
        HttpLookup("http://h/{}")
    with pytest.raises(ConfigurationError, match="http"):
        HttpLookup("ftp://h/x")


def test_url_template_encodes_its_text_once_and_every_unsafe_value() -> None:
    from urllib.parse import quote

    from asyncio_ops.connectors.http._template import Template

    template = Template("http://h/a b/{x}/%41?q={y}", option="url")
    for x, y in [("abc123", 7), ("a/b c", "é"), ("", None), ("Ünï", "x&y=z"), ("-._~", True)]:
        expected_y = "" if y is None else ("true" if y is True else str(y))
        assert template.render({"x": x, "y": y}, url=True) == (
            f"http://h/a%20b/{quote(x, safe='')}/%41?q={quote(expected_y, safe='')}"
        )
    # Without url=True nothing is encoded: the text as written, values as text.
    assert template.render({"x": "a/b", "y": 1}) == "http://h/a b/a/b/%41?q=1"


@pytest.mark.parametrize("value", [".", ".."])
def test_a_dot_segment_value_is_refused_in_a_url_naming_the_field(value: str) -> None:
    from asyncio_ops.connectors.http._template import Template

    template = Template("http://h/customers/{cid}/orders", option="url")
    with pytest.raises(LookupKeyError, match=rf"field 'cid' is '{value}'"):
        template.render({"cid": value}, url=True)
    # dots inside a value stay (they do not make a dot segment), and outside URLs too
    assert template.render({"cid": "a..b"}, url=True) == "http://h/customers/a..b/orders"
    assert template.render({"cid": value}) == f"http://h/customers/{value}/orders"


@pytest.mark.asyncio
async def test_a_huge_value_in_the_url_gives_a_message_of_bounded_length(server: Server) -> None:
    # 50 MB in one path segment: the server refuses the request line; the error names the
    # request and what failed, and quotes the value only in part.
    async with HttpLookup(f"{server.base}/customers/{{id}}", max_retries=0) as lookup:
        with pytest.raises(LookupResponseError) as caught:
            await lookup.async_invoke({"id": "x" * 50_000_000})
    message = str(caught.value)
    assert len(message) <= MAX_MESSAGE
    assert message.startswith(f"GET {server.base}/customers/xxx")
    assert "characters cut" in message
    assert caught.value.status == 400
