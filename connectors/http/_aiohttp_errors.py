"""The one place where aiohttp's exceptions become the connectors' exceptions.

Every request the HTTP lookup sends goes through :func:`aiohttp_error`, which
turns an exception raised while sending it into the connectors' own:

=====================================================  ======================
aiohttp / builtin                                      raised as
=====================================================  ======================
``TimeoutError`` (``ServerTimeoutError``, total        LookupTimeout
timeout)
``ClientSSLError`` (certificate, handshake)            LookupTLSError
``ClientConnectionError`` (refused, reset,             LookupConnectionError
disconnected), ``ClientPayloadError`` (truncated
body), ``OSError``
``InvalidURL``, other ``ClientError``                  ConnectorError
=====================================================  ======================

Status codes are not exceptions at this level (the lookup decides what a status
means). Messages name the method and the redacted URL; every configured secret
(header values, URL password, credential query values) is scrubbed from them.
Request headers are never part of a message.
"""

from __future__ import annotations

import aiohttp

from .._exceptions import (
    ConnectorError,
    LookupConnectionError,
    LookupTimeout,
    LookupTLSError,
)
from .._redact import Scrubber, redact_url

__all__ = ["aiohttp_error"]


def _classify(exc: BaseException) -> type[ConnectorError] | None:
    # Order matters: ServerTimeoutError is also a ClientConnectionError, and
    # ClientSSLError is also a connection error.
    if isinstance(exc, TimeoutError):
        return LookupTimeout
    if isinstance(exc, aiohttp.ClientSSLError):
        return LookupTLSError
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | OSError):
        return LookupConnectionError
    if isinstance(exc, aiohttp.ClientError):
        return ConnectorError
    return None


def aiohttp_error(
    exc: BaseException, method: str, url: str, scrub: Scrubber
) -> ConnectorError | None:
    """The connectors' exception for ``exc``, raised sending ``method url``; None if
    ``exc`` is not an aiohttp or network error (it then propagates as it is).

    The caller raises the result ``from exc``. ``url`` is redacted here, only
    when a request failed: a successful request never pays for it.
    """
    if isinstance(exc, ConnectorError):
        return None
    kind = _classify(exc)
    if kind is None:
        return None
    text = str(exc) or ("timed out" if isinstance(exc, TimeoutError) else "no message")
    return kind(scrub(f"{method} {redact_url(url)} failed: {type(exc).__name__}: {text}"))
