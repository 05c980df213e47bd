"""asyncio_ops.options: durations (Spark's interval strings too), counts, choices, segments."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from asyncio_ops import AsyncWaitOperator, ConfigurationError
from asyncio_ops.options import (
    at_least,
    choice,
    int_between,
    path_segment,
    positive_int,
    positive_seconds,
    seconds,
    seconds_or_zero,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2, 2.0), (0.5, 0.5), (timedelta(minutes=1), 60.0), ("2 seconds", 2.0),
        ("500 milliseconds", 0.5), ("1 minute", 60.0), ("1.5 s", 1.5), ("3 hours", 10800.0),
        ("INTERVAL 10 SECONDS", 10.0), ("250ms", 0.25), (math.inf, math.inf),
    ],
)  # fmt: skip
def test_durations_as_seconds_timedelta_or_interval_strings(value: object, expected: float) -> None:
    assert positive_seconds(value, "timeout") == expected


@pytest.mark.parametrize(
    "value", [0, -1, "0 seconds", math.nan, "soon", "5 fortnights", True, None]
)
def test_a_bad_duration_names_the_option_and_the_value(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^timeout .*" + f"{value!r}"[:4]):
        positive_seconds(value, "timeout")


def test_bounds_and_zero() -> None:
    assert seconds_or_zero(None, "delay") == 0.0
    assert seconds_or_zero(0, "delay") == 0.0
    with pytest.raises(ConfigurationError, match=r"delay must be a finite number of seconds"):
        seconds_or_zero(math.inf, "delay")
    assert seconds(60, "max_delay", high=60, low_ok=True) == 60.0
    with pytest.raises(ConfigurationError, match=r"max_delay must be >= 0 and <= 60 seconds"):
        seconds(61, "max_delay", high=60, low_ok=True)


def test_counts_choices_and_segments() -> None:
    assert positive_int(3, "capacity") == 3
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigurationError, match=r"capacity must be an int > 0"):
            positive_int(bad, "capacity")
    assert at_least(0, "max_retries", 0) == 0
    with pytest.raises(ConfigurationError, match=r"pool_size must be an int >= 1, got 0"):
        at_least(0, "pool_size", 1)
    with pytest.raises(ConfigurationError, match=r"min_pool_size must be an int in \[0, 4\]"):
        int_between(5, "min_pool_size", 0, 4)
    assert choice("fail", "on_error", ("fail", "error_column")) == "fail"
    with pytest.raises(ConfigurationError, match=r"on_error must be one of .*'drop'"):
        choice("drop", "on_error", ("fail", "error_column"))
    assert path_segment("enrich-v2.1_a", "uid") == "enrich-v2.1_a"
    for bad in ("a/b", "..", ".", "", "x" * 101, "a b"):
        with pytest.raises(ConfigurationError, match="uid must be one path segment"):
            path_segment(bad, "uid")


def test_the_operator_takes_an_interval_string() -> None:
    async def fn(value: int) -> list[int]:
        return [value]

    op = AsyncWaitOperator(fn, output=lambda e: None, timeout="1.5 seconds")
    assert op.timeout == 1.5
