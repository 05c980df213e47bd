"""The exceptions the connectors raise, in one place.

::

    asyncio_ops.AsyncOpsError
    └── ConnectorError                          base; ``retryable`` says whether trying
        │                                       the same lookup again may succeed
        ├── LookupConnectionError (ConnectionError)
        │                                       cannot reach the server, or the
        │                                       connection broke mid-call (retryable)
        ├── LookupTimeout (TimeoutError)        an I/O call ran out of its timeout,
        │                                       client- or server-side (retryable)
        ├── LookupAuthError (PermissionError)   credentials refused (not retryable)
        ├── LookupTLSError                      certificate/TLS verification failed
        ├── LookupQueryError                    the server rejected the query (bad SQL,
        │   │                                   unknown table, wrong parameter type)
        │   └── LookupAmbiguousError (ValueError)
        │                                       a one-to-one lookup matched several rows
        ├── LookupKeyError (KeyError)           the input row lacks a key field, or the
        │                                       key value cannot be used (unhashable)
        ├── LookupBudgetExceeded                a model lookup's max_total_tokens is
        │                                       spent: the row is not sent (not retryable)
        └── LookupResponseError                 an HTTP status that is not a result;
            │                                   ``status``, ``retry_after``; retryable
            │                                   when the status is one of retry_statuses
            └── LookupDecodeError (ValueError)  a 2xx body that is not the expected JSON

Errors of asyncpg and aiohttp are translated into these at one boundary per
connector (``postgres._errors``, ``http._errors``) with
``raise ... from``; the original stays reachable as ``__cause__``. Messages never
contain a password, an Authorization header or any other configured secret.

Use :func:`is_retryable` as the exception predicate of an
``asyncio_ops.AsyncRetryStrategy`` to retry exactly the transient failures.
"""

from __future__ import annotations

from typing import ClassVar, Final

from asyncio_ops import AsyncOpsError

__all__ = [
    "ConnectorError",
    "LookupAmbiguousError",
    "LookupAuthError",
    "LookupBudgetExceeded",
    "LookupConnectionError",
    "LookupDecodeError",
    "LookupKeyError",
    "LookupQueryError",
    "LookupResponseError",
    "LookupTLSError",
    "LookupTimeout",
    "is_retryable",
]


OVERLOAD_STATUSES: Final = frozenset({429, 503})
"""HTTP statuses that signal an overloaded service (see ``ConnectorError.overload``)."""


class ConnectorError(AsyncOpsError):
    """Base class of connector failures.

    ``retryable`` is True when the same lookup may succeed if tried again
    (a broken connection, a timeout, a 503); the class sets the default, an
    instance may override it. ``overload`` is True when the error says the
    service is overloaded (a timeout, a 429 or 503 answer): with
    ``capacity="auto"`` the operator then cuts its limit
    (``asyncio_ops.SignalsOverload``).

    Example:

    >>> from asyncio_ops.connectors import ConnectorError, LookupTimeout, is_retryable
    >>> error = LookupTimeout("query ran out of query_timeout (60 s)")
    >>> isinstance(error, ConnectorError), error.retryable, error.overload
    (True, True, True)
    """

    retryable: ClassVar[bool] = False

    @property
    def overload(self) -> bool:
        return False


class LookupConnectionError(ConnectorError, ConnectionError):
    """The server could not be reached, or the connection was lost mid-call.

    Example::

        from asyncio_ops.connectors import LookupConnectionError

        try:
            await PostgresLookup("postgresql://db:5432/shop", query, key="id").open(ctx)
        except LookupConnectionError as exc:
            print(exc)  # names the DSN without its password; is_retryable(exc) is True
    """

    retryable: ClassVar[bool] = True


class LookupTimeout(ConnectorError, TimeoutError):
    """An I/O call exceeded its timeout (client-side, or a server statement timeout).

    Example::

        from asyncio_ops.connectors import LookupTimeout

        try:
            await lookup.async_invoke({"customer_id": 42})  # a stalled server
        except LookupTimeout as exc:
            print(exc)  # names the timeout option that ran out; is_retryable(exc) is True
    """

    retryable: ClassVar[bool] = True

    @property
    def overload(self) -> bool:
        return True


class LookupAuthError(ConnectorError, PermissionError):
    """The server refused the credentials. Retrying will not help.

    Example::

        from asyncio_ops.connectors import LookupAuthError

        try:
            ordered_wait(orders, PostgresLookup(dsn_with_a_wrong_password, query, key="id"),
                     timeout=5.0, output_schema="name string")  # preflight
        except LookupAuthError as exc:
            print(exc)  # names the DSN without its password: retrying will not help
    """


class LookupTLSError(ConnectorError):
    """TLS failed: the certificate did not verify or the handshake was refused.

    Example::

        from asyncio_ops.connectors import LookupTLSError

        try:
            await HttpLookup("https://self-signed.example/c/{id}").async_invoke({"id": 1})
        except LookupTLSError as exc:
            print(exc)  # names the URL; ca_file= trusts a private CA
    """


class LookupQueryError(ConnectorError):
    """The server rejected the query: bad SQL, unknown relation, wrong parameter type.

    Example::

        from asyncio_ops.connectors import LookupQueryError

        try:
            ordered_wait(orders, PostgresLookup(dsn, "SELECT id FROM no_such_table "
                     "WHERE id = ANY($1)", key="id"), timeout=5.0, output_schema="id long")
        except LookupQueryError as exc:
            print(exc)  # the server's message and SQLSTATE, raised by the preflight
    """


class LookupAmbiguousError(LookupQueryError, ValueError):
    """A one-to-one lookup (``many=False``) found more than one match for a key.

    Example::

        from asyncio_ops.connectors import LookupAmbiguousError

        # many=False (the default): a key matching two rows fails that row alone;
        # with on_error="error_column" it is an error row, the others are answered
        enriched = ordered_wait(orders, PostgresLookup(dsn, query, key="customer_id"),
                                timeout=5.0, output_schema="name string",
                                on_error="error_column")
    """


class LookupKeyError(ConnectorError, KeyError):
    """The input row has no usable key: a field is missing or its value is unhashable.

    Example:

    >>> from asyncio_ops.connectors import KeyFields, LookupKeyError
    >>> try:
    ...     KeyFields("customer_id", option="key").of({"id": 1})
    ... except LookupKeyError as exc:
    ...     print(exc)
    input row has no key field 'customer_id' (key='customer_id'); fields present: ['id']
    """

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument as a repr; a message reads better plain.
        return str(self.args[0]) if self.args else ""


class LookupBudgetExceeded(ConnectorError):
    """A model lookup's ``max_total_tokens`` is spent: the row's request is not sent.

    Example::

        from asyncio_ops.connectors import LookupBudgetExceeded

        try:
            await ChatLookup(base, "gpt-4o-mini", prompt="{text}",
                           max_total_tokens=10_000).async_invoke(row)
        except LookupBudgetExceeded as exc:
            print(exc)  # names max_total_tokens, the tokens spent and the prompt
    """


class LookupResponseError(ConnectorError):
    """The server answered with a status that is not a result.

    ``status`` is the HTTP status; ``retry_after`` the delay (seconds) the server
    asked for, if any; ``body`` the first bytes of the response, kept out of the
    message because a server may echo request headers back.

    Example:

    >>> from asyncio_ops.connectors import LookupResponseError, is_retryable
    >>> error = LookupResponseError("HTTP 429 from http://api/c/1", status=429, retry_after=2.0,
    ...                             retryable=True)
    >>> error.status, error.retry_after, error.overload, is_retryable(error)
    (429, 2.0, True, True)
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        body: bytes = b"",
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.body = body
        # Instance attribute shadows the ClassVar default on purpose: whether a
        # status is transient depends on the lookup's retry_statuses.
        self.retryable = retryable  # type: ignore[misc]

    @property
    def overload(self) -> bool:
        """429 Too Many Requests and 503 Service Unavailable say: fewer, please."""
        return self.status in OVERLOAD_STATUSES


class LookupDecodeError(LookupResponseError, ValueError):
    """A successful response whose body is not the JSON the lookup expects.

    Example::

        from asyncio_ops.connectors import LookupDecodeError

        try:
            await HttpLookup("http://api/c/{id}").async_invoke({"id": 1})  # 200, not JSON
        except LookupDecodeError as exc:
            print(exc)  # names the URL and what was expected
    """


def is_retryable(exc: BaseException | None) -> bool:
    """True when ``exc`` is a connector error that a later attempt may not repeat.

    Made for ``AsyncRetryStrategy(..., exception_predicate=is_retryable)``.

    Example:

    >>> from asyncio_ops import AsyncRetryStrategy
    >>> from asyncio_ops.connectors import LookupAuthError, LookupTimeout, is_retryable
    >>> is_retryable(LookupTimeout("slow")), is_retryable(LookupAuthError("refused"))
    (True, False)
    >>> retry = AsyncRetryStrategy.fixed_delay(3, 200, exception_predicate=is_retryable)
    """
    return isinstance(exc, ConnectorError) and bool(exc.retryable)


# Tracebacks, Spark's task errors and pickles name the module users import these from.
for _name in __all__:
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = "asyncio_ops.connectors"
