"""KeyBatcher without a server: gathering, dedupe, failures, cancellation, close."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from asyncio_ops.connectors import ConnectorError
from asyncio_ops.connectors._batching import KeyBatcher


class Source:
    """A fetch function that records batches and can be held or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail: BaseException | None = None

    async def __call__(self, keys: Sequence[int]) -> Mapping[int, str]:
        self.batches.append(list(keys))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return {k: f"v{k}" for k in keys if k >= 0}


def batcher(source: Source, *, size: int = 100, delay: float = 0.0) -> KeyBatcher[int, str]:
    return KeyBatcher(source, max_size=size, max_delay=delay, missing=lambda: "missing")


@pytest.mark.asyncio
async def test_loads_of_one_loop_turn_form_one_batch() -> None:
    source = Source()
    b = batcher(source)
    results = await asyncio.gather(*(b.load(k) for k in (1, 2, 3, -1)))
    assert results == ["v1", "v2", "v3", "missing"]
    assert source.batches == [[1, 2, 3, -1]]
    await b.aclose()


@pytest.mark.asyncio
async def test_keys_in_flight_are_not_fetched_again() -> None:
    source = Source()
    source.release.clear()
    b = batcher(source)
    first = asyncio.ensure_future(b.load(1))
    await asyncio.sleep(0.01)
    assert source.batches == [[1]]  # sent, held by the source
    second = asyncio.ensure_future(b.load(1))
    await asyncio.sleep(0.01)
    source.release.set()
    assert await first == await second == "v1"
    assert source.batches == [[1]]
    assert b.statistics().deduplicated == 1
    await b.aclose()


@pytest.mark.asyncio
async def test_a_failed_batch_fails_every_row_and_is_forgotten() -> None:
    source = Source()
    source.fail = ConnectionError("gone")
    b = batcher(source)
    results = await asyncio.gather(b.load(1), b.load(2), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    source.fail = None
    assert await b.load(1) == "v1"  # retried: sent again
    assert source.batches == [[1, 2], [1]]
    assert b.statistics().failed_batches == 1
    await b.aclose()


@pytest.mark.asyncio
async def test_cancelling_one_row_does_not_cancel_the_batch() -> None:
    source = Source()
    source.release.clear()
    b = batcher(source)
    doomed = asyncio.ensure_future(b.load(1))
    survivor = asyncio.ensure_future(b.load(1))
    await asyncio.sleep(0.01)
    doomed.cancel()
    await asyncio.sleep(0)
    source.release.set()
    assert await survivor == "v1"
    assert doomed.cancelled()
    await b.aclose()


@pytest.mark.asyncio
async def test_failure_with_every_row_gone_is_not_reported_as_unretrieved() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    source = Source()
    source.release.clear()
    source.fail = RuntimeError("boom")
    b = batcher(source)
    row = asyncio.ensure_future(b.load(1))
    await asyncio.sleep(0.01)
    row.cancel()
    source.release.set()
    await asyncio.sleep(0.01)
    import gc

    gc.collect()
    assert reported == []
    await b.aclose()


@pytest.mark.asyncio
async def test_size_triggers_the_send_and_delay_the_rest() -> None:
    source = Source()
    b = batcher(source, size=2, delay=0.05)
    results = await asyncio.gather(*(b.load(k) for k in range(5)))
    assert results == [f"v{k}" for k in range(5)]
    assert source.batches == [[0, 1], [2, 3], [4]]
    await b.aclose()


@pytest.mark.asyncio
async def test_close_cancels_waiting_rows_and_refuses_new_ones() -> None:
    source = Source()
    source.release.clear()
    b = batcher(source, delay=10.0)
    waiting = asyncio.ensure_future(b.load(1))
    await asyncio.sleep(0.01)
    await b.aclose()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(ConnectorError, match="closed"):
        await b.load(2)


@pytest.mark.asyncio
async def test_each_load_has_its_own_future_and_abandoned_ones_are_not_reported() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    source = Source()
    source.release.clear()
    b = batcher(source)
    futures = [b.submit(1), b.submit(1), b.submit(2)]
    assert len({id(f) for f in futures}) == 3
    futures[0].cancel()  # one row gives up: the others of key 1 still get the batch
    abandoned = b.submit(3)  # a row dropped without cancelling its future
    del abandoned
    await asyncio.sleep(0.01)
    source.fail = RuntimeError("boom")
    source.release.set()
    with pytest.raises(RuntimeError, match="boom"):
        await futures[1]
    with pytest.raises(RuntimeError, match="boom"):
        await futures[2]
    assert source.batches == [[1, 2, 3]]
    assert b.statistics().deduplicated == 1
    import gc

    gc.collect()
    assert reported == []
    await b.aclose()
