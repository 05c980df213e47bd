"""The sealed blob: how one key group's (or one subtask's) snapshot travels in memory.

A blob is a container (``asyncio_ops._storage._container``) of one section: its kind
(``KEYED_STATE``, ``KEY_GROUPS`` for an operator's state and timers,
``OPERATOR_STATE``), its key group (or subtask index) as the section's tag,
and the kind's typed Arrow table (``_payloads``). :func:`unseal` checks all
of it and raises :class:`CorruptStateError` naming the key group (and what
is wrong) for a blob that is truncated, altered, of another kind or format
version, filed under another key group, or whose table is not its kind's.

Loading a blob runs no code: the payload is parsed as Arrow and validated,
never unpickled. User values inside are the bytes of their state
descriptor's serializer; the default serializer is pickle, so a restored
state's values are loaded by pickle when the state reads them: that is the
trust boundary (docs/state.md). With a signing key in the environment
(:data:`SIGNING_KEY_ENV`), every blob written is signed, and only blobs whose
signature verifies are read at all.

Checkpoint files are containers too, with the same tables as sections (a
key-group file: a section per full key group, one for all the deltas), never a blob
inside a file.
"""

from __future__ import annotations

from typing import Any, Final

from .._exceptions import CorruptStateError
from .._storage._container import FORMAT_VERSION, Kind, Section, decode, encode
from .._storage._signing import SIGNING_KEY_ENV
from . import _payloads

__all__ = [
    "FORMAT_VERSION",
    "KEYED_OPERATOR",
    "KEYED_STATE",
    "OPERATOR_STATE",
    "SIGNING_KEY_ENV",
    "seal",
    "unseal",
]

KEYED_STATE: Final = Kind.KEYED_STATE
KEYED_OPERATOR: Final = Kind.KEY_GROUPS
OPERATOR_STATE: Final = Kind.OPERATOR_STATE


def seal(kind: Kind, key_group: int, payload: Any) -> bytes:
    """``payload`` (typed, see ``_payloads``) as a container of one section (signed if a
    key is set)."""
    data, _ = encode(kind, [Section(key_group, _payloads.table(kind, payload))])
    return data


def unseal(kind: Kind, key_group: int, blob: object, *, what: str = "key group") -> Any:
    """Verify ``blob`` and return its payload; CorruptStateError naming ``key_group``."""
    where = f"{what} {key_group}"
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise CorruptStateError(f"{where}: snapshot blob must be bytes, got {type(blob).__name__}")
    sections = decode(blob, kind, f"{where}: snapshot blob", error=CorruptStateError)
    if len(sections) != 1:
        raise CorruptStateError(f"{where}: snapshot blob holds {len(sections)} sections, not 1")
    (section,) = sections
    if section.tag != key_group:
        raise CorruptStateError(f"{where}: blob was written for {what} {section.tag}")
    return _payloads.read(kind, section.table, where)
