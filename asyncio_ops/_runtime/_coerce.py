"""The conversions a result value gets when Arrow refuses it for its declared type.

Arrow builds an output column from Python values strictly: a ``Decimal`` is not a
double, a ``uuid.UUID`` is not a string. Spark converts both (a cast of a decimal
to double, a UUID's text), and lookups return them (asyncpg decodes Postgres
``numeric`` to ``Decimal`` and ``uuid`` to ``UUID``). Each converts once:

- ``Decimal`` into ``double``: the nearest double (``float(d)``, correctly
  rounded, as Spark's cast of a decimal to double); into ``float``: the nearest
  float, rounded once from the decimal's text, not through a double;
- ``uuid.UUID`` into ``string``: its canonical text (``str(u)``);
- inside lists, structs and maps, the same, element by element.

Nothing else is converted: a ``Decimal`` too precise for ``decimal(p,s)`` or a
string in a number column stays an error that names the column and the value.
The conversions run only after Arrow refused a batch, so output that needs none
costs nothing; the per-row and the columnar path use the same ones, so both
give the same values (``tests/connectors/test_types_in_spark.py``).

Messages about a column name its type as the user declared it, in Spark's
words (:func:`spark_type`: ``decimal(5,2)``, ``bigint``), not Arrow's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import pyarrow as pa


def coerced(value: Any, type_: pa.DataType) -> Any:
    """``value`` converted for ``type_`` where Spark would convert it (else unchanged)."""
    if value is None:
        return None
    if pa.types.is_floating(type_):
        if isinstance(value, Decimal):
            if pa.types.is_float64(type_):
                return float(value)
            # the decimal's text parsed as the narrower float: one rounding
            return pa.array([str(value)], pa.string()).cast(type_)[0].as_py()
    elif pa.types.is_string(type_) or pa.types.is_large_string(type_):
        if isinstance(value, uuid.UUID):
            return str(value)
    elif pa.types.is_struct(type_):
        if isinstance(value, dict):
            fields = {f.name: f.type for f in type_}
            new = {k: coerced(v, fields[k]) if k in fields else v for k, v in value.items()}
            return value if _same(new.values(), value.values()) else new
    elif pa.types.is_map(type_):
        if isinstance(value, dict):
            new = {k: coerced(v, type_.item_type) for k, v in value.items()}
            return value if _same(new.values(), value.values()) else new
    elif (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and isinstance(
        value, list | tuple
    ):
        items = [coerced(v, type_.value_type) for v in value]
        return value if _same(items, value) else items
    return value


def has_fraction(value: Any) -> bool:
    """A float or ``Decimal`` that is not a whole number: Arrow would truncate it into an
    integer column, so the output refuses it (never converted)."""
    kind = type(value)
    if kind is float:
        return not value.is_integer()
    return kind is Decimal and value.is_finite() and value != value.to_integral_value()


def _same(new: Iterable[Any], old: Iterable[Any]) -> bool:
    return all(a is b for a, b in zip(new, old, strict=True))


def decimals_as_floats(array: pa.Array, type_: pa.DataType) -> pa.Array:
    """A decimal array as ``type_`` (float or double): each value's exact text parsed
    once, so that it rounds as :func:`coerced` rounds one ``Decimal``."""
    return array.cast(pa.string()).cast(type_)


def coerced_array(values: Any, type_: pa.DataType) -> pa.Array | None:
    """``values`` (a list or an Arrow array) as an array of ``type_`` after the
    conversions, or None if no conversion applies or they do not make it fit."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if pa.types.is_decimal(values.type) and pa.types.is_floating(type_):
            return decimals_as_floats(values, type_)
        values = values.to_pylist()
    converted = [coerced(v, type_) for v in values]
    if _same(converted, values):
        return None  # nothing to convert: the caller's error stands
    try:
        return pa.array(converted, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None


def coerced_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """``rows`` with every value converted for its column of ``schema`` (new dicts)."""
    types = {f.name: f.type for f in schema}
    return [{k: coerced(v, types[k]) if k in types else v for k, v in row.items()} for row in rows]


_SPARK_NAMES: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.date32(): "date",
    pa.null(): "void",
}


def spark_type(type_: pa.DataType) -> str:
    """``type_`` as Spark names it (its ``simpleString``): ``decimal(5,2)`` for Arrow's
    ``decimal128(5, 2)``, ``bigint`` for ``int64``, ``array<int>``, ``struct<a:string>``;
    Arrow's own name for a type Spark does not have."""
    name = _SPARK_NAMES.get(type_)
    if name is not None:
        return name
    if pa.types.is_decimal(type_):
        return f"decimal({type_.precision},{type_.scale})"
    if pa.types.is_timestamp(type_):
        return "timestamp" if type_.tz is not None else "timestamp_ntz"
    if pa.types.is_map(type_):
        return f"map<{spark_type(type_.key_type)},{spark_type(type_.item_type)}>"
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return f"array<{spark_type(type_.value_type)}>"
    if pa.types.is_struct(type_):
        fields = ",".join(f"{f.name}:{spark_type(f.type)}" for f in type_)
        return f"struct<{fields}>"
    return str(type_)
