"""The options of ``ordered_wait`` / ``unordered_wait`` (``WaitOptions``) and of
``keyed_process`` (``KeyedOptions``) are defined once: the public signatures, the type
checkers' keywords, docs/spark.md's option table and the runtime's specs are held equal
to them here, and every option's bad value is refused naming the option."""

from __future__ import annotations

import inspect
import re
from dataclasses import MISSING, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from asyncio_ops import AsyncRetryStrategy, ConfigurationError
from asyncio_ops._runtime import KeyedProcessSpec, PartitionSpec
from asyncio_ops.spark import AsyncDataStream, keyed_process, ordered_wait, unordered_wait
from asyncio_ops.spark._options import (
    KEYED_SIGNATURE,
    WAIT_SIGNATURE,
    KeyedKeywords,
    KeyedOptions,
    WaitKeywords,
    WaitOptions,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
DURATIONS = {"timeout", "watermark_delay", "checkpoint_flush_interval", "drain_timeout"}


def _documented() -> dict[str, str]:
    """docs/spark.md's option table: option -> its default cell."""
    text = DOCS.read_text()
    start = text.index("| option | default | meaning |")
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        name, default = (cell.strip() for cell in line.split("|")[1:3])
        rows[name.strip("`")] = default
    return rows


def test_the_docs_table_lists_every_option_with_its_default() -> None:
    documented = _documented()
    options = {f.name: f.metadata["shown"] for f in fields(WaitOptions)}
    assert documented.pop("output_schema") == "required"  # the output's type, not an option
    assert documented == options


@pytest.mark.parametrize(
    ("keywords", "options"), [(WaitKeywords, WaitOptions), (KeyedKeywords, KeyedOptions)]
)
def test_the_keywords_type_checkers_see_are_the_options(keywords: Any, options: Any) -> None:
    given = {k: getattr(v, "__forward_arg__", v) for k, v in keywords.__annotations__.items()}
    declared = {f.name: f.type for f in fields(options) if f.name != "timeout"}
    assert set(given) == set(declared)
    for name, annotation in declared.items():
        if name in DURATIONS:  # given as seconds, a timedelta or an interval string
            assert given[name] == annotation.replace("float", "Seconds"), name
        elif name == "metrics":  # the runtime knows the protocol, callers its class
            assert (annotation, given[name]) == ("MetricsSink | None", "AsyncMetrics | None")
        else:
            assert given[name] == annotation, name


# what a spec holds besides its options: what the Spark layer built or resolved that is
# not an option (each resolved option keeps its option's name: key, capacity, uid, ...)
NOT_OPTIONS = {
    "function", "function_token", "mode", "output_schema", "added_columns", "row_factory",
    "checkpoint", "run_token", "run_epoch", "key_schema", "seeded", "plan_token",
}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "options"), [(PartitionSpec, WaitOptions), (KeyedProcessSpec, KeyedOptions)]
)
def test_a_spec_carries_its_options_and_only_what_is_resolved_under_the_options_names(
    spec: Any, options: Any
) -> None:
    held = {f.name: f for f in fields(spec)}
    assert held.pop("options").type == options.__name__
    option_names = {f.name for f in fields(options)} | {"key"}  # keyed_process's own key=
    resolved = set(held) - NOT_OPTIONS
    assert resolved <= option_names, resolved - option_names
    # a resolved option has no default of its own in the spec (its default is the
    # option's, resolved by the Spark layer), but where None or empty means "none"
    for name in resolved:
        default = held[name].default
        assert default is MISSING or default in (None, ()), (name, default)


def test_keyed_process_shows_and_checks_every_option() -> None:
    assert inspect.signature(keyed_process) == KEYED_SIGNATURE
    names = [p.name for p in KEYED_SIGNATURE.parameters.values()]
    assert names[:4] == ["df", "fn", "key", "output_schema"]
    assert names[-2:] == ["initial_state", "initial_state_fn"]
    assert set(names[4:-2]) == {f.name for f in fields(KeyedOptions)}
    defaults = {p.name: p.default for p in KEYED_SIGNATURE.parameters.values()}
    assert all(defaults[f.name] == f.default for f in fields(KeyedOptions))
    with pytest.raises(ConfigurationError, match=r"no option 'retain_version'.*'retain_versions'"):
        keyed_process(None, None, key="k", output_schema="x int", retain_version=3)  # type: ignore[arg-type, call-arg]


def test_the_public_functions_show_and_check_every_option() -> None:
    for wait in (ordered_wait, unordered_wait):
        assert inspect.signature(wait) == WAIT_SIGNATURE
    names = [p.name for p in WAIT_SIGNATURE.parameters.values()]
    assert names[:4] == ["df", "fn", "timeout", "output_schema"]
    assert set(names[4:]) == {f.name for f in fields(WaitOptions)} - {"timeout"}
    for call in (
        lambda: ordered_wait(None, None, timeout=1, output_schema="x int", on_emtpy="keep"),  # type: ignore[arg-type, call-arg]
        lambda: unordered_wait(None, None, timeout=1, output_schema="x int", on_emtpy="keep"),  # type: ignore[arg-type, call-arg]
        lambda: AsyncDataStream.ordered_wait(None, None, 1, on_emtpy="keep"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigurationError, match=r"no option 'on_emtpy'.*mean 'on_empty'"):
            call()


BAD: dict[str, Any] = {
    "timeout": 0,
    "capacity": 0,
    "max_capacity": 0,
    "output_buffer": -1,
    "retry": "three times",
    "on_error": "ignore",
    "on_empty": "skip",
    "rows_as": "tuple",
    "watermark_interval": 0,
    "late_records": "later",
    "max_parallelism": 0,
    "num_partitions": 0,
    "batch_size": 0,
    "checkpoint_flush_rows": 0,
    "checkpoint_flush_interval": "soon",
    "state_backend": "disk",
    "chunk_size": "big",
    "uid": "a/b",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_naming_the_option(name: str) -> None:
    given: dict[str, Any] = {"timeout": 1.0, name: BAD[name]}
    with pytest.raises(ConfigurationError, match=name):
        WaitOptions.of(**given)


def test_options_that_need_another_are_refused_without_it() -> None:
    with pytest.raises(ConfigurationError, match="watermark_delay needs event_time"):
        WaitOptions.of(timeout=1, watermark_delay=5)
    for needs in ({"drain_timeout": 5}, {"checkpoint_version": 3}):
        with pytest.raises(ConfigurationError, match="need checkpoint_location"):
            WaitOptions.of(timeout=1, **needs)
    with pytest.raises(ConfigurationError, match="retain_versions must be an int >= 2"):
        WaitOptions.of(timeout=1, checkpoint_location="/tmp/x", retain_versions=1)
    with pytest.raises(ConfigurationError, match=r"num_partitions must be an int in \[1, 4\]"):
        WaitOptions.of(timeout=1, max_parallelism=4, num_partitions=8)


def test_durations_are_held_as_seconds_in_every_form() -> None:
    o = WaitOptions.of(
        timeout=timedelta(milliseconds=1500), event_time="ts", watermark_delay="2 minutes",
        checkpoint_location="/tmp/x", drain_timeout="500 milliseconds",
        checkpoint_flush_interval=3,
    )  # fmt: skip
    assert (o.timeout, o.watermark_delay, o.drain_timeout, o.checkpoint_flush_interval) == (
        1.5, 120.0, 0.5, 3.0,
    )  # fmt: skip
    assert WaitOptions.of(timeout=float("inf")).timeout == float("inf")


def test_the_output_buffer_default_follows_the_resolved_capacity() -> None:
    o = WaitOptions.of(timeout=1)
    assert (o.output_buffer_for(100), o.output_buffer_for("auto")) == (400, 4 * o.max_capacity)
    assert WaitOptions.of(timeout=1, output_buffer=0).output_buffer_for(100) == 0
    retry = AsyncRetryStrategy.fixed_delay(2, 1)
    assert WaitOptions.of(timeout=1, retry=retry).retry is retry


def test_every_documented_row_names_a_field_with_a_unit_or_values_where_it_has_one() -> None:
    for f in fields(WaitOptions):
        meta = f.metadata
        assert set(meta) == {"shown", "unit", "allowed"}, f.name
        if f.name in DURATIONS:
            assert meta["unit"] == "seconds", f.name
        assert re.fullmatch(r"[^|\n]+", meta["shown"]), f.name
