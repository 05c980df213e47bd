"""One per Python worker process: the event loop and the opened user functions.

Per worker there is one :class:`WorkerRuntime`: one event loop (uvloop when
installed), reused by every partition the worker runs, and the opened user
functions, keyed by a token chosen on the driver. A function is therefore
opened once per worker (its pools and sessions live as long as the worker)
and closed when the worker exits.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Final

from .._engine._limit import AdaptiveLimit, CallsService
from .._functions import AsyncFunction, RuntimeContext, maybe_await
from ._spec import PartitionSpec, TaskInfo

log = logging.getLogger("asyncio_ops.runtime")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


GC_GEN0_THRESHOLD: Final = 20_000


def _tune_gc() -> None:
    """Make the cyclic garbage collector cheaper in a worker (once per process).

    Every element in flight keeps a few objects alive (its entry, handle,
    task, coroutine frames); with the default thresholds CPython's collector
    runs a young collection every 700 allocations and promotes those objects,
    so full collections walk them again and again: 15-20% of the CPU per row
    at capacity 256, more at higher capacities. ``gc.freeze()`` moves what the
    worker imported into the permanent generation and a larger first
    threshold lets short-lived objects die before a collection sees them.
    ``ASYNCIO_OPS_GC_TUNING=0`` leaves the collector as it was.
    """
    if os.environ.get("ASYNCIO_OPS_GC_TUNING", "1") == "0":
        return
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)


MAX_OPEN_FUNCTIONS: Final = 16
MAX_LEARNED_LIMITS: Final = 64


class WorkerRuntime:
    """One per Python worker process: the event loop and the opened functions.

    Functions stay open across the partitions a worker runs (their pools and
    sessions are reused). At most :data:`MAX_OPEN_FUNCTIONS` stay open: a
    driver that builds many ``ordered_wait`` DataFrames would otherwise pile
    up open functions in long-lived workers, so the least recently used one
    is closed when another opens. A worker runs one task at a time, so the
    one closed is never in use.
    """

    _instance: WorkerRuntime | None = None

    def __init__(self) -> None:
        self.loop = _new_loop()
        self.functions: OrderedDict[str, AsyncFunction[Any, Any]] = OrderedDict()
        # capacity="auto": the limit the last partition calling each service ended
        # with, and the last limit at which that service's errors rose with it (0:
        # none), by the function's service_endpoint(), else by the function
        self.limits: OrderedDict[str, tuple[int, int]] = OrderedDict()
        atexit.register(self.shutdown)
        _tune_gc()

    @classmethod
    def get(cls) -> WorkerRuntime:
        if cls._instance is None or cls._instance.loop.is_closed():
            cls._instance = WorkerRuntime()
        return cls._instance

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def function(self, spec: PartitionSpec, task: TaskInfo) -> AsyncFunction[Any, Any]:
        """The opened instance for ``spec.function_token`` (opened on first use)."""
        fn = self.functions.get(spec.function_token)
        if fn is not None:
            self.functions.move_to_end(spec.function_token)
        else:
            while len(self.functions) >= MAX_OPEN_FUNCTIONS:
                token, old = self.functions.popitem(last=False)
                self._close(token, old)
            fn = spec.function
            context = RuntimeContext(
                task_name=spec.uid,
                index_of_this_subtask=task.partition_id,
                number_of_parallel_subtasks=task.num_partitions,
                attempt_number=task.attempt_number,
            )
            self.run(maybe_await(fn.open(context)))
            self.functions[spec.function_token] = fn
        return fn

    def limiter(self, spec: PartitionSpec, start: int | None = None) -> AdaptiveLimit | None:
        """capacity="auto": a limit that starts at ``start`` (where the partition's
        operator ended its previous micro-batch, from the checkpoint) or else where
        this worker's last partition calling the same service ended, whichever
        operator or job it belonged to (a partition's first rounds then need not climb
        from the bottom again), below where that service's errors last rose with the
        limit (a service that refuses what it cannot take is not flooded again at
        the next job's start); None for a fixed capacity."""
        if spec.capacity != "auto":
            return None
        maximum = spec.options.max_capacity
        if start is not None:
            return AdaptiveLimit(initial=start, maximum=maximum)
        learned = self.limits.get(self._limit_key(spec))
        if learned is None:
            return AdaptiveLimit(maximum=maximum)
        last, refused_at = learned
        return AdaptiveLimit(initial=last, maximum=maximum, refused_at=refused_at)

    def remember(self, spec: PartitionSpec, limiter: AdaptiveLimit | None) -> None:
        """Keep where a partition's limit ended, for the next one calling its service
        (at most :data:`MAX_LEARNED_LIMITS` services, the least recently used go)."""
        if limiter is None or spec.function_token not in self.functions:
            return
        key = self._limit_key(spec)
        self.limits[key] = (limiter.limit, limiter.refused_at)
        self.limits.move_to_end(key)
        while len(self.limits) > MAX_LEARNED_LIMITS:
            self.limits.popitem(last=False)

    def _limit_key(self, spec: PartitionSpec) -> str:
        """The service an operator calls (``CallsService``), else its function."""
        fn = self.functions.get(spec.function_token)
        endpoint = fn.service_endpoint() if isinstance(fn, CallsService) else None
        return f"service {endpoint}" if endpoint else f"function {spec.function_token}"

    def _close(self, token: str, fn: AsyncFunction[Any, Any]) -> None:
        self.limits.pop(f"function {token}", None)
        try:
            self.run(maybe_await(fn.close()))
        except Exception:  # closing must go on for the others
            log.exception("closing async function %s failed", token)

    def shutdown(self) -> None:
        """Close every opened function, then the loop (at worker exit)."""
        if self.loop.is_closed():
            return
        while self.functions:
            self._close(*self.functions.popitem(last=False))
        self.run(self.loop.shutdown_asyncgens())
        self.loop.close()
