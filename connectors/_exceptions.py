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
    """

    retryable: ClassVar[bool] = False

    @property
    def overload(self) -> bool:
        return False


class LookupConnectionError(ConnectorError, ConnectionError):
    """The server could not be reached, or the connection was lost mid-call."""

    retryable: ClassVar[bool] = True


class LookupTimeout(ConnectorError, TimeoutError):
    """An I/O call exceeded its timeout (client-side, or a server statement timeout)."""

    retryable: ClassVar[bool] = True

    @property
    def overload(self) -> bool:
        return True


class LookupAuthError(ConnectorError, PermissionError):
    """The server refused the credentials. Retrying will not help."""


class LookupTLSError(ConnectorError):
    """TLS failed: the certificate did not verify or the handshake was refused."""


class LookupQueryError(ConnectorError):
    """The server rejected the query: bad SQL, unknown relation, wrong parameter type."""


class LookupAmbiguousError(LookupQueryError, ValueError):
    """A one-to-one lookup (``many=False``) found more than one match for a key."""


class LookupKeyError(ConnectorError, KeyError):
    """The input row has no usable key: a field is missing or its value is unhashable."""

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument as a repr; a message reads better plain.
        return str(self.args[0]) if self.args else ""


class LookupBudgetExceeded(ConnectorError):
    """A model lookup's ``max_total_tokens`` is spent: the row's request is not sent."""


class LookupResponseError(ConnectorError):
    """The server answered with a status that is not a result.

    ``status`` is the HTTP status; ``retry_after`` the delay (seconds) the server
    asked for, if any; ``body`` the first bytes of the response, kept out of the
    message because a server may echo request headers back.
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
    """A successful response whose body is not the JSON the lookup expects."""


def is_retryable(exc: BaseException | None) -> bool:
    """True when ``exc`` is a connector error that a later attempt may not repeat.

    Made for ``AsyncRetryStrategy(..., exception_predicate=is_retryable)``.
    """
    return isinstance(exc, ConnectorError) and bool(exc.retryable)


# Tracebacks, Spark's task errors and pickles name the module users import these from.
for _name in __all__:
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = "asyncio_ops.connectors"
