"""Connector errors say whether the service was overloaded, for ``capacity="auto"``:
timeouts and 429/503 answers do, other failures do not."""

from __future__ import annotations

import pytest
from asyncio_ops.connectors import (
    LookupConnectionError,
    LookupQueryError,
    LookupResponseError,
    LookupTimeout,
)

from asyncio_ops import SignalsOverload


@pytest.mark.parametrize(
    ("error", "overload"),
    [
        (LookupTimeout("slow"), True),
        (LookupResponseError("busy", status=429), True),
        (LookupResponseError("down", status=503), True),
        (LookupResponseError("broken", status=500), False),
        (LookupResponseError("gone", status=404), False),
        (LookupConnectionError("refused"), False),
        (LookupQueryError("bad sql"), False),
    ],
)
def test_overload_is_declared(error: Exception, overload: bool) -> None:
    assert isinstance(error, SignalsOverload)
    assert error.overload is overload
