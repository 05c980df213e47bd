"""Test doubles that are real async functions whose completion the test controls, the
rule for a missing real dependency (:func:`unavailable`), the environment of the
JVMs the tests start (:data:`JVM_OPTIONS`), and a record of the threads a checkpoint's
retention runs on (:func:`retention_threads`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NoReturn

import pytest

from asyncio_ops import AsyncFunction, RuntimeContext

# The JVMs of the tests run small jobs for seconds to minutes: the test session's
# SparkSession, and the ones a test starts (a spark-submit's driver, a standalone master,
# worker or executor, an example script's or a streaming job's driver, a Spark Connect
# server). With the client compiler only and the serial collector, a JVM started for a
# test starts and runs its jobs a fifth to a third sooner, and the test session's
# SparkSession runs the Spark tests' jobs about 8 % sooner.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def with_jvm_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`JVM_OPTIONS` added to ``JAVA_TOOL_OPTIONS``, which every JVM
    started under it reads (and its children inherit)."""
    given = env.get("JAVA_TOOL_OPTIONS", "")
    return {**env, "JAVA_TOOL_OPTIONS": f"{given} {JVM_OPTIONS}".strip()}


class Controlled(AsyncFunction[Any, Any]):
    """Each call awaits a future that the test completes by value, in any order."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.futures: dict[Any, list[asyncio.Future[Sequence[Any]]]] = defaultdict(list)
        self.opened: RuntimeContext | None = None
        self.closed = False
        self.cancelled: list[Any] = []

    def open(self, runtime_context: RuntimeContext) -> None:
        self.opened = runtime_context

    async def async_invoke(self, value: Any) -> Sequence[Any]:
        self.calls.append(value)
        fut: asyncio.Future[Sequence[Any]] = asyncio.get_running_loop().create_future()
        self.futures[repr(value)].append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            self.cancelled.append(value)
            raise

    def _latest(self, value: Any) -> asyncio.Future[Sequence[Any]]:
        futs = [f for f in self.futures[repr(value)] if not f.done()]
        assert futs, f"no pending call for {value!r}"
        return futs[-1]

    def complete(self, value: Any, results: Sequence[Any] | None = None) -> None:
        self._latest(value).set_result([value] if results is None else results)

    def fail(self, value: Any, exc: BaseException) -> None:
        self._latest(value).set_exception(exc)

    def pending(self) -> list[Any]:
        """Values with a call still waiting, in call order."""
        seen: list[Any] = []
        for v in self.calls:
            if v not in seen and any(not f.done() for f in self.futures[repr(v)]):
                seen.append(v)
        return seen

    def close(self) -> None:
        self.closed = True


async def settle(rounds: int = 5) -> None:
    """Let callbacks and tasks woken by a completion run."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail under CI=true: CI must never pass by not testing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)  # only outside CI: under CI=true it failed above


def retention_threads(
    storage: Any, monkeypatch: pytest.MonkeyPatch, listings: bool = False
) -> list[str]:
    """``"<what> <thread name>"`` of each deletion of versions (``delete``; none when
    there is nothing to delete) from ``storage`` (a ``CheckpointStorage``) and, with
    ``listings``, of each listing of a version's files (``list``), as they happen."""
    seen: list[str] = []
    list_files, delete_versions = storage.list_files, storage.delete_versions

    def listing(version: Any, prefix: str = "") -> Any:
        seen.append(f"list {threading.current_thread().name}")
        return list_files(version, prefix)

    def deleting(versions: Any) -> None:
        versions = list(versions)
        if versions:
            seen.append(f"delete {threading.current_thread().name}")
        delete_versions(versions)

    if listings:
        monkeypatch.setattr(storage, "list_files", listing)
    monkeypatch.setattr(storage, "delete_versions", deleting)
    return seen
