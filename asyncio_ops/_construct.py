"""Building slotted objects without their ``__init__``: the objects built once per element.

Contract: ``constructor(cls, fields)`` returns ``make``, where ``make(*values)`` is a
new instance of ``cls`` whose slots ``fields`` hold ``values``, in order, built
without calling ``cls.__new__`` or ``cls.__init__``. So ``cls`` must be a slotted
class (no ``__dict__``) whose ``__init__`` takes exactly ``fields`` and does nothing
but set those slots from them (no checks, no conversions: the frozen, slotted dataclasses
:class:`~asyncio_ops.SnapshotEntry` and :class:`~asyncio_ops.Record`, and the
runtime's ``RowValue``): then ``make(*values) == cls(*values)``, the same object as
far as any reader can tell (equality, hash, repr, pickling), at a fraction of the
cost. ``make`` takes every field, positionally.

Why: a restore of a carried-over element builds three such objects (its row
value, its record, its queue entry); through their Python ``__init__`` they were
about 2 us of the 2.8 us an element took (``bench.carry_over``). In C
(``_slotsfast.c``, built at install when a compiler is present) a call allocates
the instance and stores its slots (0.07 us against 0.16 to 0.6 us for the three
``__init__``); the fallback is the class itself. ``ASYNCIO_OPS_PURE_PYTHON=1`` forces
the fallback (the test suite runs both; ``asyncio_ops._native``), read when a
constructor is made.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import MemberDescriptorType
from typing import Any, TypeVar

from ._native import in_use

try:
    from ._slotsfast import Constructor as _CConstructor
except ImportError:  # not built (no compiler at install): the Python fallback below
    _CConstructor = None  # type: ignore[assignment,misc]

_T = TypeVar("_T")


def constructor(cls: type[_T], fields: tuple[str, ...]) -> Callable[..., _T]:
    """``make(*values)``: a new ``cls`` with its slots ``fields`` set to ``values``
    (module docstring); TypeError now if ``fields`` are not the parameters of
    ``cls``'s ``__init__``, in order, or not writable slots of ``cls`` itself, or if
    its instances have a ``__dict__``. The fallback is ``cls`` itself. Made once per
    class, fields and path (C or not), then taken from a cache."""
    in_c = in_use(_CConstructor)
    made = _MADE.get((cls, fields, in_c))
    if made is None:
        made = _MADE[cls, fields, in_c] = _constructor(cls, fields, in_c)
    return made


_MADE: dict[tuple[type, tuple[str, ...], bool], Callable[..., Any]] = {}


def _constructor(cls: type[_T], fields: tuple[str, ...], in_c: bool) -> Callable[..., _T]:
    parameters = list(inspect.signature(cls).parameters)
    if parameters != list(fields):
        raise TypeError(
            f"a constructor of {cls.__qualname__} sets {list(fields)}, not the parameters "
            f"of its __init__ {parameters}"
        )
    if in_c:
        return _CConstructor(cls, fields)
    if cls.__dictoffset__:
        raise TypeError(f"{cls.__qualname__} has a __dict__: only slotted classes")
    for name in fields:
        if not isinstance(cls.__dict__.get(name), MemberDescriptorType):
            raise TypeError(f"{cls.__qualname__}.{name} is not a slot of its own")
    return cls
