"""Shared fixtures: every async core test runs on the default loop and on uvloop; one
S3-compatible server for the tests of object storage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Callable[[str], str]]:
    """One S3-compatible server (moto's, from PyPI) for the test session, on 127.0.0.1.

    Yields ``location(path)``: the pyarrow URI of ``path`` in a bucket on it, with the
    server's endpoint and its (fake) credentials.
    """
    import logging
    import socket

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    try:
        fs, _ = pafs.FileSystem.from_uri(
            f"s3://testing:testing@aops-tests/x?{options}&allow_bucket_creation=true"
        )
        fs.create_dir("aops-tests")

        def location(path: str) -> str:
            return f"s3://testing:testing@aops-tests/{path}?{options}"

        yield location
    finally:
        server.stop()
