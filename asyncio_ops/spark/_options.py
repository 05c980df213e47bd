"""The Spark functions' keywords: what callers and type checkers see of the options.

The options themselves, with their types, defaults, checks and the docs'
metadata, are declared once in :mod:`asyncio_ops._runtime._options`
(:class:`WaitOptions`, :class:`KeyedOptions`) and re-exported here. This
module derives from them what the public functions show: :data:`WAIT_SIGNATURE`
(``ordered_wait`` / ``unordered_wait``), :data:`KEYED_SIGNATURE`
(``keyed_process``) and :class:`WaitKeywords` (``**options`` for type checkers,
held equal to the fields by ``tests/spark/test_options_object.py``).
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypedDict

from .._engine._retry import AsyncRetryStrategy
from .._runtime import KeyedOptions, PartitionOptions, WaitOptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._metrics import AsyncMetrics

__all__ = [
    "KEYED_SIGNATURE",
    "WAIT_SIGNATURE",
    "KeyedKeywords",
    "KeyedOptions",
    "PartitionOptions",
    "WaitKeywords",
    "WaitOptions",
]

Seconds = float | timedelta | str


class WaitKeywords(TypedDict, total=False):
    """The optional keywords of ``ordered_wait`` / ``unordered_wait``, for type checkers
    (``**options: Unpack[WaitKeywords]``): :class:`WaitOptions`'s fields but ``timeout``,
    with their types (held equal by a test)."""

    capacity: int | str | None
    max_capacity: int
    output_buffer: int | None
    retry: AsyncRetryStrategy | None
    on_error: str
    on_empty: str | None
    rows_as: str
    key: str | Sequence[str] | None
    event_time: str | None
    watermark_delay: Seconds | None
    watermark_interval: int
    late_records: str
    max_parallelism: int
    num_partitions: int | None
    batch_size: int | None
    checkpoint_location: str | None
    checkpoint_version: int | None
    checkpoint_flush_rows: int
    checkpoint_flush_interval: Seconds
    state_backend: str
    drain_timeout: Seconds | None
    retain_versions: int
    chunk_size: int | str | None
    metrics: AsyncMetrics | None
    preflight: bool
    keep_input_columns: bool
    uid: str | None


class KeyedKeywords(TypedDict, total=False):
    """The optional keywords of ``keyed_process``, for type checkers: :class:`KeyedOptions`'s
    fields, with their types (held equal by a test)."""

    event_time: str | None
    watermark_delay: Seconds | None
    watermark_interval: int
    max_parallelism: int
    num_partitions: int | None
    batch_size: int | None
    checkpoint_location: str | None
    state_backend: str
    retain_versions: int
    preflight: bool
    uid: str | None
    full_snapshot_interval: int
    allow_non_restored_state: bool


def _signature(
    options: type[PartitionOptions],
    keywords: type[Any],
    leading: dict[str, str],
    trailing: tuple[str, ...] = (),
) -> inspect.Signature:
    """``(df, fn, *, <leading>, <every option of ``options`` with its default>, <trailing>)``:
    ``leading`` are required keywords (with their annotations), ``trailing`` optional
    arguments of the function's own (default None)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("df", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(name, keyword, annotation=a) for name, a in leading.items()),
    ]
    for f in fields(options):
        if f.name not in leading:
            given = keywords.__annotations__[f.name]  # what a caller may pass
            default = None if f.default is MISSING else f.default
            params.append(inspect.Parameter(f.name, keyword, default=default, annotation=given))
    params += [inspect.Parameter(name, keyword, default=None) for name in trailing]
    return inspect.Signature(params, return_annotation="DataFrame")


WAIT_SIGNATURE: Final = _signature(
    WaitOptions, WaitKeywords,
    {"timeout": "float | timedelta | str", "output_schema": "str | StructType"},
)  # fmt: skip
"""The signature ``ordered_wait`` and ``unordered_wait`` show (``help()``, ``inspect``) and
check keywords against: every option, by keyword, with its default."""
KEYED_SIGNATURE: Final = _signature(
    KeyedOptions, KeyedKeywords,
    {"key": "str | Sequence[str]", "output_schema": "str | StructType"},
    ("initial_state", "initial_state_fn"),
)  # fmt: skip
"""The signature ``keyed_process`` shows and checks keywords against."""
