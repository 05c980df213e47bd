"""How a lookup query's result rows are matched to the keys it was asked for.

One rule for every path of :class:`~asyncio_ops.connectors.postgres.PostgresLookup`
(one row at a time, dict chunks, columnar), so that they answer alike:

- a result row whose ``on`` value is NULL, or has a NULL part for a composite
  key, matches no input row (an outer join's unmatched side; a NULL key is never
  looked up);
- a non-NULL ``on`` value is matched by equality to the keys, and must be one of
  the keys its query was asked for, of the key's kind (:func:`python_kind`,
  :func:`arrow_kind`): numbers of any width match numbers, strings match
  strings, and so on. A value of another kind (``id`` for a string key: the
  query compared ``id::text`` but returned ``id``) or a value that was not asked
  for (the query returned ``upper(name)``) is a
  :class:`~asyncio_ops.connectors.LookupQueryError` naming the column, the value
  and the key's kind. Neither is ever a silent miss, nor a match made by
  converting one kind into the other.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._exceptions import LookupQueryError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "arrow_kind",
    "foreign_column",
    "foreign_kind",
    "not_asked",
    "postgres_kind",
    "python_kind",
]

_SHOWN: Final = 80  # characters of a value shown in a message


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def python_kind(value: Any) -> str:
    """The kind of a decoded value, as matching compares kinds."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | decimal.Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, datetime.time):
        return "time"
    if isinstance(value, datetime.timedelta):
        return "interval"
    if isinstance(value, uuid.UUID):
        return "uuid"
    return type(value).__name__


def arrow_kind(type_: pa.DataType) -> str:
    """The kind of an Arrow column's values, as :func:`python_kind` names it."""
    import pyarrow as pa

    t = pa.types
    if t.is_boolean(type_):
        return "boolean"
    if t.is_integer(type_) or t.is_floating(type_) or t.is_decimal(type_):
        return "number"
    if t.is_string(type_) or t.is_large_string(type_) or t.is_string_view(type_):
        return "string"
    if t.is_binary(type_) or t.is_large_binary(type_) or t.is_fixed_size_binary(type_):
        return "binary"
    if t.is_timestamp(type_):
        return "timestamp"
    if t.is_date(type_):
        return "date"
    if t.is_time(type_):
        return "time"
    if t.is_duration(type_) or t.is_interval(type_):
        return "interval"
    return str(type_)


_POSTGRES_KINDS: Final = {
    "bool": "boolean",
    "int2": "number", "int4": "number", "int8": "number", "oid": "number",
    "float4": "number", "float8": "number", "numeric": "number",
    "text": "string", "varchar": "string", "bpchar": "string", "name": "string",
    "bytea": "binary",
    "timestamp": "timestamp", "timestamptz": "timestamp",
    "date": "date",
    "time": "time", "timetz": "time",
    "interval": "interval",
}  # fmt: skip


def postgres_kind(type_name: str) -> str | None:
    """The kind of the values of a PostgreSQL result column of the built-in type
    ``type_name`` (``int4``, ``text``, ...) as asyncpg decodes them, as
    :func:`python_kind` names it; None for a type not listed (an enum, a domain, an
    extension's type), whose kind only its values tell."""
    return _POSTGRES_KINDS.get(type_name)


def foreign_column(
    column: str, type_name: str, kind: str, key: str, key_type: object, key_kind: str
) -> LookupQueryError:
    """The error for a result ``column`` whose type is of another kind than its key
    column's (found before any row, from the prepared query's description)."""
    return LookupQueryError(
        f"the query's column {column!r} is {type_name} (a {kind}), but the key column "
        f"{key!r} is {key_type} (a {key_kind}): a result row is matched to the key it "
        f"equals, and a {kind} never equals a {key_kind} (cast it in SQL to the key's "
        f"type, e.g. {column}::text for string keys, and compare the cast column)"
    )


def foreign_kind(column: str, value: Any, kind: str, key_kind: str) -> LookupQueryError:
    """The error for a result's ``column`` value of another kind than the key's."""
    return LookupQueryError(
        f"the query's column {column!r} returned {_show(value)} (a {kind}) for a key "
        f"that is a {key_kind}: a result row is matched to the key it equals, and a "
        f"{kind} never equals a {key_kind} (cast it in SQL to the key's type, e.g. "
        f"{column}::text for string keys, and compare the cast column)"
    )


def not_asked(column: str, value: Any, asked: Sequence[Hashable]) -> LookupQueryError:
    """The error for a result's ``column`` value that equals none of the keys asked for."""
    sample = ", ".join(_show(k) for k in asked[:3]) + (", ..." if len(asked) > 3 else "")
    return LookupQueryError(
        f"the query's column {column!r} returned {_show(value)}, which is not one of the "
        f"keys it was asked for ({sample}): a result row is matched to the key it equals, "
        f"so select the matched value itself as {column!r} (or cast it in SQL to the "
        "key's type)"
    )
