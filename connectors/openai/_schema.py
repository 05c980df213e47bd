"""Structured answers: a JSON Schema derived from the declared Spark output schema, and
the model's JSON answer checked against it and typed into the columns' values.

Contract::

    schema = AnswerSchema(arrow_schema)      # the declared output columns, as Arrow
    schema.response_format()                 # {"type": "json_schema", "json_schema": {...}}
    schema.typed(json_text)                  # {column: value} or LookupDecodeError

The JSON Schema, per Spark type (Arrow type of the column):

========================================  ==========================================
``string``                                ``{"type": "string"}``
``boolean``                               ``{"type": "boolean"}``
``tinyint`` .. ``bigint``                 ``{"type": "integer"}`` (checked to fit)
``float``, ``double``                     ``{"type": "number"}``
``decimal(p,s)``                          ``{"type": "number"}``: at most ``s`` places and
                                          ``p - s`` integer digits, never rounded
``date``                                  ``{"type": "string", "format": "date"}``
``timestamp``                             ``{"type": "string", "format": "date-time"}``:
                                          an offset, or UTC when it has none
``timestamp_ntz``                         ``{"type": "string", "format": "date-time",
                                          "pattern": ...}``: without an offset
``binary``                                ``{"type": "string", "contentEncoding":
                                          "base64"}``
``array<T>``                              ``{"type": "array", "items": T}``
``struct<a:T,...>``                       ``{"type": "object", "properties": {...},
                                          "required": [every field],
                                          "additionalProperties": false}``
``map<string,T>``                         ``{"type": "object", "additionalProperties": T}``
========================================  ==========================================

A nullable column (or element, or field) adds ``"null"`` to its types. Every
column and struct field is required, as OpenAI's ``strict`` mode asks (it is
set unless a map is declared, which strict mode cannot express): a model
that has nothing to say answers ``null``. Fields the answer has beyond the
declared ones are left out (as ``from_json`` does). Anything else (a value
of another JSON type, an integer out of its column's range, a missing
field, a null where the schema allows none, a date that does not parse) is
a :class:`LookupDecodeError` naming the column by its path
(``author.name``, ``tags[2]``, ``scores["x"]``) and the value. Other Spark
types (intervals, maps with non-string keys) are refused when the schema is
bound, naming the column and its type.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import pyarrow as pa

from asyncio_ops import ConfigurationError

from .. import LookupDecodeError

__all__ = ["AnswerSchema"]

_UTC: Final = dt.UTC
_LOCAL_DATE_TIME: Final = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$"


class AnswerSchema:
    """The declared output columns as a JSON Schema, and answers typed by it."""

    def __init__(self, schema: pa.Schema, *, name: str = "row") -> None:
        self.schema = schema
        self.name = name
        self.has_map = False
        self.json_schema = {
            "type": "object",
            "properties": {f.name: self._of(f.type, f.nullable, f.name) for f in schema},
            "required": list(schema.names),
            "additionalProperties": False,
        }

    def response_format(self) -> dict[str, Any]:
        """The chat request's ``response_format``."""
        return {
            "type": "json_schema",
            "json_schema": {"name": self.name, "schema": self.json_schema,
                            "strict": not self.has_map},
        }  # fmt: skip

    def _of(self, type_: pa.DataType, nullable: bool, path: str) -> dict[str, Any]:
        out: dict[str, Any]
        if pa.types.is_string(type_) or pa.types.is_large_string(type_):
            out = {"type": "string"}
        elif pa.types.is_boolean(type_):
            out = {"type": "boolean"}
        elif pa.types.is_integer(type_):
            out = {"type": "integer"}
        elif pa.types.is_floating(type_) or pa.types.is_decimal(type_):
            out = {"type": "number"}
        elif pa.types.is_date32(type_) or pa.types.is_date64(type_):
            out = {"type": "string", "format": "date"}
        elif pa.types.is_timestamp(type_):
            out = {"type": "string", "format": "date-time"}
            if type_.tz is None:  # timestamp_ntz: a local date-time, no offset
                out["pattern"] = _LOCAL_DATE_TIME
        elif pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
            out = {"type": "string", "contentEncoding": "base64"}
        elif pa.types.is_list(type_) or pa.types.is_large_list(type_):
            item = type_.value_field
            out = {"type": "array", "items": self._of(item.type, item.nullable, f"{path}[]")}
        elif pa.types.is_struct(type_):
            fields = [type_.field(i) for i in range(type_.num_fields)]
            out = {
                "type": "object",
                "properties": {
                    f.name: self._of(f.type, f.nullable, f"{path}.{f.name}") for f in fields
                },
                "required": [f.name for f in fields],
                "additionalProperties": False,
            }
        elif pa.types.is_map(type_) and (
            pa.types.is_string(type_.key_type) or pa.types.is_large_string(type_.key_type)
        ):
            self.has_map = True
            item = type_.item_field
            values = self._of(item.type, item.nullable, f"{path}{{}}")
            out = {"type": "object", "additionalProperties": values}
        else:
            raise ConfigurationError(
                f"ChatLookup cannot ask a model for the output column {path!r} of type "
                f"{type_}: declare it as a string, number, boolean, date, timestamp, binary, "
                "array, struct or map<string, ...>"
            )
        if nullable:
            out["type"] = [out["type"], "null"]
        return out

    # -- answers ---------------------------------------------------------------------
    def typed(self, said: Any) -> dict[str, Any]:
        """The answer ``said`` (the message's text) as ``{column: value}``, each value of
        its column's type; a LookupDecodeError naming the column otherwise."""
        parsed = answer_object(said, self.schema.names, require=False)
        out: dict[str, Any] = {}
        for field in self.schema:  # in order: a column's own error before a later one's
            if field.name not in parsed:
                raise LookupDecodeError(
                    f"the model's answer lacks the column {field.name!r} (asked for "
                    f"{self.schema.names}): {str(said)[:200]!r}"
                )
            out[field.name] = _value(parsed[field.name], field.type, field.nullable, field.name)
        return out


def answer_object(said: Any, columns: list[str], *, require: bool = True) -> dict[str, Any]:
    """The model's answer ``said`` parsed as the JSON object of ``columns`` asked for
    (with ``require``, each present; values as JSON gives them); a LookupDecodeError
    naming what is wrong (not JSON, not an object, a column missing) and the answer's
    start otherwise."""
    try:
        parsed = json.loads(said)
    except (TypeError, ValueError) as exc:
        raise LookupDecodeError(
            f"the model's answer is not the JSON object asked for (columns {columns}): "
            f"{str(said)[:200]!r}"
        ) from exc
    if not isinstance(parsed, dict):
        raise LookupDecodeError(
            f"the model answered a JSON {type(parsed).__name__}, not an object with the "
            f"columns {columns}: {str(said)[:200]!r}"
        )
    missing = [c for c in columns if c not in parsed] if require else []
    if missing:
        raise LookupDecodeError(
            f"the model's answer lacks the column {missing[0]!r} (asked for {columns}): "
            f"{str(said)[:200]!r}"
        )
    return parsed


def _bad(path: str, value: Any, wanted: str) -> LookupDecodeError:
    shown = json.dumps(value)[:100] if _jsonable(value) else repr(value)[:100]
    return LookupDecodeError(
        f"the model's answer does not fit the output column {path!r}: {wanted} expected, "
        f"got {shown}"
    )


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _value(value: Any, type_: pa.DataType, nullable: bool, path: str) -> Any:
    """``value`` (decoded JSON) as a value of ``type_``; the errors name ``path``."""
    if value is None:
        if nullable:
            return None
        raise _bad(path, value, "a value (the column is not nullable)")
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        if not isinstance(value, str):
            raise _bad(path, value, "a string")
        return value
    if pa.types.is_boolean(type_):
        if not isinstance(value, bool):
            raise _bad(path, value, "true or false")
        return value
    if pa.types.is_integer(type_):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(path, value, f"an integer ({type_})")
        bits = type_.bit_width
        low, high = (
            (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            if pa.types.is_signed_integer(type_)
            else (0, 2**bits - 1)
        )
        if not low <= value <= high:
            raise _bad(path, value, f"an integer from {low} to {high} ({type_})")
        return value
    if pa.types.is_floating(type_):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(path, value, "a number")
        return float(value)
    if pa.types.is_decimal(type_):
        return _decimal(value, type_, path)
    if pa.types.is_date32(type_) or pa.types.is_date64(type_):
        if not isinstance(value, str):
            raise _bad(path, value, "a date as text (YYYY-MM-DD)")
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            raise _bad(path, value, "a date (YYYY-MM-DD)") from None
    if pa.types.is_timestamp(type_):
        return _timestamp(value, type_, path)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        if not isinstance(value, str):
            raise _bad(path, value, "base64 text")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(path, value, "base64 text") from None
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        if not isinstance(value, list):
            raise _bad(path, value, "an array")
        item = type_.value_field
        return [_value(v, item.type, item.nullable, f"{path}[{i}]") for i, v in enumerate(value)]
    if pa.types.is_struct(type_):
        if not isinstance(value, dict):
            raise _bad(path, value, "an object")
        out = {}
        for i in range(type_.num_fields):
            field = type_.field(i)
            inner = f"{path}.{field.name}"
            if field.name not in value:
                raise LookupDecodeError(
                    f"the model's answer lacks the field {inner!r} of the output column "
                    f"{path.split('.')[0].split('[')[0]!r}"
                )
            out[field.name] = _value(value[field.name], field.type, field.nullable, inner)
        return out
    if pa.types.is_map(type_):
        if not isinstance(value, dict):
            raise _bad(path, value, "an object")
        item = type_.item_field
        return [
            (k, _value(v, item.type, item.nullable, f"{path}[{json.dumps(k)}]"))
            for k, v in value.items()
        ]
    raise _bad(path, value, str(type_))  # refused when the schema was bound


def _decimal(value: Any, type_: pa.Decimal128Type, path: str) -> Decimal:
    p, s = type_.precision, type_.scale
    wanted = f"a number with at most {s} decimal places and {p - s} integer digits " \
        f"(decimal({p},{s}))"  # fmt: skip
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(path, value, wanted)
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise _bad(path, value, wanted) from None
    if not number.is_finite():
        raise _bad(path, value, wanted)
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    places = max(0, -exponent)
    digits = len(str(int(abs(number)))) if abs(number) >= 1 else 0
    if places > s or digits > p - s:
        raise _bad(path, value, wanted)
    return number


def _timestamp(value: Any, type_: pa.TimestampType, path: str) -> dt.datetime:
    aware = type_.tz is not None
    wanted = ("a date-time (ISO 8601; UTC when it has no offset)" if aware
              else "a date-time without an offset (ISO 8601; timestamp_ntz)")  # fmt: skip
    if not isinstance(value, str):
        raise _bad(path, value, wanted)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise _bad(path, value, wanted) from None
    if aware:
        return parsed.replace(tzinfo=_UTC) if parsed.tzinfo is None else parsed.astimezone(_UTC)
    if parsed.tzinfo is not None:
        raise _bad(path, value, wanted)
    return parsed
