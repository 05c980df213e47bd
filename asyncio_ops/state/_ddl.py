"""Spark's type names as typed state reads them: a DDL string or a pyspark DataType's JSON
form to an Arrow type, and an Arrow type back to Spark's DDL.

Contract: :class:`DdlParser` parses a type (``"array<struct<n long>>"``) or a list of
fields (``"n long, last timestamp"``, a struct) with Spark's names and their aliases;
:func:`from_json` reads a ``DataType.jsonValue()`` (pyspark is never imported here);
:func:`check_arrow` makes every field nullable and refuses what typed state cannot
hold; :func:`ddl_of` is the canonical DDL (``simpleString``) of an Arrow type.
ConfigurationError names the text and what is wrong. What the types hold and how they
evolve is ``_types``.
"""

from __future__ import annotations

import re
from typing import Any, Final

import pyarrow as pa

from .._exceptions import ConfigurationError

__all__ = ["INT_BITS", "DdlParser", "check_arrow", "ddl_of", "from_json"]

_PRIMITIVES: Final[dict[str, pa.DataType]] = {
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "tinyint": pa.int8(), "byte": pa.int8(),
    "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(),
    "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "real": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(), "varchar": pa.string(), "char": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}  # fmt: skip
INT_BITS: Final = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
_TOKEN: Final = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(\S))")


def ddl_of(t: pa.DataType) -> str:
    """Spark's DDL (``simpleString``) of the Arrow type ``t``."""
    if t in INT_BITS:
        return {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}[INT_BITS[t]]
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_binary(t):
        return "binary"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_map(t):
        return f"map<{ddl_of(t.key_type)},{ddl_of(t.item_type)}>"
    if pa.types.is_list(t):
        return f"array<{ddl_of(t.value_type)}>"
    if pa.types.is_struct(t):
        fields = ",".join(f"{_name(t.field(i).name)}:{ddl_of(t.field(i).type)}"
                          for i in range(t.num_fields))  # fmt: skip
        return f"struct<{fields}>"
    raise ConfigurationError(f"Arrow type {t} is not a type of typed state")


def _name(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "`" + name.replace("`", "``") + "`"


class DdlParser:
    """Spark DDL: a type, or a list of fields (``"a long, b string"``, a struct)."""

    def __init__(self, text: str, what: str = "state type") -> None:
        self.text = text
        self.what = what
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                break
            pos = m.end()
            quoted, word, number, other = m.groups()
            if quoted is not None:
                self.tokens.append(("name", quoted[1:-1].replace("``", "`")))
            elif word is not None:
                self.tokens.append(("word", word))
            elif number is not None:
                self.tokens.append(("number", number))
            elif other is not None:
                self.tokens.append(("punct", other))
        self.i = 0

    def fail(self, why: str) -> ConfigurationError:
        return ConfigurationError(f"{self.what} {self.text!r}: {why}")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, punct: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise self.fail("ends too early")
        if punct is not None and tok != ("punct", punct):
            raise self.fail(f"expected {punct!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> pa.DataType:
        first: ConfigurationError | None = None
        try:
            t = self.type_()
            if self.peek() is None:
                return t
            first = self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        except ConfigurationError as exc:
            first = exc
        self.i = 0  # not one type: a list of fields ("a long, b string")?
        try:
            fields = self.fields(end=None)
        except ConfigurationError:
            raise first from None
        if self.peek() is not None:
            raise first
        return pa.struct(fields)

    def fields(self, end: str | None) -> list[pa.Field]:
        out: list[pa.Field] = []
        seen: set[str] = set()
        while True:
            kind, name = self.take()
            if kind not in ("word", "name"):
                raise self.fail(f"expected a field name, found {name!r}")
            if self.peek() == ("punct", ":"):
                self.take(":")
            if name in seen:
                raise self.fail(f"field {name!r} appears twice")
            seen.add(name)
            out.append(pa.field(name, self.type_()))
            tok = self.peek()
            if tok == ("punct", ","):
                self.take(",")
                continue
            if end is None or tok == ("punct", end):
                return out
            raise self.fail(f"expected ',' or {end!r}, found {tok[1] if tok else 'the end'!r}")

    def type_(self) -> pa.DataType:
        kind, word = self.take()
        if kind != "word":
            raise self.fail(f"expected a type, found {word!r}")
        w = word.lower()
        if w in ("varchar", "char") and self.peek() == ("punct", "("):
            self.take("(")
            self.take()
            self.take(")")
        if w in _PRIMITIVES:
            return _PRIMITIVES[w]
        if w in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek() == ("punct", "("):
                self.take("(")
                precision = self.number()
                if self.peek() == ("punct", ","):
                    self.take(",")
                    scale = self.number()
                self.take(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise self.fail(f"decimal({precision},{scale}) is not a Spark decimal")
            return pa.decimal128(precision, scale)
        if w == "array":
            self.take("<")
            inner = self.type_()
            self.take(">")
            return pa.list_(inner)
        if w == "map":
            self.take("<")
            key = self.type_()
            self.take(",")
            value = self.type_()
            self.take(">")
            return pa.map_(key, value)
        if w == "struct":
            self.take("<")
            if self.peek() == ("punct", ">"):
                self.take(">")
                return pa.struct([])
            fields = self.fields(end=">")
            self.take(">")
            return pa.struct(fields)
        raise self.fail(f"unknown type {word!r}")

    def number(self) -> int:
        kind, text = self.take()
        if kind != "number":
            raise self.fail(f"expected a number, found {text!r}")
        return int(text)


def from_json(value: Any, text: str) -> pa.DataType:
    """The Arrow type of a pyspark DataType's ``jsonValue()``."""
    if isinstance(value, str):
        return DdlParser(value).parse()
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "array":
            return pa.list_(from_json(value["elementType"], text))
        if kind == "map":
            return pa.map_(from_json(value["keyType"], text), from_json(value["valueType"], text))
        if kind == "struct":
            return pa.struct(
                [pa.field(f["name"], from_json(f["type"], text)) for f in value["fields"]]
            )
    raise ConfigurationError(f"state type {text}: {value!r} is not a type of typed state")


def check_arrow(t: pa.DataType, text: str) -> pa.DataType:
    """``t`` with every field nullable, if each part is a type of typed state."""
    if pa.types.is_list(t):
        return pa.list_(check_arrow(t.value_type, text))
    if pa.types.is_map(t):
        return pa.map_(check_arrow(t.key_type, text), check_arrow(t.item_type, text))
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"state type {text}: a struct repeats a field name")
        return pa.struct([pa.field(t.field(i).name, check_arrow(t.field(i).type, text))
                          for i in range(t.num_fields)])  # fmt: skip
    if pa.types.is_timestamp(t):
        if t.unit != "us" or t.tz not in (None, "UTC"):
            raise ConfigurationError(
                f"state type {text}: Arrow {t} is not a Spark timestamp (timestamp[us, tz=UTC] "
                "or timestamp[us])"
            )
        return t
    ddl_of(t)  # raises for a type Spark has not
    return t
