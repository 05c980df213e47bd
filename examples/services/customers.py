"""A small HTTP customer lookup service for the HTTP examples, tests and benchmark.

Self-contained (standard library + aiohttp only), so the Docker image copies
this one file. Customers are synthetic and deterministic: customer ``i``
(``1 <= i <= customers``) is :func:`customer` ``(i)``, the same record that
``examples/sql/init.sql`` puts into Postgres.

Endpoints (every response is JSON; each request waits ``latency`` seconds,
plus up to ``jitter`` seconds at random, before answering, like a remote system).
With ``max_concurrent`` N > 0 the service saturates like a server with N workers:
at most N requests wait out their latency at once, the others queue (first
come, first served) before theirs starts, so beyond N in flight the throughput
stops growing and the latency grows instead:

- ``GET /customers/{id}`` -> ``{"id", "name", "tier", "country"}``; 404 for an
  unknown id, 400 for an id that is not an integer.
- ``GET /customers?ids=1,2,3`` -> ``{"items": [...]}`` for the known ids (one
  latency for the whole batch).
- ``POST /customers/batch`` with ``{"ids": [1, 2, 3]}`` -> ``{"items": [...]}``.
- ``GET /healthz`` -> ``{"status": "ok"}`` (no latency).
- ``GET /stats`` -> ``{"answered": [...], "rejected": n}``: the lookups answered in
  each second since the first one, and how many were refused (no latency).

Two more behaviours, for the benchmarks of ``capacity="auto"``: with
``reject_above`` N > 0 a lookup arriving while N are being served is answered at
once with a 500 (a service that fails fast rather than queue or answer 429), and
with ``latency_after`` ``(t, latency)`` lookups take ``latency`` from ``t`` seconds
after the first one on (a service that got slower).

Run: ``python -m asyncio_ops.services.customers --port 8080 --latency-ms 20`` (or the environment
variables ``PORT``, ``LATENCY_MS``, ``JITTER_MS``, ``CUSTOMERS``,
``MAX_CONCURRENT``). In a
program: :class:`ServiceThread` serves on a free local port from a
background thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import threading
import time
from typing import Any, Final

from aiohttp import web

COUNTRIES: Final = ("DE", "FR", "US", "JP", "BR")
MAX_BATCH: Final = 10_000


def tier(customer_id: int) -> str:
    """The tier of a customer (mirrors the CASE in ``examples/sql/init.sql``)."""
    if customer_id % 100 == 0:
        return "platinum"
    if customer_id % 10 == 0:
        return "gold"
    if customer_id % 3 == 0:
        return "silver"
    return "bronze"


def customer(customer_id: int) -> dict[str, Any]:
    """The customer record with this id (no range check)."""
    return {
        "id": customer_id,
        "name": f"customer-{customer_id}",
        "tier": tier(customer_id),
        "country": COUNTRIES[customer_id % len(COUNTRIES)],
    }


CUSTOMERS_KEY: Final = web.AppKey("customers", int)
LATENCY_KEY: Final = web.AppKey("latency", float)
JITTER_KEY: Final = web.AppKey("jitter", float)
# a saturating service's workers; absent: requests never queue
WORKERS_KEY: Final = web.AppKey("workers", asyncio.Semaphore)


class Load:
    """What the service is doing: lookups being served, answered per second since the
    first one, refused; and the two benchmark behaviours (see the module docstring)."""

    def __init__(self, reject_above: int, latency_after: tuple[float, float] | None) -> None:
        self.reject_above = reject_above
        self.latency_after = latency_after
        self.serving = 0
        self.first: float | None = None
        self.answered: list[int] = []
        self.rejected = 0

    def since_first(self) -> float:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        return now - self.first

    def count_answer(self) -> None:
        second = int(self.since_first())
        while len(self.answered) <= second:
            self.answered.append(0)
        self.answered[second] += 1


LOAD_KEY: Final = web.AppKey("load", Load)


async def _wait(app: web.Application) -> None:
    load = app[LOAD_KEY]
    delay = app[LATENCY_KEY]
    step = load.latency_after
    if step is not None and load.since_first() >= step[0]:
        delay = step[1]
    if load.reject_above and load.serving >= load.reject_above:
        load.rejected += 1
        raise web.HTTPInternalServerError(
            text='{"error": "too many requests at once"}', content_type="application/json"
        )
    jitter = app[JITTER_KEY]
    if jitter > 0:
        delay += random.uniform(0.0, jitter)
    load.serving += 1
    try:
        if delay > 0:
            workers = app.get(WORKERS_KEY)
            if workers is None:
                await asyncio.sleep(delay)
            else:
                async with workers:  # a saturating service: queue for one of N workers
                    await asyncio.sleep(delay)
    finally:
        load.serving -= 1
    load.count_answer()


def _known(app: web.Application, ids: list[int]) -> list[dict[str, Any]]:
    n = app[CUSTOMERS_KEY]
    return [customer(i) for i in ids if 1 <= i <= n]


def _parse_ids(raw: list[Any]) -> list[int]:
    try:
        ids = [int(x) for x in raw]
    except (TypeError, ValueError) as exc:
        raise web.HTTPBadRequest(text=f'{{"error": "ids must be integers: {exc}"}}') from exc
    if len(ids) > MAX_BATCH:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BATCH, actual_size=len(ids))
    return ids


async def get_customer(request: web.Request) -> web.Response:
    raw = request.match_info["id"]
    try:
        customer_id = int(raw)
    except ValueError:
        return web.json_response({"error": f"id must be an integer, got {raw!r}"}, status=400)
    await _wait(request.app)
    found = _known(request.app, [customer_id])
    if not found:
        return web.json_response({"error": f"no customer {customer_id}"}, status=404)
    return web.json_response(found[0])


async def get_customers(request: web.Request) -> web.Response:
    raw = request.query.get("ids", "")
    ids = _parse_ids([x for x in raw.split(",") if x.strip()])
    await _wait(request.app)
    return web.json_response({"items": _known(request.app, ids)})


async def post_batch(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "body must be JSON"}, status=400)
    if not isinstance(body, dict) or not isinstance(body.get("ids"), list):
        return web.json_response({"error": 'body must be {"ids": [...]}'}, status=400)
    ids = _parse_ids(body["ids"])
    await _wait(request.app)
    return web.json_response({"items": _known(request.app, ids)})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    load = request.app[LOAD_KEY]
    return web.json_response({"answered": load.answered, "rejected": load.rejected})


def make_app(
    *,
    customers: int = 100_000,
    latency: float = 0.0,
    jitter: float = 0.0,
    max_concurrent: int = 0,
    reject_above: int = 0,
    latency_after: tuple[float, float] | None = None,
) -> web.Application:
    """The service's application; ``latency`` and ``jitter`` are in seconds;
    ``max_concurrent`` > 0 makes it saturate, ``reject_above`` > 0 fail fast,
    ``latency_after`` slow down (see the module docstring)."""
    if min(customers, latency, jitter, max_concurrent, reject_above) < 0:
        raise ValueError(
            "customers, latency, jitter, max_concurrent and reject_above must be >= 0"
        )
    app = web.Application()
    app[LOAD_KEY] = Load(reject_above, latency_after)
    app[CUSTOMERS_KEY] = customers
    app[LATENCY_KEY] = latency
    app[JITTER_KEY] = jitter
    # asyncio's Semaphore wakes waiters in arrival order: a FIFO queue of requests
    if max_concurrent:
        app[WORKERS_KEY] = asyncio.Semaphore(max_concurrent)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/stats", stats)
    app.router.add_get("/customers", get_customers)
    app.router.add_post("/customers/batch", post_batch)
    app.router.add_get("/customers/{id}", get_customer)
    return app


class ServiceThread:
    """Serve :func:`make_app` on ``host`` (a free port unless given) from a daemon thread.

    ``start()`` returns once the socket listens; :attr:`url` is then the base
    URL (``http://127.0.0.1:PORT``). ``stop()`` shuts the server down and joins
    the thread; both are idempotent, and the object is a context manager.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        customers: int = 100_000,
        latency: float = 0.0,
        jitter: float = 0.0,
        max_concurrent: int = 0,
        reject_above: int = 0,
        latency_after: tuple[float, float] | None = None,
    ) -> None:
        self._app = make_app(
            customers=customers, latency=latency, jitter=jitter, max_concurrent=max_concurrent,
            reject_above=reject_above, latency_after=latency_after,
        )  # fmt: skip
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""

    def start(self) -> str:
        if self._thread is not None:
            return self.url
        self._thread = threading.Thread(target=self._run, name="http-service", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout=30):
            raise RuntimeError("the HTTP service did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the HTTP service failed to start: {self._error}") from self._error
        return self.url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(); the thread must end quietly
            self._error = exc
            self._started.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        runner = web.AppRunner(self._app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            self._started.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)

    def __enter__(self) -> ServiceThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m asyncio_ops.services.customers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    parser.add_argument(
        "--latency-ms", type=float, default=float(os.environ.get("LATENCY_MS", "20"))
    )
    parser.add_argument("--jitter-ms", type=float, default=float(os.environ.get("JITTER_MS", "0")))
    parser.add_argument("--customers", type=int, default=int(os.environ.get("CUSTOMERS", "100000")))
    parser.add_argument(
        "--max-concurrent", type=int, default=int(os.environ.get("MAX_CONCURRENT", "0")),
        help="saturate beyond this many requests at once (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--reject-above", type=int, default=0,
        help="answer 500 at once to a lookup arriving while this many are served (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--latency-after", metavar="SECONDS:MS",
        help="from SECONDS after the first lookup on, lookups take MS milliseconds",
    )  # fmt: skip
    args = parser.parse_args(argv)
    after = None
    if args.latency_after:
        at, _, ms = args.latency_after.partition(":")
        after = (float(at), float(ms) / 1000)
    app = make_app(
        customers=args.customers, latency=args.latency_ms / 1000, jitter=args.jitter_ms / 1000,
        max_concurrent=args.max_concurrent, reject_above=args.reject_above,
        latency_after=after,
    )  # fmt: skip
    print(
        f"customer service on {args.host}:{args.port}: {args.customers} customers, "
        f"latency {args.latency_ms} ms + jitter up to {args.jitter_ms} ms"
        + (f", saturating beyond {args.max_concurrent} at once" if args.max_concurrent else ""),
        flush=True,
    )
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
