from __future__ import annotations

import random

import pytest

from asyncio_ops import AsyncRetryStrategy, ConfigurationError
from asyncio_ops.async_retry_predicates import (
    empty_result_predicate,
    exception_type_predicate,
    has_exception_predicate,
)


def test_no_restart_never_retries() -> None:
    s = AsyncRetryStrategy.no_restart()
    assert not s.enabled
    assert not s.can_retry(1)


def test_fixed_delay_counts_retries_after_the_first_attempt() -> None:
    s = AsyncRetryStrategy.fixed_delay(3, 100, empty_result_predicate)
    assert s.enabled
    assert [s.can_retry(n) for n in (1, 2, 3, 4)] == [True, True, True, False]
    assert [s.get_backoff_time_millis(n) for n in (1, 2, 3)] == [100, 100, 100]
    assert s.should_retry_result([]) and not s.should_retry_result([1])
    assert not s.should_retry_exception(ValueError())


def test_exponential_schedule_is_a_function_of_the_attempt_only() -> None:
    s = AsyncRetryStrategy.exponential_backoff(
        6, 10, 150, 2.0, exception_predicate=has_exception_predicate
    )
    schedule = [s.get_backoff_time_millis(n) for n in range(1, 7)]
    assert schedule == [10, 20, 40, 80, 150, 150]
    # asking again (as another element would) gives the same answer: no shared state
    assert [s.get_backoff_time_millis(n) for n in range(1, 7)] == schedule
    assert s.get_backoff_time_millis(2) == 20


def test_jitter_stays_within_bounds() -> None:
    s = AsyncRetryStrategy.fixed_delay(2, 1000, empty_result_predicate, jitter=0.5)
    rng = random.Random(1)
    delays = [s.backoff_seconds(1, rng) for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in delays)
    assert max(delays) - min(delays) > 0.3


def test_exception_type_predicate() -> None:
    p = exception_type_predicate((ConnectionError, TimeoutError))
    assert p(ConnectionResetError()) and p(TimeoutError())
    assert not p(ValueError()) and not p(None)
    assert has_exception_predicate(ValueError()) and not has_exception_predicate(None)
    assert empty_result_predicate([]) and empty_result_predicate(None)
    assert not empty_result_predicate([0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 1, "initial_delay_millis": -5}, "delay"),
        ({"max_attempts": 1, "initial_delay_millis": 10, "max_retry_delay_millis": 5}, "max_retry"),
        ({"max_attempts": 1, "multiplier": 0.5}, "multiplier"),
        ({"max_attempts": 1, "jitter": 2.0}, "jitter"),
    ],
)
def test_bad_configuration_is_named(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        AsyncRetryStrategy(**kwargs)  # type: ignore[arg-type]
