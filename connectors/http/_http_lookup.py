"""HttpLookup: JSON lookups over HTTP on one aiohttp session per worker.

Per input row the lookup renders a request from templates (URL, query
parameters, JSON body; see :mod:`asyncio_ops.connectors.http._template`), sends it (rate
limited, retried on transient statuses), decodes the JSON answer into rows.
With :class:`HttpBatch`, the keys of concurrent rows go to a batch endpoint in
one request and the answer is fanned out by a key field of each item.

One class with one job, :class:`HttpLookup` (with :class:`HttpBatch`, its batch
endpoint's description, and its session settings).
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json as jsonlib
import math
import random
import ssl
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

import aiohttp
from yarl import URL

from asyncio_ops import ConfigurationError, PreflightContext
from asyncio_ops.options import at_least, seconds

from .._base import BaseLookup, Row
from .._batching import BatchStatistics, KeyBatcher
from .._cache import LookupCache
from .._exceptions import (
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupResponseError,
    LookupTimeout,
)
from .._rate_limit import RateLimit, rate_limit_option
from .._redact import Scrubber, is_sensitive_name, redact_headers, redact_url, url_secrets
from .._resources import SharedResources
from .._slow_down import SLOW_DOWN, pace_of
from ._aiohttp_errors import aiohttp_error
from ._template import JsonTemplate, ParamsTemplate, Template, text_of

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HttpBatch", "HttpLookup", "active_sessions", "parse_retry_after"]

_SESSION_CLOSE_TIMEOUT: Final = 10.0
# Response bytes kept on an error for diagnosis (never put into the message).
_ERROR_BODY_BYTES: Final = 1024
_USER_AGENT: Final = "asyncio_ops-connectors/0.1"
# Statuses whose Retry-After header is honoured (RFC 9110 §10.2.3 defines it for 503
# and 3xx; RFC 6585 for 429).
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503})

Rows = tuple[Row, ...]
_EMPTY: Final[Rows] = ()


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or HTTP-date).

    A date in the past gives 0; an unparseable or missing value gives None.
    ``now`` (epoch seconds) defaults to the wall clock: HTTP dates are wall time.

    Example:

    >>> from asyncio_ops.connectors.http import parse_retry_after
    >>> parse_retry_after("120"), parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT")  # in the past
    (120.0, 0.0)
    >>> parse_retry_after("soon") is None
    True
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class HttpBatch:
    """A batch endpoint: many keys per request, answers fanned out by ``result_key``.

    ``key``: the input row field holding the key. ``result_key``: the field of
    each response item holding the key it answers (matched as text, so ``7``
    and ``"7"`` are the same key). Keys travel in the query parameter ``param``
    (joined by ``separator``, or as a repeated parameter when ``separator`` is
    None) or in the JSON body field ``json_field`` (as a list). ``max_size``
    keys per request at most; ``max_delay`` seconds a key waits for others.

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors.http import HttpBatch, HttpLookup
    >>> from asyncio_ops.services.customers import ServiceThread
    >>> async def main(base):  # GET /customers?ids=1,2 -> {"items": [...]}: one request
    ...     batched = HttpLookup(f"{base}/customers", result_path="items",
    ...                          batch=HttpBatch(key="id", result_key="id", param="ids"))
    ...     async with batched:
    ...         rows = await asyncio.gather(*(batched.async_invoke({"id": i}) for i in (1, 2)))
    ...         return [r[0]["name"] for r in rows], batched.statistics().batching.batches
    >>> with ServiceThread() as service:
    ...     asyncio.run(main(service.url))
    (['customer-1', 'customer-2'], 1)
    """

    key: str
    result_key: str
    param: str | None = None
    json_field: str | None = None
    separator: str | None = ","
    max_size: int = 100
    max_delay: float = 0.002

    def __post_init__(self) -> None:
        if (self.param is None) == (self.json_field is None):
            raise ConfigurationError("HttpBatch needs exactly one of param= or json_field=")
        if not self.key or not self.result_key:
            raise ConfigurationError("HttpBatch key and result_key must be field names")
        at_least(self.max_size, "HttpBatch max_size", 1)
        seconds(self.max_delay, "HttpBatch max_delay", high=60, low_ok=True)


# -- per-process shared resources ------------------------------------------------------


@dataclass(frozen=True)
class _SessionSettings:
    max_connections: int
    verify_ssl: bool
    ca_file: str | None


async def _create_session(key: Hashable) -> aiohttp.ClientSession:
    assert isinstance(key, _SessionSettings)
    tls: ssl.SSLContext | bool
    if key.ca_file is not None:
        tls = ssl.create_default_context(cafile=key.ca_file)
    else:
        tls = key.verify_ssl  # True: the default verifying context; False: no verification
    connector = aiohttp.TCPConnector(limit=key.max_connections, ssl=tls)
    # No session-wide timeout: each request carries its own.
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        headers={"User-Agent": _USER_AGENT},
        raise_for_status=False,
    )


async def _close_session(session: aiohttp.ClientSession) -> None:
    try:
        await asyncio.wait_for(session.close(), _SESSION_CLOSE_TIMEOUT)
    except asyncio.CancelledError:
        raise
    except Exception:  # closing is best effort; the connector drops its sockets anyway
        return


def _abandon_session(session: aiohttp.ClientSession) -> None:
    # Loop gone (exit): nothing can be awaited. Close the sockets directly.
    connector = session.connector
    if connector is not None:
        connector._close(abort_ssl=True)  # the synchronous part of close(); no loop needed


_SESSIONS: Final[SharedResources[aiohttp.ClientSession]] = SharedResources(
    "aiohttp sessions", create=_create_session, aclose=_close_session, terminate=_abandon_session
)


def active_sessions() -> int:
    """How many aiohttp sessions this process holds open (for tests and metrics).

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors.http import HttpLookup, active_sessions
    >>> async def main():
    ...     async with HttpLookup("http://api/customers/{id}"):
    ...         return active_sessions()  # one aiohttp session in this process
    >>> asyncio.run(main()), active_sessions()
    (1, 0)
    """
    return _SESSIONS.active()


@dataclass
class _Runtime:
    session: aiohttp.ClientSession
    batcher: KeyBatcher[Hashable, Rows] | None


class HttpLookup(BaseLookup[_Runtime]):
    """Look rows up over HTTP; JSON answers become result rows.

    Request: ``url`` (template; values percent-encoded), ``params`` (query
    parameters, templates or constants), ``json`` (a body template; its strings
    may hold placeholders), ``headers`` (constant; credential-like values are
    never shown in reprs or errors), ``method``.

    Answer: a 2xx JSON body; ``result_path`` (dotted, e.g. ``"data.items"``)
    selects a part of it. An object gives one row, an array one row per item,
    ``null`` or a missing path no rows; a scalar (or a non-object item) becomes
    ``{value_field: scalar}``. 404 gives no rows when ``not_found_empty`` (a key
    that does not exist is not an error for a lookup); any other status that is
    not retried raises :class:`~asyncio_ops.connectors.LookupResponseError`. Result rows
    hold the response fields only, unless ``include_input=True``.

    Transient failures — a status in ``retry_statuses``, a broken connection, a
    request timeout — are retried up to ``max_retries`` times inside
    ``async_invoke`` (so within the operator's per-element timeout), after
    exponential backoff from ``backoff`` up to ``max_backoff`` seconds with
    jitter. A 429 or 503 (when in ``retry_statuses``) asks the client to slow
    down: it is sent again, as often as it takes within the operator's timeout,
    not counted against ``max_retries``, after its ``Retry-After`` (at most
    ``max_retry_after`` seconds: a longer one is clipped and logged); without a
    ``rate_limit`` the process's pace for the host slows down (halved, then
    raised again as answers come: ``connectors/_slow_down.py``),
    with one the limit is paused for every process sharing it. Retries assume
    the request is a read: safe to repeat.

    Limits per worker process: ``max_connections`` sockets in the one shared
    session; ``rate_limit`` requests per second (retries included) for every
    HttpLookup to the same host with the same limit, with bursts of at most
    ``rate_burst`` (a :class:`~asyncio_ops.connectors.RateLimit` of this process); or a
    :class:`~asyncio_ops.connectors.RateLimit` of one's own, per process or
    shared by every executor through Redis, which a 429 or 503 with Retry-After
    pauses for every process sharing it. ``timeout`` seconds per request attempt (connect to last
    byte). TLS certificates are verified unless ``verify_ssl=False``;
    ``ca_file`` trusts a private CA.

    ``batch``: an :class:`HttpBatch`; the templates may then not use row fields.

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> from asyncio_ops.services.customers import ServiceThread
    >>> async def main(base):
    ...     async with HttpLookup(f"{base}/customers/{{id}}") as customers:
    ...         return [await customers.async_invoke({"id": i}) for i in (17, 10**9)]
    >>> with ServiceThread() as service:  # a local customer API; 404 for an unknown id
    ...     asyncio.run(main(service.url))
    [[{'id': 17, 'name': 'customer-17', 'tier': 'bronze', 'country': 'US'}], []]

    In Spark: ``unordered_wait(orders, HttpLookup(...), timeout=30.0,
    output_schema="name string, tier string")`` (docs/enrich-http.md).
    """

    def __init__(
        self,
        url: str,
        *,
        method: str = "GET",
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        batch: HttpBatch | None = None,
        rate_limit: float | RateLimit | None = None,
        rate_burst: int = 1,
        max_connections: int = 100,
        timeout: float = 10.0,
        retry_statuses: Sequence[int] = (429, 500, 502, 503, 504),
        max_retries: int = 3,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        max_retry_after: float = 60.0,
        result_path: str | None = None,
        value_field: str = "value",
        not_found_empty: bool = True,
        include_input: bool = False,
        verify_ssl: bool = True,
        ca_file: str | None = None,
        cache: LookupCache[Any] | None = None,
    ) -> None:
        super().__init__(cache=cache)
        self.method = str(method).upper()
        if not self.method.isalpha():
            raise ConfigurationError(f"method must be an HTTP method name, got {method!r}")
        self.url = Template(url, option="url")
        scheme = url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            raise ConfigurationError(f"url must start with http:// or https://, got {url!r}")
        self.params = ParamsTemplate(params)
        self.json = JsonTemplate(json) if json is not None else None
        self.headers: dict[str, str] = {str(k): str(v) for k, v in (headers or {}).items()}
        self.batch = batch
        if batch is not None:
            if not isinstance(batch, HttpBatch):
                raise ConfigurationError(f"batch must be an HttpBatch, got {batch!r}")
            per_row = self.url.fields + self.params.fields + (self.json.fields if self.json else ())
            if per_row:
                raise ConfigurationError(
                    f"with batch=, the request cannot use row fields {sorted(set(per_row))!r}: "
                    "one request serves many rows; keys go in HttpBatch(param=/json_field=)"
                )
            if (
                batch.json_field is not None
                and self.json is not None
                and not isinstance(json, Mapping)
            ):
                raise ConfigurationError("with HttpBatch(json_field=), json must be an object")
        self.rate_burst = at_least(rate_burst, "rate_burst", 1)
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
        # a RateLimit (per process, or shared through Redis), or a number: requests per
        # second for this process and host, a RateLimit of rate_burst at once
        self.limit = rate_limit_option(rate_limit, burst=self.rate_burst, name=f"http:{host}")
        # whose pace this lookup keeps without a RateLimit: the host's
        self._pace_key = ("http", host)
        self._pace_name = f"HttpLookup {host}"
        self.rate_limit = rate_limit
        self.max_connections = at_least(max_connections, "max_connections", 1)
        # Not ``self.timeout``: that name is AsyncFunction.timeout(), the operator's hook.
        self.request_timeout = seconds(timeout, "timeout")
        self._client_timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        self.retry_statuses = frozenset(int(s) for s in retry_statuses)
        self.max_retries = at_least(max_retries, "max_retries", 0)
        self.backoff = seconds(backoff, "backoff", low_ok=True)
        self.max_backoff = seconds(max_backoff, "max_backoff", low_ok=True)
        self.max_retry_after = seconds(max_retry_after, "max_retry_after", low_ok=True)
        self.result_path = tuple(result_path.split(".")) if result_path else ()
        self.value_field = value_field
        self.not_found_empty = bool(not_found_empty)
        self.include_input = bool(include_input)
        self.output_columns: tuple[str, ...] | None = None
        if ca_file is not None and not verify_ssl:
            raise ConfigurationError("ca_file= needs verify_ssl=True")
        self.verify_ssl = bool(verify_ssl)
        self.ca_file = ca_file
        self._session_settings = _SessionSettings(self.max_connections, self.verify_ssl, ca_file)
        self._scrub = Scrubber(self._secrets(url, params))
        # the templates as given (a credential-like constant masked), for cache_identity
        self._params_shown = {
            str(k): "***" if is_sensitive_name(str(k)) and "{" not in str(v) else repr(v)
            for k, v in (params or {}).items()
        }
        self._json_shown = jsonlib.dumps(json, sort_keys=True, default=repr)

    def _secrets(self, url: str, params: Mapping[str, Any] | None) -> list[str]:
        found = url_secrets(url)
        basic = _basic_credentials(url)
        if basic is not None:
            # aiohttp sends URL userinfo as "Authorization: Basic <b64>"; a server that
            # echoes the header back would otherwise leak the password, merely encoded.
            found.append(basic)
        for name, value in self.headers.items():
            if is_sensitive_name(name):
                found.append(value)
                # "Bearer <token>", "Basic <b64>": the credential alone may be quoted too.
                found.extend(value.split()[1:])
        for name, value in (params or {}).items():
            if is_sensitive_name(str(name)) and isinstance(value, str) and "{" not in value:
                found.append(value)
        return found

    # -- lifecycle ---------------------------------------------------------------------
    async def _open_runtime(self) -> _Runtime:
        session = await _SESSIONS.acquire(self._session_settings)
        batcher: KeyBatcher[Hashable, Rows] | None = None
        if self.batch is not None:
            batcher = KeyBatcher(
                self._fetch_batch,
                max_size=self.batch.max_size,
                max_delay=self.batch.max_delay,
                missing=lambda: _EMPTY,
            )
        return _Runtime(session=session, batcher=batcher)

    async def _close_runtime(self, runtime: _Runtime) -> None:
        try:
            if runtime.batcher is not None:
                await runtime.batcher.aclose()
        finally:
            await _SESSIONS.release(self._session_settings)

    def _runtime_batch_statistics(self, runtime: _Runtime) -> BatchStatistics:
        if runtime.batcher is None:
            return BatchStatistics(0, 0, 0, 0, 0)
        return runtime.batcher.statistics()

    # -- lookups -----------------------------------------------------------------------
    def request_fields(self) -> tuple[str, ...]:
        """The row fields a request takes: the batch key, or every field of the URL, the
        query and the body templates (a NULL in any of them sends no request)."""
        if self.batch is not None:
            return (self.batch.key,)
        fields = self.url.fields + self.params.fields + (self.json.fields if self.json else ())
        return tuple(dict.fromkeys(fields))

    def cache_identity(self) -> dict[str, Any]:
        """What decides an answer besides the row's values: the method, the URL, query
        and body templates, the headers (credential values masked: a rotated token asks
        the same question), the batch endpoint and how the answer is read."""
        return {"method": self.method, "url": redact_url(self.url.text),
                "params": self._params_shown, "json": self._json_shown,
                "headers": redact_headers(self.headers), "batch": repr(self.batch),
                "result_path": self.result_path, "value_field": self.value_field,
                "not_found_empty": self.not_found_empty}  # fmt: skip

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        """The rows the server answers for ``value`` (see the class docstring)."""
        runtime = self._require_runtime()
        if self.batch is not None:
            batcher = runtime.batcher
            assert batcher is not None
            key = value[self.batch.key]

            async def load() -> Rows:
                return await batcher.load(key)

            items = await self._cached(key, load)
        else:
            url = self.url.render(value, url=True)
            params = self.params.render(value)
            body = self.json.render(value) if self.json is not None else None
            if self.cache is None:
                items = self._rows_of(await self._send(runtime, url, params, body))
            else:

                async def fetch() -> Rows:
                    return self._rows_of(await self._send(runtime, url, params, body))

                cache_key = (url, tuple(params), _canonical(body))
                items = await self._cached(cache_key, fetch)
        columns = self.output_columns
        if columns is not None:  # the declared fields only, as Spark's from_json
            items = tuple({c: item[c] for c in columns if c in item} for item in items)
        if self.include_input:
            return [{**value, **item} for item in items]
        return [dict(item) for item in items]

    def preferred_chunk_rows(self) -> int | None:
        """With a batch endpoint, one request's keys (``HttpBatch.max_size``) per chunk of
        the columnar path; None without one (rows one at a time, by the templates)."""
        return self.batch.max_size if self.batch is not None else None

    def preferred_capacity(self) -> int:
        """Chunks (one request each) in flight by default: one per connection."""
        return self.max_connections

    async def lookup_many(self, batch: pa.RecordBatch) -> tuple[Any, dict[str, Any]]:
        """The answers of a chunk of rows as Arrow columns (batch endpoint only).

        The distinct keys of the ``HttpBatch.key`` column that the cache does not
        hold go out as requests of at most ``max_size`` keys each, concurrently;
        each row gets its key's items (several fan out, none drops the row). Only
        the key column is read. Returns ``(row_index, columns)``: the declared
        output columns (or the first item's fields), a field an item lacks null.
        """
        spec = self.batch
        if spec is None:
            raise ConfigurationError(
                "HttpLookup answers Arrow chunks only with batch=HttpBatch(...): "
                "without it every row renders its own request (leave chunk_size at 'auto')"
            )
        self._require_runtime()
        if spec.key not in batch.schema.names:
            raise ConfigurationError(
                f"HttpBatch(key={spec.key!r}) is not a column of the input "
                f"(columns: {batch.schema.names})"
            )
        keys = batch.column(spec.key).to_pylist()
        known = await self._matches_of(keys, self._fetch_batch, spec.max_size)
        return self._columns_of(keys, known, self.output_columns)

    def bind_output_columns(self, columns: Sequence[str]) -> None:
        """Answer only the declared output columns: other JSON fields are left out, a
        declared field an answer lacks is null (as Spark's ``from_json``)."""
        self.output_columns = tuple(columns)

    async def preflight(self, context: PreflightContext) -> None:
        """Check on the driver, before any Spark job, what needs no data
        (:class:`asyncio_ops.SupportsPreflight`): the input has every field the request
        templates use and the batch key (else LookupKeyError naming it), and the endpoint
        is reachable: one ``HEAD`` request, with the lookup's headers and TLS settings,
        within ``timeout``, redirects not followed, on a session of its own closed
        afterwards, to the URL (the URL up to the last ``/`` before its first placeholder
        when it has placeholders; none when a placeholder is in the host). Reachable
        means that an HTTP server answered, whatever the status: a 404 or a 405 for
        the prefix, or a 401, says nothing of the lookups themselves, which need a
        row's values. A refused connection, an unknown host, a failed TLS
        verification or no answer in time raise LookupConnectionError, LookupTLSError
        or LookupTimeout naming the URL (without credentials); nothing is retried."""
        fields = list(self.url.fields) + list(self.params.fields)
        fields += list(self.json.fields) if self.json is not None else []
        fields += [self.batch.key] if self.batch is not None else []
        present = context.input_schema.names
        for name in fields:
            if name not in present:
                used = "the batch key" if self.batch is not None else "the request template"
                raise LookupKeyError(
                    f"input has no field {name!r} used by {used}; fields present: "
                    f"{sorted(present)!r}"
                )
        url = self._preflight_url()
        if url is None:
            return
        session = await _create_session(self._session_settings)
        try:
            async with session.request(
                "HEAD",
                URL(url, encoded=True),
                headers=self.headers,
                timeout=self._client_timeout,
                allow_redirects=False,
            ):
                pass  # any status: an HTTP server answered
        except Exception as exc:
            mapped = aiohttp_error(exc, "HEAD", url, self._scrub)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            await _close_session(session)

    def service_endpoint(self) -> str | None:
        """The URL's origin (scheme, host and port); None when a placeholder is in it."""
        parts = urlsplit(self.url.url_prefix())
        if self.url.fields and "/" not in parts.path:  # the placeholder is in the origin
            return None
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        return f"http {parts.scheme}://{parts.hostname}:{port}"

    def _preflight_url(self) -> str | None:
        """Where :meth:`preflight` sends its request (None: the host is a placeholder)."""
        if not self.url.fields:
            return self.url.url_prefix()
        parts = urlsplit(self.url.url_prefix())
        if "/" not in parts.path:  # the placeholder is in the host or the port
            return None
        return f"{parts.scheme}://{parts.netloc}{parts.path[: parts.path.rfind('/') + 1]}"

    async def _fetch_batch(self, keys: Sequence[Hashable]) -> dict[Hashable, Rows]:
        """One request for ``keys``; the items grouped back by ``result_key``."""
        runtime = self._require_runtime()
        batch = self.batch
        assert batch is not None
        url = self.url.render({}, url=True)
        params = self.params.render({})
        body = self.json.render({}) if self.json is not None else None
        if batch.param is not None:
            texts = [text_of(k) for k in keys]
            if batch.separator is not None:
                params.append((batch.param, batch.separator.join(texts)))
            else:
                params.extend((batch.param, t) for t in texts)
        else:
            assert batch.json_field is not None
            body = {**(body or {}), batch.json_field: list(keys)}
        items = self._rows_of(await self._send(runtime, url, params, body))
        index: dict[str, list[Row]] = {}
        for item in items:
            if batch.result_key not in item:
                raise LookupDecodeError(
                    f"{self.method} {redact_url(url)}: batch answer item has no "
                    f"{batch.result_key!r} field to match keys on",
                    status=200,
                )
            index.setdefault(text_of(item[batch.result_key]), []).append(item)
        return {k: tuple(index.get(text_of(k), ())) for k in keys}

    async def _send(
        self, runtime: _Runtime, url: str, params: list[tuple[str, str]], body: Any
    ) -> Any:
        """Send one request, retrying transient failures; the decoded JSON (or None on 404).

        Raises LookupResponseError, LookupDecodeError, LookupConnectionError,
        LookupTimeout, LookupTLSError, ConnectorError.
        """
        attempt = 0
        limit = self.limit
        # no RateLimit: the process's pace for this host, learned from its 429s and 503s
        pace = pace_of(self._pace_key, self._pace_name) if limit is None else None
        while True:
            if pace is not None and not pace.free():
                self._throttle_waited += await pace.wait()
            try:
                if limit is None:  # the common case: no context manager per request
                    answer = await self._attempt(runtime, url, params, body)
                else:
                    async with self._limited(limit):
                        answer = await self._attempt(runtime, url, params, body)
            except (LookupResponseError, LookupConnectionError, LookupTimeout) as exc:
                status = exc.status if isinstance(exc, LookupResponseError) else None
                retry_after = exc.retry_after if isinstance(exc, LookupResponseError) else None
                if status in SLOW_DOWN and exc.retryable:  # sent again, not counted
                    assert status is not None
                    backoff = self._backoff(attempt)
                    await self._slowed_down(pace, limit, status, exc, retry_after,
                                            self.max_retry_after, backoff)  # fmt: skip
                    continue
                if not exc.retryable or attempt >= self.max_retries:
                    raise
                delay = self._backoff(attempt)
            else:
                if pace is not None:
                    pace.answered()
                return answer
            attempt += 1
            await self._before_retry(delay, status)

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: retries of many rows spread out."""
        delay: float = min(self.max_backoff, self.backoff * 2**attempt)
        return delay * random.uniform(0.5, 1.0)

    async def _attempt(
        self, runtime: _Runtime, url: str, params: list[tuple[str, str]], body: Any
    ) -> Any:
        # The URL is redacted for a message only when there is one to write.
        try:
            async with runtime.session.request(
                self.method,
                URL(url, encoded=True),  # values are encoded by the template already
                params=params or None,
                json=body,
                headers=self.headers,
                timeout=self._client_timeout,
            ) as response:
                status = response.status
                if 200 <= status < 300:
                    raw = await response.read()
                    return self._decode(raw, status, url)
                if status == 404 and self.not_found_empty:
                    return None
                head = await response.content.read(_ERROR_BODY_BYTES)
                retry_after = (
                    parse_retry_after(response.headers.get("Retry-After"))
                    if status in _RETRY_AFTER_STATUSES
                    else None
                )
                reason = self._scrub(response.reason or "")
                raise LookupResponseError(
                    f"{self.method} {redact_url(url)} answered {status} {reason}".rstrip(),
                    status=status,
                    retry_after=retry_after,
                    body=head,
                    retryable=status in self.retry_statuses,
                )
        except Exception as exc:
            mapped = aiohttp_error(exc, self.method, url, self._scrub)
            if mapped is None:
                raise
            raise mapped from exc

    def _decode(self, raw: bytes, status: int, url: str) -> Any:
        if not raw.strip():
            return None  # 204 or an empty 200: nothing found
        try:
            return jsonlib.loads(raw)
        except ValueError as exc:
            raise LookupDecodeError(
                f"{self.method} {redact_url(url)} answered {status} with a body that is not "
                f"JSON: {exc}",
                status=status,
                body=raw[:_ERROR_BODY_BYTES],
            ) from exc

    def _rows_of(self, document: Any) -> Rows:
        node = document
        for part in self.result_path:
            if not isinstance(node, Mapping):
                node = None
                break
            node = node.get(part)
        if node is None:
            return _EMPTY
        items = node if isinstance(node, list) else [node]
        return tuple(
            dict(item) if isinstance(item, Mapping) else {self.value_field: item} for item in items
        )

    def __repr__(self) -> str:
        return (
            f"HttpLookup({self.method} {redact_url(self.url.text)!r}, "
            f"headers={redact_headers(self.headers)!r}, batch={self.batch!r}, "
            f"rate_limit={self.rate_limit!r})"
        )


def _basic_credentials(url: str) -> str | None:
    """The base64 credentials aiohttp derives from ``url``'s userinfo, if it has a password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if not parts.password:
        return None
    token = f"{unquote(parts.username or '')}:{unquote(parts.password)}"
    return base64.b64encode(token.encode("latin1", "replace")).decode("ascii")


def _canonical(body: Any) -> str | None:
    if body is None:
        return None
    return jsonlib.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
