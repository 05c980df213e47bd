"""One long-lived client (pool, session) per worker process, shared and counted.

A lookup is pickled to every Spark task; each copy calls ``open()`` on the
worker. Every copy with the same settings must share one asyncpg pool (or one
aiohttp session) instead of opening its own, so resources are kept in a
process-wide :class:`SharedResources` registry, keyed by

- the running event loop: pools and sessions belong to the loop that created
  them and cannot be used from another one, and
- a settings key chosen by the connector (DSN and pool settings, connector
  limits, ...).

``acquire`` creates the resource on first use and counts references;
``release`` drops one and closes the resource when the last user is gone.
Whatever is still open at interpreter exit is closed by an ``atexit`` hook (on
its own loop if that loop is idle, else terminated), so a worker that is killed
between partitions does not leave server connections half-open longer than
necessary.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SharedResources"]

_log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    loop: asyncio.AbstractEventLoop
    creating: asyncio.Task[T]
    refs: int


class SharedResources(Generic[T]):
    """A registry of resources shared by every user in the process with the same key.

    ``create(key)`` builds a resource (awaited once per key and loop);
    ``aclose(resource)`` closes it gracefully and must respect its own timeout;
    ``terminate(resource)`` closes it without awaiting (used when the loop is gone).

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors import SharedResources
    >>> async def connect(dsn):
    ...     return f"pool for {dsn}"
    >>> async def disconnect(pool):
    ...     pass
    >>> POOLS = SharedResources("pools", create=connect, aclose=disconnect,
    ...                         terminate=lambda pool: None)
    >>> async def main():
    ...     a, b = await POOLS.acquire("db1"), await POOLS.acquire("db1")
    ...     shared = a is b, POOLS.active()
    ...     await POOLS.release("db1")
    ...     await POOLS.release("db1")  # the last release closes it
    ...     return shared, POOLS.active()
    >>> asyncio.run(main())
    ((True, 1), 0)
    """

    def __init__(
        self,
        name: str,
        *,
        create: Callable[[Hashable], Awaitable[T]],
        aclose: Callable[[T], Awaitable[None]],
        terminate: Callable[[T], None],
    ) -> None:
        self._name = name
        self._create = create
        self._aclose = aclose
        self._terminate = terminate
        self._entries: dict[tuple[int, Hashable], _Entry[T]] = {}
        atexit.register(self._close_at_exit)

    async def acquire(self, key: Hashable) -> T:
        """The resource for ``key`` on the running loop, created if needed; counts a user.

        If creation fails, the error propagates to every waiting caller and the
        next ``acquire`` tries again.
        """
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        entry = self._entries.get(slot)
        if entry is not None and entry.loop is not loop:
            # id() reused by a new loop after the old one was garbage collected.
            self._discard(slot, entry)
            entry = None
        if entry is None:
            entry = _Entry(loop=loop, creating=loop.create_task(self._create_logged(key)), refs=0)
            self._entries[slot] = entry
        entry.refs += 1
        try:
            # shield: one caller's cancellation must not abort a creation others await.
            return await asyncio.shield(entry.creating)
        except BaseException:
            entry.refs -= 1
            if self._entries.get(slot) is entry:
                creating = entry.creating
                failed = creating.done() and (
                    creating.cancelled() or creating.exception() is not None
                )
                if failed:
                    del self._entries[slot]
                elif entry.refs == 0:
                    # The last caller gave up (cancelled): nobody will release it.
                    self._discard(slot, entry)
                    creating.cancel()
            raise

    async def _create_logged(self, key: Hashable) -> T:
        resource = await self._create(key)
        _log.debug("%s: created %r", self._name, resource)
        return resource

    async def release(self, key: Hashable) -> None:
        """Drop one user of ``key`` on the running loop; close the resource after the last."""
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        entry = self._entries.get(slot)
        if entry is None or entry.loop is not loop:
            return
        entry.refs -= 1
        if entry.refs > 0:
            return
        del self._entries[slot]
        if entry.creating.done():
            if not entry.creating.cancelled() and entry.creating.exception() is None:
                await self._aclose(entry.creating.result())
        else:
            entry.creating.cancel()
            with contextlib.suppress(BaseException):
                await entry.creating

    def _discard(self, slot: tuple[int, Hashable], entry: _Entry[T]) -> None:
        del self._entries[slot]
        creating = entry.creating
        if creating.done() and not creating.cancelled() and creating.exception() is None:
            with contextlib.suppress(Exception):
                self._terminate(creating.result())

    def active(self) -> int:
        """Resources currently open in this process (for tests and metrics)."""
        return len(self._entries)

    def _close_at_exit(self) -> None:
        for slot, entry in list(self._entries.items()):
            del self._entries[slot]
            creating = entry.creating
            if not creating.done() or creating.cancelled() or creating.exception() is not None:
                continue
            resource = creating.result()
            loop = entry.loop
            try:
                if not loop.is_closed() and not loop.is_running():
                    loop.run_until_complete(self._aclose(resource))
                else:
                    self._terminate(resource)
            except Exception:  # best effort at exit: nothing is left to report to
                _log.debug("%s: closing %r at exit failed", self._name, resource, exc_info=True)

    def __repr__(self) -> str:
        return f"SharedResources({self._name!r}, active={len(self._entries)})"
