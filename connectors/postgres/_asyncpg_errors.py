"""The one place where asyncpg's exceptions become the connectors' exceptions.

Every call into asyncpg (pool creation, acquire, fetch, close) runs inside
:func:`map_asyncpg_errors`. The mapping, checked in this order:

==========================================================  =========================
asyncpg / builtin                                           raised as
==========================================================  =========================
``TimeoutError`` (client timeout), ``QueryCanceledError``   LookupTimeout
(57014: ``statement_timeout``)
``InvalidPasswordError``, ``InvalidAuthorizationSpec...``   LookupAuthError
(class 28)
``PostgresConnectionError`` (class 08), operator            LookupConnectionError
intervention (class 57: admin/crash shutdown, cannot
connect now), ``TooManyConnectionsError`` (53300),
``InvalidCatalogNameError`` (3D000: no such database),
``OSError`` (refused, reset), ``ConnectionError``,
``InterfaceError`` on a closed connection or pool,
``InternalClientError`` (protocol state lost when the
connection broke mid-statement; the connection is dropped)
other ``PostgresError`` (syntax, undefined table, types),   LookupQueryError
``InterfaceError``, ``DataError`` (argument encoding)
==========================================================  =========================

``asyncio.CancelledError`` passes through untouched. Messages name the redacted
DSN and the SQLSTATE; every configured secret is scrubbed from them, including
the text of asyncpg's own message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg  # type: ignore[import-untyped,unused-ignore]

from .._exceptions import (
    ConnectorError,
    LookupAuthError,
    LookupConnectionError,
    LookupQueryError,
    LookupTimeout,
)
from .._redact import Scrubber

__all__ = ["is_query_error", "map_asyncpg_errors"]

# SQLSTATE classes whose errors mean "this connection or server is unusable now".
_CONNECTION_CLASSES = ("08", "57")
# too_many_connections: transient on a busy server; invalid_catalog_name: the DSN names a
# database the server does not have (a DSN that does not connect, as the preflight says)
_CONNECTION_STATES = frozenset({"53300", "3D000"})
_TIMEOUT_STATES = frozenset({"57014"})  # query_canceled, which statement_timeout raises


def _classify(exc: BaseException) -> type[ConnectorError] | None:
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        if state in _TIMEOUT_STATES:
            return LookupTimeout
        if state.startswith("28"):
            return LookupAuthError
        if state[:2] in _CONNECTION_CLASSES or state in _CONNECTION_STATES:
            return LookupConnectionError
        if isinstance(exc, asyncpg.PostgresConnectionError):
            return LookupConnectionError
        return LookupQueryError
    if isinstance(exc, TimeoutError):
        return LookupTimeout
    if isinstance(exc, asyncpg.InternalClientError):
        # The client lost track of the protocol, in practice because the connection broke
        # mid-statement; the lookup drops that connection, so a retry gets a fresh one.
        return LookupConnectionError
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc).lower()
        if "closed" in text or ("connection" in text and "lost" in text):
            return LookupConnectionError
        return LookupQueryError
    if isinstance(exc, OSError | ConnectionError):
        return LookupConnectionError
    return None


def is_query_error(exc: BaseException) -> bool:
    """Whether ``exc`` is about the SQL itself (mapped to LookupQueryError), not
    about the connection, the server's state, authentication or time."""
    return _classify(exc) is LookupQueryError


@contextmanager
def map_asyncpg_errors(action: str, where: str, scrub: Scrubber) -> Iterator[None]:
    """Translate asyncpg errors raised inside the block; ``action`` and ``where`` name them.

    ``where`` is already redacted (the DSN without password); ``scrub`` removes
    the password wherever else it might appear.
    """
    try:
        yield
    except asyncio.CancelledError:
        raise
    except ConnectorError:
        raise
    except Exception as exc:
        kind = _classify(exc)
        if kind is None:
            raise
        state = getattr(exc, "sqlstate", None)
        detail = f"{type(exc).__name__}" + (f" [{state}]" if state else "")
        text = str(exc) or "no message"
        if isinstance(exc, TimeoutError) and not str(exc):
            text = "timed out"
        raise kind(scrub(f"{action} on {where} failed: {detail}: {text}")) from exc
