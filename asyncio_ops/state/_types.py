"""Types of typed state: a Spark type, its Arrow column type, and the Python values of both.

Contract:

- :meth:`StateType.of` takes a Spark DDL string (``"long"``, ``"array<string>"``,
  ``"struct<n long, last timestamp>"``, ``"n long, last timestamp"``) or a
  pyspark ``DataType`` (read through its JSON form; pyspark is never
  imported here; the parsing and the DDL rendering are ``_ddl``) and gives
  the one :class:`StateType` of it: its Arrow type (what a checkpoint's
  column holds) and its canonical DDL (what messages,
  manifests and ``read_state`` show). Spark ↔ Arrow as pyspark maps them:
  ``tinyint`` int8, ``smallint`` int16, ``int`` int32, ``bigint`` int64,
  ``float`` float32, ``double`` float64, ``string``, ``binary``,
  ``boolean``, ``date`` date32, ``timestamp`` timestamp[us, UTC],
  ``timestamp_ntz`` timestamp[us], ``decimal(p,s)`` decimal128,
  ``array``, ``map``, ``struct``. Every value, element and field is nullable.
- :meth:`StateType.fit` checks and normalises a Python value on write (the
  value a read gives back, on the heap as after a restore): ints for the
  integer types (range-checked; bool refused), floats for ``float`` /
  ``double`` (ints accepted), ``str``, ``bytes`` (bytearray and memoryview
  accepted), ``bool``, ``date``, ``datetime`` (``timestamp``: aware, in UTC;
  a naive one is taken as UTC, Arrow's rule; ``timestamp_ntz``: naive only),
  ``Decimal`` at the declared scale (ints accepted; rounding refused), lists
  (tuples accepted), dicts for maps, and dicts for structs (a pyspark
  ``Row``, a named tuple or a tuple of the fields in order accepted; a
  missing field is None, an unknown one refused). A misfit raises
  :class:`_Misfit` saying where inside the value and why; the state names
  itself, the key and the value around it.
- :meth:`StateType.column` / :meth:`StateType.values` are the Arrow column of
  normalised values and back; :meth:`StateType.encode` / :meth:`StateType.decode`
  are the bytes of one value in a RocksDB working copy (the canonical key
  encoding of the value's fields, ``_keygroups``: no pickle anywhere).
- :func:`evolution` is the one place of the evolution rules: the converter
  of values of an old type into a new one, or :class:`IncompatibleStateError`
  (naming the state, both types, why, and what to do). Compatible: the same
  type; an integer type widened (``tinyint`` → ``smallint`` → ``int`` →
  ``bigint``); ``float`` → ``double``; ``tinyint``/``smallint``/``int`` →
  ``double``; an integer type → a ``decimal`` with room for every value; a
  ``decimal`` with more integer digits and at least the scale; struct fields
  added (null in old values), dropped or reordered, each kept field
  compatible; array elements and map values compatible. Anything else
  (``bigint`` → ``double``, narrowing, another kind of type, a map key
  changed) is incompatible.
"""

from __future__ import annotations

import datetime as _dt
import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, Inexact, localcontext
from typing import Any, Final

import pyarrow as pa

from .._exceptions import ConfigurationError, IncompatibleStateError
from .._keygroups import canonical_bytes
from ._ddl import INT_BITS as _INT_BITS
from ._ddl import DdlParser, check_arrow, ddl_of, from_json
from ._keycodec import decode_canonical

__all__ = ["StateType", "evolution"]

_UTC: Final = _dt.UTC
_INT_DIGITS: Final = {8: 3, 16: 5, 32: 10, 64: 19}


class _Misfit(Exception):
    """A value does not fit a type; the message says where and why."""


@dataclass(frozen=True)
class StateType:
    """The declared type of a typed state's values (or of a map state's keys)."""

    arrow: pa.DataType
    ddl: str

    @classmethod
    def of(cls, spec: object, what: str = "state type") -> StateType:
        """From a Spark DDL string, a pyspark DataType or a StateType (ConfigurationError)."""
        if isinstance(spec, StateType):
            return spec
        if isinstance(spec, str):
            if not spec.strip():
                raise ConfigurationError(f"{what} must be a Spark type, got an empty string")
            arrow = DdlParser(spec, what).parse()
        elif callable(getattr(spec, "jsonValue", None)):  # a pyspark DataType
            arrow = from_json(spec.jsonValue(), repr(spec))  # type: ignore[attr-defined]
        elif isinstance(spec, pa.DataType):
            arrow = spec
        else:
            raise ConfigurationError(
                f'{what} must be a Spark DDL string ("long", "struct<n long, t timestamp>") '
                f"or a pyspark DataType, got {spec!r}"
            )
        return cls.from_arrow(arrow, repr(spec))

    @classmethod
    def from_arrow(cls, arrow: pa.DataType, text: str | None = None) -> StateType:
        """The StateType of an Arrow column type (ConfigurationError if Spark has none)."""
        checked = check_arrow(arrow, text or str(arrow))
        return cls(checked, ddl_of(checked))

    def __str__(self) -> str:
        return self.ddl

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (StateType.of, (self.ddl,))

    # -- values ----------------------------------------------------------------------
    @property
    def fit(self) -> Callable[[Any], Any]:
        """The normaliser of values on write (raises _Misfit)."""
        return _fitter(self.arrow)

    def column(self, values: list[Any]) -> pa.Array:
        """The Arrow column of normalised values."""
        return pa.array(values, type=self.arrow)

    def values(self, column: pa.Array | pa.ChunkedArray) -> list[Any]:
        """Python values of an Arrow column of this type (maps as dicts)."""
        out = column.to_pylist()
        fix = _reader(self.arrow)
        return out if fix is None else [None if v is None else fix(v) for v in out]

    def encode(self, value: Any) -> bytes:
        """The bytes of a normalised value in a RocksDB working copy."""
        return canonical_bytes(_physical(self.arrow)(value))

    def decode(self, data: bytes | memoryview) -> Any:
        """The value of :meth:`encode`'s bytes."""
        return _logical(self.arrow)(decode_canonical(bytes(data)))


# -- writing: check and normalise ---------------------------------------------------------
_FITTERS: dict[pa.DataType, Callable[[Any], Any]] = {}


def _fitter(t: pa.DataType) -> Callable[[Any], Any]:
    f = _FITTERS.get(t)
    if f is None:
        f = _FITTERS[t] = _make_fitter(t)
    return f


def _type_name(v: Any) -> str:
    return type(v).__name__


def _make_fitter(t: pa.DataType) -> Callable[[Any], Any]:
    ddl = ddl_of(t)
    if t in _INT_BITS:
        bits = _INT_BITS[t]
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

        def fit_int(v: Any) -> Any:
            if type(v) is not int:
                if isinstance(v, bool | float | Decimal | str):
                    raise _Misfit(f"{_type_name(v)} is not a {ddl}")
                try:
                    v = operator.index(v)
                except TypeError:
                    raise _Misfit(f"{_type_name(v)} is not a {ddl}") from None
            if not lo <= v <= hi:
                raise _Misfit(f"{v} is out of the range of {ddl} ({lo}..{hi})")
            return v

        return fit_int
    if pa.types.is_floating(t):
        limit = 3.4028234663852886e38 if pa.types.is_float32(t) else None

        def fit_float(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise _Misfit(f"{_type_name(v)} is not a {ddl}")
            f = float(v)
            if limit is not None and abs(f) > limit and abs(f) != float("inf"):
                raise _Misfit(f"{v} is out of the range of {ddl}")
            return f

        return fit_float
    if pa.types.is_string(t):

        def fit_str(v: Any) -> Any:
            if not isinstance(v, str):
                raise _Misfit(f"{_type_name(v)} is not a string")
            return str(v)

        return fit_str
    if pa.types.is_binary(t):

        def fit_bytes(v: Any) -> Any:
            if not isinstance(v, bytes | bytearray | memoryview):
                raise _Misfit(f"{_type_name(v)} is not binary (bytes)")
            return bytes(v)

        return fit_bytes
    if pa.types.is_boolean(t):

        def fit_bool(v: Any) -> Any:
            if not isinstance(v, bool):
                raise _Misfit(f"{_type_name(v)} is not a boolean")
            return v

        return fit_bool
    if pa.types.is_date32(t):

        def fit_date(v: Any) -> Any:
            if not isinstance(v, _dt.date) or isinstance(v, _dt.datetime):
                raise _Misfit(f"{_type_name(v)} is not a date")
            return v

        return fit_date
    if pa.types.is_timestamp(t):
        aware = t.tz is not None

        def fit_timestamp(v: Any) -> Any:
            if not isinstance(v, _dt.datetime):
                raise _Misfit(f"{_type_name(v)} is not a datetime")
            if aware:
                return v.replace(tzinfo=_UTC) if v.tzinfo is None else v.astimezone(_UTC)
            if v.utcoffset() is not None:
                raise _Misfit("an aware datetime is not a timestamp_ntz (give a naive one)")
            return v

        return fit_timestamp
    if pa.types.is_decimal(t):
        quantum = Decimal(1).scaleb(-t.scale)
        digits = t.precision

        def fit_decimal(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int | Decimal):
                raise _Misfit(f"{_type_name(v)} is not a {ddl} (give a Decimal or an int)")
            d = Decimal(v)
            if not d.is_finite():
                raise _Misfit(f"{v} is not a finite decimal")
            with localcontext() as ctx:
                ctx.prec = 100
                ctx.traps[Inexact] = True
                try:
                    q = d.quantize(quantum)
                except Inexact:
                    raise _Misfit(f"{v} has more than {t.scale} decimal places") from None
            if len(q.as_tuple().digits) > digits and q != 0:
                raise _Misfit(f"{v} has more than {digits} digits")
            return q

        return fit_decimal
    if pa.types.is_list(t):
        inner = _fitter(t.value_type)

        def fit_list(v: Any) -> Any:
            if not isinstance(v, list | tuple):
                raise _Misfit(f"{_type_name(v)} is not an array (give a list)")
            out: list[Any] = []
            for i, x in enumerate(v):
                if x is None:
                    out.append(None)
                    continue
                try:
                    out.append(inner(x))
                except _Misfit as exc:
                    raise _Misfit(f"element {i}: {exc}") from None
            return out

        return fit_list
    if pa.types.is_map(t):
        fit_k, fit_v = _fitter(t.key_type), _fitter(t.item_type)

        def fit_map(v: Any) -> Any:
            if not isinstance(v, Mapping):
                raise _Misfit(f"{_type_name(v)} is not a map (give a dict)")
            out = {}
            for k, x in v.items():
                if k is None:
                    raise _Misfit("a map key is None")
                try:
                    key = fit_k(k)
                except _Misfit as exc:
                    raise _Misfit(f"map key {k!r:.60}: {exc}") from None
                try:
                    out[key] = None if x is None else fit_v(x)
                except _Misfit as exc:
                    raise _Misfit(f"map value of {k!r:.60}: {exc}") from None
            return out

        return fit_map
    if pa.types.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        fits = [_fitter(t.field(i).type) for i in range(t.num_fields)]
        known = set(names)

        def fit_struct(v: Any) -> Any:
            if not isinstance(v, Mapping):
                as_dict = getattr(v, "asDict", None) or getattr(v, "_asdict", None)
                if callable(as_dict):
                    v = as_dict()
                elif isinstance(v, tuple | list) and len(v) == len(names):
                    v = dict(zip(names, v, strict=True))
                else:
                    raise _Misfit(f"{_type_name(v)} is not a {ddl} (give a dict)")
            unknown = [k for k in v if k not in known]
            if unknown:
                raise _Misfit(f"field(s) {unknown} are not in {ddl}")
            out = {}
            for name, fit in zip(names, fits, strict=True):
                x = v.get(name)
                try:
                    out[name] = None if x is None else fit(x)
                except _Misfit as exc:
                    raise _Misfit(f"field {name!r}: {exc}") from None
            return out

        return fit_struct
    raise AssertionError(t)  # pragma: no cover - StateType admits only the types above


# -- reading an Arrow column back ----------------------------------------------------------
def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t):
        return _has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    return False


def _reader(t: pa.DataType) -> Callable[[Any], Any] | None:
    """What turns ``to_pylist``'s value into the normalised one (None: nothing to do)."""
    if not _has_map(t):
        return None
    if pa.types.is_map(t):
        fk, fv = _reader(t.key_type), _reader(t.item_type)
        return lambda v: {
            (k if fk is None else fk(k)): (x if fv is None or x is None else fv(x)) for k, x in v
        }
    if pa.types.is_list(t):
        fe = _reader(t.value_type)
        assert fe is not None
        return lambda v: [None if x is None else fe(x) for x in v]
    fields = [(t.field(i).name, _reader(t.field(i).type)) for i in range(t.num_fields)]
    return lambda v: {n: (v[n] if f is None or v[n] is None else f(v[n])) for n, f in fields}


# -- the RocksDB working copy's bytes: canonical encoding of the fields ------------------
def _physical(t: pa.DataType) -> Callable[[Any], Any]:
    if pa.types.is_list(t):
        fe = _physical(t.value_type)
        return lambda v: tuple(None if x is None else fe(x) for x in v)
    if pa.types.is_map(t):
        fk, fv = _physical(t.key_type), _physical(t.item_type)
        return lambda v: tuple((fk(k), None if x is None else fv(x)) for k, x in v.items())
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _physical(t.field(i).type)) for i in range(t.num_fields)]
        return lambda v: tuple(None if v[n] is None else f(v[n]) for n, f in fields)
    return _same


def _same(v: Any) -> Any:
    return v


def _logical(t: pa.DataType) -> Callable[[Any], Any]:
    if pa.types.is_list(t):
        fe = _logical(t.value_type)
        return lambda v: [None if x is None else fe(x) for x in v]
    if pa.types.is_map(t):
        fk, fv = _logical(t.key_type), _logical(t.item_type)
        return lambda v: {fk(k): (None if x is None else fv(x)) for k, x in v}
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _logical(t.field(i).type)) for i in range(t.num_fields)]
        return lambda v: {
            n: (None if x is None else f(x)) for (n, f), x in zip(fields, v, strict=True)
        }
    if pa.types.is_floating(t):
        return float
    if pa.types.is_boolean(t):
        return bool
    if pa.types.is_decimal(t):
        quantum = Decimal(1).scaleb(-t.scale)
        return lambda v: Decimal(v).quantize(quantum)
    return _same


# -- evolution ------------------------------------------------------------------------------
def _convert(old: pa.DataType, new: pa.DataType, path: str) -> Callable[[Any], Any] | None:
    """The converter of normalised values of ``old`` into ``new`` (None: as they are);
    raises ValueError saying why not."""
    if old == new:
        return None
    where = f" (at {path})" if path else ""
    why = f"{ddl_of(old)} -> {ddl_of(new)}{where}"
    if old in _INT_BITS and new in _INT_BITS:
        if _INT_BITS[new] >= _INT_BITS[old]:
            return None
        raise ValueError(f"{why} narrows an integer type")
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return None
    if old in _INT_BITS and pa.types.is_float64(new):
        if _INT_BITS[old] <= 32:
            return float
        raise ValueError(f"{why} loses precision above 2**53 (widen to a decimal(20,0))")
    if old in _INT_BITS and pa.types.is_decimal(new):
        if new.precision - new.scale >= _INT_DIGITS[_INT_BITS[old]]:
            quantum = Decimal(1).scaleb(-new.scale)
            return lambda v: Decimal(v).quantize(quantum)
        raise ValueError(f"{why} has too few integer digits")
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        if new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale:
            quantum = Decimal(1).scaleb(-new.scale)
            return lambda v: v.quantize(quantum)
        raise ValueError(f"{why} narrows the decimal")
    if pa.types.is_list(old) and pa.types.is_list(new):
        fe = _convert(old.value_type, new.value_type, f"{path}[]")
        if fe is None:
            return None
        return lambda v: [None if x is None else fe(x) for x in v]
    if pa.types.is_map(old) and pa.types.is_map(new):
        if old.key_type != new.key_type:
            raise ValueError(f"{why} changes the map's key type")
        fv = _convert(old.item_type, new.item_type, f"{path}{{}}")
        if fv is None:
            return None
        return lambda v: {k: (None if x is None else fv(x)) for k, x in v.items()}
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        before = {old.field(i).name: old.field(i).type for i in range(old.num_fields)}
        fields: list[tuple[str, bool, Callable[[Any], Any] | None]] = []
        for i in range(new.num_fields):
            f = new.field(i)
            if f.name in before:
                sub = f"{path}.{f.name}" if path else f.name
                fields.append((f.name, True, _convert(before[f.name], f.type, sub)))
            else:
                fields.append((f.name, False, None))
        return lambda v: {
            n: (None if not kept or v.get(n) is None else (v[n] if c is None else c(v[n])))
            for n, kept, c in fields
        }
    raise ValueError(f"{why} is not a widening")


def evolution(
    state: str,
    old: StateType | None,
    new: StateType | None,
    *,
    old_kind: str,
    new_kind: str,
    old_key: StateType | None = None,
    new_key: StateType | None = None,
) -> Callable[[Any], Any] | None:
    """The converter of ``state``'s restored values (of ``old``) into ``new`` (None: as
    they are), or IncompatibleStateError naming the state, both types, why and what to
    do. ``None`` types are untyped (pickled) state; ``*_key`` a map state's key types."""

    def refuse(why: str) -> IncompatibleStateError:
        return IncompatibleStateError(
            f"state {state!r}: the checkpoint holds it as {_describe(old_kind, old, old_key)}, "
            f"the function now declares {_describe(new_kind, new, new_key)}: {why}. Declare "
            "the old type (or a compatible one: a struct field added or dropped, a numeric "
            "type widened), give the new shape a new state name (the old one's data is kept "
            "unclaimed), or start from a new uid or checkpoint_location"
        )

    if old_kind != new_kind:
        raise refuse("the kind of state changed")
    if (old is None) != (new is None):
        raise refuse(
            "typed and untyped (pickled) state do not convert into each other"
            if old is None
            else "typed state cannot become untyped (pickled) state"
        )
    if old_key != new_key:
        raise refuse("the map key type changed (map keys are the entries' identity)")
    if old is None or new is None:
        return None
    try:
        return _convert(old.arrow, new.arrow, "")
    except ValueError as exc:
        raise refuse(str(exc)) from None


def _describe(kind: str, value: StateType | None, key: StateType | None) -> str:
    if value is None:
        return f"untyped (pickled) {kind} state"
    if key is not None:
        return f"{kind} state of {key.ddl} -> {value.ddl}"
    return f"{kind} state of {value.ddl}"


def types_json(types: Mapping[str, tuple[str, StateType | None, StateType | None]]) -> str:
    """``{state: (kind, value type, map key type)}`` as the JSON a manifest records."""
    return json.dumps(
        {name: {"kind": kind, "type": None if t is None else t.ddl,
                "key_type": None if k is None else k.ddl}
         for name, (kind, t, k) in sorted(types.items())},
        sort_keys=True,
    )  # fmt: skip


def types_of_json(raw: str) -> dict[str, tuple[str, StateType | None, StateType | None]]:
    """:func:`types_json`'s mapping back (ValueError for anything else)."""
    parsed = json.loads(raw)
    if not isinstance(parsed, dict):
        raise ValueError("not a mapping of states")
    out: dict[str, tuple[str, StateType | None, StateType | None]] = {}
    for name, item in parsed.items():
        t, k = item.get("type"), item.get("key_type")
        out[name] = (
            str(item["kind"]),
            None if t is None else StateType.of(t),
            None if k is None else StateType.of(k),
        )
    return out
