"""Shared fixtures: every async core test runs on the default loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop

T = TypeVar("T")

Runner = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner[Any]:
    """Run a coroutine to completion on a fresh loop of the parametrised kind."""

    def runner(coro: Coroutine[Any, Any, T]) -> T:
        if request.param == "uvloop":
            return uvloop.run(coro)
        return asyncio.run(coro)

    return runner
