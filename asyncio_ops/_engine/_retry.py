"""Retry strategies for async lookups (FLIP-232), with PyFlink's names.

``AsyncRetryStrategy.fixed_delay(max_attempts, backoff_time_millis, ...)`` and
``AsyncRetryStrategy.exponential_backoff(max_attempts, initial_delay,
max_retry_delay, multiplier, ...)``; ``no_restart()`` never retries.

``can_retry(n)`` is asked after ``n`` attempts have been made and answers
``n <= max_attempts``, so ``max_attempts`` counts the retries after the first
call, as in Flink. ``get_backoff_time_millis(n)`` is the delay before attempt
``n + 1``: fixed, or ``min(initial * multiplier ** (n - 1), max_retry_delay)``.

Unlike Flink and PyFlink, whose exponential strategy keeps one mutable "last
delay" shared by all elements, the delay here is a pure function of the
element's own attempt count: one element's retries never stretch another's
backoff. Optional ``jitter`` (0..1) spreads each delay uniformly over
``[d * (1 - jitter), d]`` to avoid retry storms in lock-step.

Predicates decide whether a retry is wanted at all: ``result_predicate(results)``
for a completed attempt, ``exception_predicate(exc)`` for a failed one (see
:mod:`asyncio_ops.async_retry_predicates`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import ConfigurationError

ResultPredicate = Callable[[Sequence[Any]], bool]
ExceptionPredicate = Callable[[BaseException], bool]


@dataclass(frozen=True)
class AsyncRetryStrategy:
    """How and when an element's failed or unsatisfying attempt is retried.

    Example:

    >>> from asyncio_ops import AsyncRetryStrategy
    >>> from asyncio_ops.async_retry_predicates import exception_type_predicate
    >>> retry = AsyncRetryStrategy.exponential_backoff(
    ...     3, 100, 2000, 2.0, exception_predicate=exception_type_predicate(ConnectionError))
    >>> retry.can_retry(3), retry.can_retry(4)  # three retries after the first call
    (True, False)
    >>> [retry.get_backoff_time_millis(n) for n in (1, 2, 3)]
    [100.0, 200.0, 400.0]
    """

    max_attempts: int = 0
    initial_delay_millis: float = 0.0
    max_retry_delay_millis: float = 0.0
    multiplier: float = 1.0
    result_predicate: ResultPredicate | None = None
    exception_predicate: ExceptionPredicate | None = None
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 0:
            raise ConfigurationError(f"max_attempts must be an int >= 0, got {self.max_attempts!r}")
        if self.initial_delay_millis < 0:
            raise ConfigurationError(
                f"backoff delay must be >= 0 ms, got {self.initial_delay_millis!r}"
            )
        if self.max_retry_delay_millis < self.initial_delay_millis:
            raise ConfigurationError(
                f"max_retry_delay ({self.max_retry_delay_millis!r} ms) must be >= the initial "
                f"delay ({self.initial_delay_millis!r} ms)"
            )
        if self.multiplier < 1.0:
            raise ConfigurationError(f"multiplier must be >= 1.0, got {self.multiplier!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(f"jitter must be in [0, 1], got {self.jitter!r}")

    # -- constructors (PyFlink names) -------------------------------------------------
    @staticmethod
    def no_restart() -> AsyncRetryStrategy:
        """Never retry."""
        return AsyncRetryStrategy()

    @staticmethod
    def fixed_delay(
        max_attempts: int,
        backoff_time_millis: float,
        result_predicate: ResultPredicate | None = None,
        exception_predicate: ExceptionPredicate | None = None,
        *,
        jitter: float = 0.0,
    ) -> AsyncRetryStrategy:
        """Retry up to ``max_attempts`` times, ``backoff_time_millis`` apart."""
        return AsyncRetryStrategy(
            max_attempts=max_attempts,
            initial_delay_millis=backoff_time_millis,
            max_retry_delay_millis=backoff_time_millis,
            multiplier=1.0,
            result_predicate=result_predicate,
            exception_predicate=exception_predicate,
            jitter=jitter,
        )

    @staticmethod
    def exponential_backoff(
        max_attempts: int,
        initial_delay: float,
        max_retry_delay: float,
        multiplier: float,
        result_predicate: ResultPredicate | None = None,
        exception_predicate: ExceptionPredicate | None = None,
        *,
        jitter: float = 0.0,
    ) -> AsyncRetryStrategy:
        """Retry up to ``max_attempts`` times; delays (ms) grow by ``multiplier`` up to a cap."""
        return AsyncRetryStrategy(
            max_attempts=max_attempts,
            initial_delay_millis=initial_delay,
            max_retry_delay_millis=max_retry_delay,
            multiplier=multiplier,
            result_predicate=result_predicate,
            exception_predicate=exception_predicate,
            jitter=jitter,
        )

    # -- queries ----------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.max_attempts > 0 and (
            self.result_predicate is not None or self.exception_predicate is not None
        )

    def can_retry(self, current_attempts: int) -> bool:
        """May an element that has made ``current_attempts`` attempts make another?"""
        return current_attempts <= self.max_attempts

    def get_backoff_time_millis(self, current_attempts: int) -> float:
        """Delay (ms) before the attempt after ``current_attempts`` (no jitter)."""
        if current_attempts <= 1:
            return float(self.initial_delay_millis)
        delay = self.initial_delay_millis * self.multiplier ** (current_attempts - 1)
        return float(min(delay, self.max_retry_delay_millis))

    def backoff_seconds(self, current_attempts: int, rng: random.Random | None = None) -> float:
        """The delay actually used, in seconds, jitter applied."""
        delay = self.get_backoff_time_millis(current_attempts) / 1000.0
        if self.jitter:
            delay *= 1.0 - self.jitter * (rng or random).random()
        return delay

    def should_retry_result(self, results: Sequence[Any]) -> bool:
        return self.result_predicate is not None and bool(self.result_predicate(results))

    def should_retry_exception(self, exc: BaseException) -> bool:
        return self.exception_predicate is not None and bool(self.exception_predicate(exc))

    def get_retry_predicate(self) -> tuple[ResultPredicate | None, ExceptionPredicate | None]:
        return self.result_predicate, self.exception_predicate
