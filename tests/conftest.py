"""Shared fixtures: every async core test runs on the default loop and on uvloop; one
S3-compatible server for the tests of object storage."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

T = TypeVar("T")

# Local copies of checkpoint files (asyncio_ops._storage._local_copies) go to this session's own
# directory, removed at exit, not the machine's temporary directory. Set before any
# SparkSession starts, so Spark's Python workers inherit it.
_LOCAL_COPIES = tempfile.mkdtemp(prefix="aops-test-local-copies-")
os.environ.setdefault("ASYNCIO_OPS_LOCAL_COPIES", _LOCAL_COPIES)
atexit.register(shutil.rmtree, _LOCAL_COPIES, True)
# Parked RocksDB databases (asyncio_ops._runtime._parked) likewise.
_PARKED = tempfile.mkdtemp(prefix="aops-test-parked-")
os.environ.setdefault("ASYNCIO_OPS_PARKED", _PARKED)
atexit.register(shutil.rmtree, _PARKED, True)

Runner = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner[Any]:
    """Run a coroutine to completion on a fresh loop of the parametrised kind."""

    def runner(coro: Coroutine[Any, Any, T]) -> T:
        if request.param == "uvloop":
            return uvloop.run(coro)
        return asyncio.run(coro)

    return runner


class S3Server:
    """An S3-compatible server on 127.0.0.1 (moto's) and the requests it has served.

    ``server(path)`` is the pyarrow URI of ``path`` in its bucket, with the endpoint
    and (fake) credentials; ``requests`` holds ``"METHOD /bucket/key?query"`` of each
    request since the test cleared it, read from the server's own log.
    """

    def __init__(self, port: int) -> None:
        self.options = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        self.requests: list[str] = []

    def __call__(self, path: str) -> str:
        return f"s3://testing:testing@aops-tests/{path}?{self.options}"


class _RequestLog(logging.Handler):
    def __init__(self, server: S3Server) -> None:
        super().__init__()
        self.server = server

    def emit(self, record: logging.LogRecord) -> None:
        line = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())  # the log's colours
        if line.count('"') >= 2:  # 127.0.0.1 - - [time] "GET /path HTTP/1.1" 200 -
            method, target = line.split('"')[1].split(" ")[:2]
            self.server.requests.append(f"{method} {target}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One S3-compatible server (moto's, from PyPI) for the test session (see S3Server)."""
    import socket

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3 = S3Server(port)
    log = logging.getLogger("werkzeug")
    handler = _RequestLog(s3)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # one line per request on stderr otherwise
    server.start()
    try:
        fs, _ = pafs.FileSystem.from_uri(f"{s3('x')}&allow_bucket_creation=true")
        fs.create_dir("aops-tests")
        yield s3
    finally:
        server.stop()
        log.removeHandler(handler)
