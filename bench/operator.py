"""Throughput of AsyncWaitOperator beside a hand-written gather + Semaphore baseline.

    python -m bench.operator                 # uvloop, full sizes
    python -m bench.operator --loop asyncio  # the default loop
    python -m bench.operator --quick         # smaller sizes, a smoke run

(Run it as a module from the repository root: as a script its file name would
shadow the standard library's ``operator`` module.)

Each row is the best of ``--repeat`` runs on the same input in the same process.
Two workloads: an instant function (returns without suspending; measures
per-element overhead) and one that sleeps 20 ms (measures how close the
operator gets to capacity / latency). Targets from the issue are checked at the
end; this is a benchmark, not a test, and it never fails the build.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asyncio_ops import AsyncWaitOperator, OutputMode, Record, Watermark

Fn = Callable[[Any], Awaitable[list[Any]]]


async def instant(v: int) -> list[int]:
    return [v]


async def sleepy(v: int) -> list[int]:
    await asyncio.sleep(0.020)
    return [v]


async def run_operator(
    fn: Fn, n: int, capacity: int, mode: OutputMode, batched: bool = True
) -> int:
    count = 0

    def output(element: object) -> None:
        nonlocal count
        if type(element) is Record:
            count += 1

    op = AsyncWaitOperator(fn, output=output, timeout=60.0, capacity=capacity, mode=mode)
    await op.open()
    watermarks = mode is OutputMode.WATERMARK_BOUNDED
    # A watermark every 2,560 records: Flink's default 200 ms watermark interval
    # at the 12,800 elements/s that capacity 256 and 20 ms allow.
    every = 2560
    if batched:  # process_elements: one await per batch (how the Spark runtime feeds it)
        for start in range(0, n, every):
            await op.process_elements(Record(i, i) for i in range(start, min(n, start + every)))
            if watermarks:
                await op.process_watermark(Watermark(start + every - 1))
    else:  # process_element: one await per element
        for i in range(n):
            await op.process_element(Record(i, i))
            if watermarks and i % every == every - 1:
                await op.process_watermark(Watermark(i))
    await op.end_input()
    await op.close()
    return count


async def run_baseline(fn: Fn, n: int, capacity: int) -> int:
    """What people write by hand: one task per element, a semaphore, gather."""
    sem = asyncio.Semaphore(capacity)

    async def one(v: int) -> list[int]:
        async with sem:
            return await fn(v)

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(len(r) for r in results)


def measure(loop_kind: str, factory: Callable[[], Awaitable[int]], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        if loop_kind == "uvloop":
            import uvloop

            got = uvloop.run(factory())  # type: ignore[arg-type]
        else:
            got = asyncio.run(factory())  # type: ignore[arg-type]
        elapsed = time.perf_counter() - start
        assert got == n, f"expected {n} results, got {got}"
        best = min(best, elapsed)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--n", type=int, default=300_000, help="elements, instant function")
    parser.add_argument("--n-slow", type=int, default=25_600, help="elements, 20 ms function")
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.n, args.n_slow, args.repeat = 30_000, 2_560, 1
    cap = args.capacity
    rows: dict[str, float] = {}

    print(f"loop={args.loop} capacity={cap} python={sys.version.split()[0]}")
    print(f"{'workload':<34}{'elements/s':>14}")
    for label, fn, n in (("instant", instant, args.n), ("20ms", sleepy, args.n_slow)):
        for mode in OutputMode:
            key = f"{label} {mode.value}"
            rows[key] = measure(
                args.loop,
                lambda fn=fn, n=n, mode=mode: run_operator(fn, n, cap, mode),
                n,
                args.repeat,
            )
            print(f"{key:<34}{rows[key]:>14,.0f}")
        key = f"{label} unordered, per-call API"
        rows[key] = measure(
            args.loop,
            lambda fn=fn, n=n: run_operator(fn, n, cap, OutputMode.UNORDERED, batched=False),
            n,
            args.repeat,
        )
        print(f"{key:<34}{rows[key]:>14,.0f}")
        key = f"{label} gather+Semaphore baseline"
        rows[key] = measure(args.loop, lambda fn=fn, n=n: run_baseline(fn, n, cap), n, args.repeat)
        print(f"{key:<34}{rows[key]:>14,.0f}")

    ceiling = cap / 0.020
    unordered = rows["instant unordered"]
    checks = [
        ("instant unordered >= 150,000/s", unordered >= 150_000, f"{unordered:,.0f}/s"),
        (
            "instant unordered >= 2x baseline",
            unordered >= 2 * rows["instant gather+Semaphore baseline"],
            f"{unordered / rows['instant gather+Semaphore baseline']:.2f}x",
        ),
        (
            "instant ordered within 20% of unordered",
            rows["instant ordered"] >= 0.8 * unordered,
            f"{rows['instant ordered'] / unordered:.2f}",
        ),
    ]
    for mode in OutputMode:
        got = rows[f"20ms {mode.value}"]
        checks.append(
            (
                f"20ms {mode.value} >= 95% of capacity/latency ({ceiling:,.0f}/s)",
                got >= 0.95 * ceiling,
                f"{got / ceiling:.1%}",
            )
        )
    print()
    for name, ok, figure in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name:<58}{figure:>10}")


if __name__ == "__main__":
    main()
