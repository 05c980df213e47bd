"""The one place where aiohttp's exceptions become the connectors' exceptions.

Every request the HTTP lookup sends runs inside :func:`map_aiohttp_errors`:

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

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from .._exceptions import (
    ConnectorError,
    LookupConnectionError,
    LookupTimeout,
    LookupTLSError,
)
from .._redact import Scrubber

__all__ = ["map_aiohttp_errors"]


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


@contextmanager
def map_aiohttp_errors(method: str, where: str, scrub: Scrubber) -> Iterator[None]:
    """Translate aiohttp errors raised inside the block; ``where`` is the redacted URL."""
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
        text = str(exc) or ("timed out" if isinstance(exc, TimeoutError) else "no message")
        raise kind(scrub(f"{method} {where} failed: {type(exc).__name__}: {text}")) from exc
