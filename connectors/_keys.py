"""The key of a row or of an Arrow batch: one field or a tuple of fields, read with the
errors naming the field (a missing field, an unhashable value, a nested column).

A key with a NULL component is "null": it never matches (SQL equality); the connector
base (:class:`asyncio_ops.connectors.BaseLookup`) answers such rows without a request.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncio_ops import ConfigurationError

from ._exceptions import LookupKeyError

if TYPE_CHECKING:  # pyarrow is needed only by the columnar path (the spark extra)
    import pyarrow as pa

__all__ = ["KeyFields"]


class KeyFields:
    """One or more field names, and how to read their value out of a row.

    A single name gives scalar keys (``row["id"]``); a tuple gives tuple keys
    (``(row["region"], row["id"])``). A key with a ``None`` component is "null":
    it never matches (SQL equality), so lookups answer it without a request.

    Example:

    >>> from asyncio_ops.connectors import KeyFields
    >>> key = KeyFields(("region", "customer_id"), option="key")
    >>> key.of({"region": "eu", "customer_id": 7}), key.of({"region": None, "customer_id": 7})
    (('eu', 7), None)
    """

    __slots__ = ("composite", "names")

    def __init__(self, names: str | Sequence[str], *, option: str) -> None:
        if isinstance(names, str):
            parsed: tuple[str, ...] = (names,)
            composite = False
        else:
            parsed = tuple(names)
            composite = True
        if not parsed or not all(isinstance(n, str) and n for n in parsed):
            raise ConfigurationError(
                f"{option} must be a field name or a non-empty tuple of names, got {names!r}"
            )
        if len(set(parsed)) != len(parsed):
            raise ConfigurationError(f"{option} names a field twice: {names!r}")
        self.names = parsed
        self.composite = composite

    def __len__(self) -> int:
        return len(self.names)

    def of(self, row: Mapping[str, Any]) -> Hashable | None:
        """The key of ``row``; None when any component is None.

        Raises :class:`LookupKeyError` for a missing field or an unhashable value.
        """
        if not self.composite:
            # The common case, once per input row: no tuple, no generator.
            try:
                key = row[self.names[0]]
            except KeyError:
                raise self._missing_field(row, self.names[0]) from None
            except TypeError:
                raise self._not_a_mapping(row) from None
            if key is None:
                return None
            try:
                hash(key)
            except TypeError:
                raise self._unhashable(key) from None
            return key  # type: ignore[no-any-return]
        try:
            values = tuple([row[name] for name in self.names])
        except KeyError as exc:
            raise self._missing_field(row, exc.args[0]) from None
        except TypeError:
            raise self._not_a_mapping(row) from None
        if any(v is None for v in values):
            return None
        try:
            hash(values)
        except TypeError:
            raise self._unhashable(values) from None
        return values

    def of_batch(self, batch: pa.RecordBatch) -> list[Hashable | None]:
        """The key of every row of an Arrow batch (None where a component is null).

        Raises :class:`LookupKeyError` for a missing or nested (list, struct, map) column.
        """
        columns = [self.column_of(batch, name).to_pylist() for name in self.names]
        if not self.composite:
            return columns[0]  # type: ignore[no-any-return]
        return [None if None in values else values for values in zip(*columns, strict=True)]

    def column_of(self, batch: pa.RecordBatch, name: str) -> pa.Array:
        """The key column ``name`` of an Arrow batch, checked to exist and be atomic."""
        import pyarrow as pa

        index = batch.schema.get_field_index(name)
        if index < 0:
            raise LookupKeyError(
                f"input has no key column {name!r} (key={self.spec()!r}); "
                f"columns present: {sorted(batch.schema.names)!r}"
            )
        column = batch.column(index)
        if pa.types.is_nested(column.type):
            raise LookupKeyError(
                f"key column {name!r} has the nested type {column.type}; keys must be atomic"
            )
        return column

    def _missing_field(self, row: Mapping[str, Any], name: object) -> LookupKeyError:
        return LookupKeyError(
            f"input row has no key field {name!r} (key={self.spec()!r}); "
            f"fields present: {sorted(row)!r}"
        )

    @staticmethod
    def _not_a_mapping(row: object) -> LookupKeyError:
        return LookupKeyError(
            f"input must be a mapping of field names to values, got {type(row).__name__}"
        )

    def _unhashable(self, key: object) -> LookupKeyError:
        return LookupKeyError(
            f"key {self.spec()!r} has an unhashable value of type {type(key).__name__}"
        )

    def spec(self) -> str | tuple[str, ...]:
        return self.names if self.composite else self.names[0]

    def __repr__(self) -> str:
        return repr(self.spec())
