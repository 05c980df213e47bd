"""Run an operator over a finite input: the simplest driver of the call order."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable
from datetime import timedelta
from typing import Any

from .._clock import Scheduler
from .._elements import StreamElement, Watermark
from .._functions import AsyncFunction
from ..options import DEFAULT_CAPACITY, DEFAULT_MAX_CAPACITY
from ._operator_snapshot import OperatorSnapshot
from ._retry import AsyncRetryStrategy
from ._wait_operator import AsyncWaitOperator, OutputMode


async def run_async_wait(
    function: AsyncFunction[Any, Any] | Callable[[Any], Any],
    elements: Iterable[Any] | AsyncIterable[Any],
    *,
    timeout: float | timedelta,  # noqa: ASYNC109 - per-element budget, not a call timeout
    capacity: int | str = DEFAULT_CAPACITY,
    mode: OutputMode = OutputMode.ORDERED,
    retry: AsyncRetryStrategy | None = None,
    clock: Scheduler | None = None,
    restored: OperatorSnapshot | None = None,
    output_buffer: int = 0,
    max_capacity: int = DEFAULT_MAX_CAPACITY,
) -> list[StreamElement]:
    """Feed ``elements`` (records, watermarks or plain values) through an operator.

    Opens, processes everything, drains with ``end_input`` and closes (also on
    failure); returns what was emitted, in emission order. ``capacity="auto"``
    adapts the elements in flight (up to ``max_capacity``), as the operator does.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import OutputMode, run_async_wait
    >>> async def lookup(value):
    ...     await asyncio.sleep(0.01 * (3 - value))  # the last answers first
    ...     return [value * 10]
    >>> out = asyncio.run(run_async_wait(lookup, [1, 2, 3], timeout=2.0, capacity=10))
    >>> [r.value for r in out]  # OutputMode.ORDERED: input order
    [10, 20, 30]
    >>> out = asyncio.run(run_async_wait(lookup, [1, 2, 3], timeout=2.0, capacity=10,
    ...                                  mode=OutputMode.UNORDERED))
    >>> [r.value for r in out]  # completion order
    [30, 20, 10]
    """
    out: list[StreamElement] = []
    op = AsyncWaitOperator(
        function,
        output=out.append,
        timeout=timeout,
        capacity=capacity,
        mode=mode,
        retry=retry,
        clock=clock,
        output_buffer=output_buffer,
        max_capacity=max_capacity,
    )
    try:
        await op.open(restored)
        if isinstance(elements, AsyncIterable):
            async for element in elements:
                await _feed(op, element)
        else:
            for element in elements:
                await _feed(op, element)
        await op.end_input()
    finally:
        await op.close()
    return out


async def _feed(op: AsyncWaitOperator, element: Any) -> None:
    if type(element) is Watermark:
        await op.process_watermark(element)
    else:
        await op.process_element(element)
