"""Fixtures of the state tests: one factory per backend kind, parametrised."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncio_ops.state import (
    HeapKeyedStateBackend,
    KeyedStateBackend,
    KeyGroupRange,
    RocksDBKeyedStateBackend,
)
from asyncio_ops.testing import ManualClock

BackendFactory = Callable[..., KeyedStateBackend]
# "heap-py": the heap backend with its C accelerator off (the fallback without a compiler)
BACKEND_KINDS = ("heap", "heap-py", "rocksdb")


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """Build heap backends without the C accelerator (``ASYNCIO_OPS_PURE_PYTHON=1``)."""
    before = os.environ.get("ASYNCIO_OPS_PURE_PYTHON")
    os.environ["ASYNCIO_OPS_PURE_PYTHON"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ASYNCIO_OPS_PURE_PYTHON"]
        else:
            os.environ["ASYNCIO_OPS_PURE_PYTHON"] = before


def make_factory(kind: str, tmp_path: Path, opened: list[KeyedStateBackend]) -> BackendFactory:
    counter = itertools.count()

    def make(
        *,
        max_parallelism: int = 128,
        key_group_range: KeyGroupRange | None = None,
        clock: Any = None,
    ) -> KeyedStateBackend:
        kgr = (
            key_group_range
            if key_group_range is not None
            else KeyGroupRange(0, max_parallelism - 1)
        )
        backend: KeyedStateBackend
        if kind in ("heap", "heap-py"):
            with pure_python() if kind == "heap-py" else contextlib.nullcontext():
                backend = HeapKeyedStateBackend(
                    max_parallelism=max_parallelism, key_group_range=kgr, clock=clock
                )
        else:
            backend = RocksDBKeyedStateBackend(
                path=tmp_path / f"rocks-{next(counter)}",
                max_parallelism=max_parallelism,
                key_group_range=kgr,
                clock=clock,
            )
        opened.append(backend)
        return backend

    return make


@pytest.fixture(params=BACKEND_KINDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_backend(backend_kind: str, tmp_path: Path) -> Iterator[BackendFactory]:
    """Factory of backends of the parametrised kind; all closed after the test."""
    opened: list[KeyedStateBackend] = []
    yield make_factory(backend_kind, tmp_path, opened)
    for b in opened:
        b.close()


@pytest.fixture
def any_backend_factory(tmp_path: Path) -> Iterator[Callable[[str], BackendFactory]]:
    """``factory(kind)`` for tests that mix backend kinds (heap -> RocksDB and back)."""
    opened: list[KeyedStateBackend] = []
    factories: dict[str, BackendFactory] = {}

    def factory(kind: str) -> BackendFactory:
        if kind not in factories:
            factories[kind] = make_factory(kind, tmp_path / kind, opened)
        return factories[kind]

    yield factory
    for b in opened:
        b.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000.0)


@pytest.fixture
def backend(make_backend: BackendFactory, clock: ManualClock) -> KeyedStateBackend:
    return make_backend(clock=clock)
