"""The exceptions of asyncio_ops, in one place.

::

    AsyncOpsError                         base of everything raised on purpose
    ├── ConfigurationError (ValueError)   a bad option, named (capacity, timeout, ...)
    ├── WatermarkNotSupportedError (ValueError)
    │                                     a watermark given to the processing-time queue
    ├── AsyncOperatorError                an element failed the operator; names the input,
    │   │                                 the original exception is its ``__cause__``
    │   └── AsyncTimeoutError (TimeoutError)
    │                                     the element's timeout budget ran out
    ├── InvalidResultError (TypeError)    ``async_invoke`` returned None or a non-sequence
    ├── OutputSchemaError (TypeError)     an output row does not fit the declared schema;
    │                                     names the column, the value and the input row
    ├── CheckpointError                   checkpoint storage: unwritable location, missing
    │   │                                 version; names the path
    │   └── CorruptCheckpointError (ValueError)
    │                                     torn, truncated, bit-flipped or too-new file;
    │                                     names the file
    └── StateError                        state layer failures
        ├── KeyGroupError (ValueError)    key group / parallelism out of range
        ├── UnsupportedKeyError (TypeError)
        │                                 a key with no canonical byte encoding
        ├── StateTypeError (TypeError)    a value that does not fit a typed state's
        │                                 declared type; names the state, key and value
        ├── IncompatibleStateError (ValueError)
        │                                 a typed state's checkpointed type cannot become
        │                                 its declared one; names both and what to do
        └── CorruptStateError (ValueError)
                                          a snapshot blob or file that does not verify;
                                          names the key group or file

Errors of the libraries underneath (asyncpg, aiohttp, pyarrow) are translated
into these at one boundary per connector, with ``raise ... from``.

A message is at most :data:`MAX_MESSAGE` characters: a longer one (a message
quoting a 50 MB value from a row) keeps its beginning and its end around a note
of how much was cut, so that logs, Spark's task errors and error rows stay
readable whatever the data.
"""

from __future__ import annotations

from typing import Any, Final

MAX_MESSAGE: Final = 4000
"""Characters of an exception message at most (see the module docstring)."""
_TAIL: Final = 1000  # of those, kept from the end (what failed is often said last)


def clip_message(message: str) -> str:
    """``message`` within :data:`MAX_MESSAGE` characters: its beginning and end kept."""
    if len(message) <= MAX_MESSAGE:
        return message
    head = MAX_MESSAGE - _TAIL - 40  # 40: room for the note
    cut = len(message) - head - _TAIL
    return f"{message[:head]} ... [{cut} characters cut] ... {message[-_TAIL:]}"


class AsyncOpsError(Exception):
    """Base class of every exception asyncio_ops raises on purpose; its message is
    clipped to :data:`MAX_MESSAGE` characters."""

    def __init__(self, *args: Any) -> None:
        if args and isinstance(args[0], str):
            args = (clip_message(args[0]), *args[1:])
        super().__init__(*args)


class ConfigurationError(AsyncOpsError, ValueError):
    """An option has a value the operator cannot work with; the message names it."""


class WatermarkNotSupportedError(AsyncOpsError, ValueError):
    """A watermark reached a queue or mode that has no notion of event time."""


class AsyncOperatorError(AsyncOpsError):
    """An element failed, and with it the operator.

    ``element`` is the input record; the exception that failed it is
    ``__cause__``.
    """

    def __init__(self, message: str, element: object = None) -> None:
        super().__init__(message)
        self.element = element


class AsyncTimeoutError(AsyncOperatorError, TimeoutError):
    """The timeout budget of an element ran out before it completed."""


class InvalidResultError(AsyncOpsError, TypeError):
    """An async function returned something that is not a sequence of results."""


class OutputSchemaError(AsyncOpsError, TypeError):
    """An output row does not fit the declared output schema (names column and row)."""


class CheckpointError(AsyncOpsError):
    """Checkpoint storage cannot be used as asked; the message names the path."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """A checkpoint file failed verification; the message names the file."""


class StateError(AsyncOpsError):
    """Base class of state-layer failures."""


class KeyGroupError(StateError, ValueError):
    """A key group, parallelism or operator index outside its valid range."""


class UnsupportedKeyError(StateError, TypeError):
    """A key of a type that has no canonical byte encoding."""


class StateTypeError(StateError, TypeError):
    """A value does not fit a typed state's declared type (names state, key and value)."""


class IncompatibleStateError(StateError, ValueError):
    """A checkpoint's typed state cannot be restored into the declared state: another
    kind, a narrowed or changed type, typed against untyped (names both and what to do)."""


class CorruptStateError(StateError, ValueError):
    """A snapshot blob or checkpoint file failed verification (names which)."""


def _public(module: str, namespace: dict[str, Any]) -> None:
    """Name every exception class of ``namespace`` after ``module``, where users import it
    from: tracebacks, Spark's task errors and pickles then say ``asyncio_ops.X``, never the
    private module that defines it (the class must be importable from ``module``)."""
    for value in list(namespace.values()):
        if (
            isinstance(value, type)
            and issubclass(value, BaseException)
            and value.__module__ == namespace["__name__"]
        ):
            value.__module__ = module


_public("asyncio_ops", globals())
