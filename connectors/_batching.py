"""Request batching: many concurrent single-key loads become one multi-key fetch.

:class:`KeyBatcher` is the DataLoader pattern on one event loop. ``load(key)``
is called once per input row; the keys of concurrent calls are gathered into a
batch that is sent as one ``fetch(keys)`` call when either

- ``max_size`` distinct keys are waiting (sent at once, from inside ``load``), or
- ``max_delay`` seconds have passed since the first key of the batch arrived
  (``0`` means "at the next turn of the loop": every row whose invoke started in
  the same loop iteration joins).

Each key is fetched once even when several rows ask for it: a key that is
already waiting in the open batch, or already being fetched by a batch in
flight, is not sent again; every row gets the same result. A failed fetch fails
every row of its batch with the same exception; the keys are then forgotten, so
a retry sends them again.

Cancelling a ``load`` (the operator's timeout) does not cancel the fetch: the
other rows of the batch still want it. :meth:`aclose` cancels fetches in flight
and fails rows still waiting.

Not thread-safe; bound to the event loop it first runs on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from asyncio_ops.options import at_least, seconds

from ._exceptions import ConnectorError

__all__ = ["BatchStatistics", "KeyBatcher"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class BatchStatistics:
    """Counters of a :class:`KeyBatcher`.

    ``loads``: ``load`` calls; ``batches``: ``fetch`` calls; ``keys_fetched``: keys
    sent (distinct within a batch); ``deduplicated``: loads answered by a key
    already waiting or in flight; ``failed_batches``: fetches that raised.

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors import KeyBatcher
    >>> async def fetch(keys):
    ...     return {k: k * 10 for k in keys}
    >>> async def main():
    ...     batcher = KeyBatcher(fetch, max_size=100, max_delay=0.002, missing=lambda: None)
    ...     await asyncio.gather(*(batcher.load(k) for k in [1, 2, 2]))
    ...     await batcher.aclose()
    ...     return batcher.statistics()
    >>> asyncio.run(main())
    BatchStatistics(loads=3, batches=1, keys_fetched=2, deduplicated=1, failed_batches=0)
    """

    loads: int
    batches: int
    keys_fetched: int
    deduplicated: int
    failed_batches: int

    @property
    def mean_batch_size(self) -> float:
        return self.keys_fetched / self.batches if self.batches else 0.0


class KeyBatcher(Generic[K, V]):
    """Gathers concurrent ``load(key)`` calls into ``fetch(keys)`` batches.

    ``fetch`` receives distinct keys (at most ``max_size``) and returns a mapping
    from key to result; a key absent from the mapping gets ``missing()``.

    Cost per load is O(1) and independent of how many loads are waiting: each
    load gets its own future (so cancelling one row cancels nothing else, without
    ``asyncio.shield``'s extra future and callbacks per row), and a key's
    waiters are kept as that one future, or a list once a second load asks for
    the same key. A settled batch touches each of its waiters once.

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors import KeyBatcher
    >>> async def fetch(keys):  # one request for every key waiting
    ...     return {k: f"customer-{k}" for k in keys if k != 3}
    >>> async def main():
    ...     batcher = KeyBatcher(fetch, max_size=100, max_delay=0.002, missing=lambda: None)
    ...     try:
    ...         return await asyncio.gather(*(batcher.load(k) for k in [1, 2, 2, 3]))
    ...     finally:
    ...         await batcher.aclose()
    >>> asyncio.run(main())
    ['customer-1', 'customer-2', 'customer-2', None]
    """

    def __init__(
        self,
        fetch: Callable[[Sequence[K]], Awaitable[Mapping[K, V]]],
        *,
        max_size: int,
        max_delay: float,
        missing: Callable[[], V],
    ) -> None:
        at_least(max_size, "batch_size", 1)
        max_delay = seconds(max_delay, "max_batch_delay", low_ok=True)
        self._fetch = fetch
        self._max_size = max_size
        self._max_delay = float(max_delay)
        self._missing = missing
        # Keys not yet answered (waiting in the open batch or in flight) -> the
        # future of their one load, or the list of futures of their loads.
        self._waiters: dict[K, asyncio.Future[V] | list[asyncio.Future[V]]] = {}
        self._open_batch: list[K] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._loads = 0
        self._batches = 0
        self._keys_fetched = 0
        self._deduplicated = 0
        self._failed_batches = 0

    async def load(self, key: K) -> V:
        """The result for ``key``, fetched in a batch with concurrent loads.

        Raises whatever ``fetch`` raised for the batch, or :class:`ConnectorError`
        if the batcher was closed.
        """
        return await self.submit(key)

    def submit(self, key: K) -> asyncio.Future[V]:
        """:meth:`load` without the coroutine: the future of ``key``'s result.

        The future belongs to the caller alone: cancelling it cancels neither
        the batch nor other loads of the same key. It must be awaited (or
        cancelled), like any future that may hold an exception.
        """
        if self._closed:
            raise ConnectorError("lookup is closed; open() it again before use")
        self._loads += 1
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[V] = loop.create_future()
        waiting = self._waiters.get(key)
        if waiting is None:
            self._waiters[key] = future
            batch = self._open_batch
            batch.append(key)
            if len(batch) >= self._max_size:
                self._send()
            elif self._timer is None:
                self._timer = loop.call_later(self._max_delay, self._send)
        else:
            self._deduplicated += 1
            if type(waiting) is list:
                waiting.append(future)
            else:
                self._waiters[key] = [waiting, future]  # type: ignore[list-item]
        return future

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._open_batch:
            return
        keys, self._open_batch = self._open_batch, []
        self._batches += 1
        self._keys_fetched += len(keys)
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(self._run(keys))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _run(self, keys: list[K]) -> None:
        try:
            results = await self._fetch(keys)
        except asyncio.CancelledError:
            self._cancel(keys)
            raise
        except Exception as exc:
            self._failed_batches += 1
            self._fail(keys, exc)
        else:
            self._settle(keys, results)

    def _settle(self, keys: list[K], results: Mapping[K, V]) -> None:
        pop = self._waiters.pop
        get = results.get
        missing = self._missing
        for key in keys:
            waiting = pop(key, None)
            if waiting is None:
                continue
            value = get(key)
            if value is None:
                value = missing()
            if type(waiting) is list:
                for future in waiting:
                    if not future.done():
                        future.set_result(value)
            elif not waiting.done():  # type: ignore[union-attr]
                waiting.set_result(value)  # type: ignore[union-attr]

    def _fail(self, keys: list[K], error: BaseException) -> None:
        for future in self._pop_waiters(keys):
            if not future.done():
                future.set_exception(error)
                # Marked retrieved: a row gone without cancelling its future (the
                # batch is shared, rows time out) must not log "never retrieved".
                future.exception()

    def _cancel(self, keys: list[K]) -> None:
        for future in self._pop_waiters(keys):
            future.cancel()

    def _pop_waiters(self, keys: list[K]) -> list[asyncio.Future[V]]:
        futures: list[asyncio.Future[V]] = []
        for key in keys:
            waiting = self._waiters.pop(key, None)
            if waiting is None:
                continue
            if type(waiting) is list:
                futures.extend(waiting)
            else:
                futures.append(waiting)  # type: ignore[arg-type]
        return futures

    async def aclose(self) -> None:
        """Stop: cancel the timer and the fetches in flight; waiting loads are cancelled."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._open_batch = self._open_batch, []
        self._cancel(pending)
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def statistics(self) -> BatchStatistics:
        return BatchStatistics(
            loads=self._loads,
            batches=self._batches,
            keys_fetched=self._keys_fetched,
            deduplicated=self._deduplicated,
            failed_batches=self._failed_batches,
        )
