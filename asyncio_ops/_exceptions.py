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
    clipped to :data:`MAX_MESSAGE` characters.

    Example:

    >>> from asyncio_ops import AsyncOpsError, AsyncRetryStrategy
    >>> try:
    ...     AsyncRetryStrategy.fixed_delay(-1, 100)
    ... except AsyncOpsError as exc:  # every exception the library raises on purpose
    ...     print(type(exc).__name__)
    ConfigurationError
    """

    def __init__(self, *args: Any) -> None:
        if args and isinstance(args[0], str):
            args = (clip_message(args[0]), *args[1:])
        super().__init__(*args)


class ConfigurationError(AsyncOpsError, ValueError):
    """An option has a value the operator cannot work with; the message names it.

    Example:

    >>> from asyncio_ops import AsyncRetryStrategy, ConfigurationError
    >>> try:
    ...     AsyncRetryStrategy.fixed_delay(-1, 100)
    ... except ConfigurationError as exc:
    ...     print(exc)
    max_attempts must be an int >= 0, got -1
    """


class WatermarkNotSupportedError(AsyncOpsError, ValueError):
    """A watermark reached a queue or mode that has no notion of event time.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import OutputMode, Record, Watermark, run_async_wait
    >>> async def lookup(value):
    ...     return [value]
    >>> asyncio.run(run_async_wait(lookup, [Record(1, 1.0), Watermark(1.0)], timeout=1.0,
    ...                            mode=OutputMode.UNORDERED))
    Traceback (most recent call last):
    asyncio_ops.WatermarkNotSupportedError: Watermark(timestamp=1.0) given to the ...
    """


class AsyncOperatorError(AsyncOpsError):
    """An element failed, and with it the operator.

    ``element`` is the input record; the exception that failed it is
    ``__cause__``.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncOperatorError, run_async_wait
    >>> async def lookup(value):
    ...     raise ConnectionError("refused")
    >>> try:
    ...     asyncio.run(run_async_wait(lookup, [7], timeout=1.0))
    ... except AsyncOperatorError as exc:
    ...     print(exc.element, repr(exc.__cause__))
    7 ConnectionError('refused')
    """

    def __init__(self, message: str, element: object = None) -> None:
        super().__init__(message)
        self.element = element


class AsyncTimeoutError(AsyncOperatorError, TimeoutError):
    """The timeout budget of an element ran out before it completed.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncTimeoutError, run_async_wait
    >>> async def slow(value):
    ...     await asyncio.sleep(10)
    ...     return [value]
    >>> try:
    ...     asyncio.run(run_async_wait(slow, [7], timeout=0.01))
    ... except AsyncTimeoutError as exc:
    ...     print(exc)
    Async function call has timed out for input: 7
    """


class InvalidResultError(AsyncOpsError, TypeError):
    """An async function returned something that is not a sequence of results.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncOperatorError, InvalidResultError, run_async_wait
    >>> async def lookup(value):
    ...     return None  # a list of results is expected, [] for none
    >>> try:
    ...     asyncio.run(run_async_wait(lookup, [7], timeout=1.0))
    ... except AsyncOperatorError as exc:
    ...     print(isinstance(exc.__cause__, InvalidResultError))
    True
    """


class OutputSchemaError(AsyncOpsError, TypeError):
    """An output row does not fit the declared output schema (names column and row).

    Example::

        from asyncio_ops import OutputSchemaError
        from asyncio_ops.spark import ordered_wait

        async def lookup(row):
            return [{"n": "not a number"}]

        try:
            ordered_wait(spark.range(3), lookup, timeout=1.0, output_schema="n long").collect()
        except OutputSchemaError as exc:  # names the column, the value and the input row
            print(exc)
    """


class CheckpointError(AsyncOpsError):
    """Checkpoint storage cannot be used as asked; the message names the path.

    Example::

        from asyncio_ops import CheckpointError
        from asyncio_ops.spark import read_state

        try:
            read_state(spark, "/tmp/no-checkpoint-here", uid="counts")
        except CheckpointError as exc:  # names the location, the uid and the version
            print(exc)
    """


class CorruptCheckpointError(CheckpointError, ValueError):
    """A checkpoint file failed verification; the message names the file.

    Example::

        from asyncio_ops import CorruptCheckpointError

        try:
            query.awaitTermination()  # a micro-batch restoring an altered file
        except CorruptCheckpointError as exc:
            print(exc)  # names the file
    """


class StateError(AsyncOpsError):
    """Base class of state-layer failures.

    Example:

    >>> from asyncio_ops import StateError
    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 63))
    >>> try:
    ...     backend.set_current_key("a")  # key group 81
    ... except StateError as exc:
    ...     print(type(exc).__name__)
    KeyGroupError
    """


class KeyGroupError(StateError, ValueError):
    """A key group, parallelism or operator index outside its valid range.

    Example:

    >>> from asyncio_ops.state import check_parallelism
    >>> check_parallelism(0)
    Traceback (most recent call last):
    asyncio_ops.KeyGroupError: max_parallelism must be an int in 1..32768, got 0
    """


class UnsupportedKeyError(StateError, TypeError):
    """A key of a type that has no canonical byte encoding.

    Example:

    >>> from asyncio_ops import canonical_bytes
    >>> canonical_bytes(object())
    Traceback (most recent call last):
    asyncio_ops.UnsupportedKeyError: key <object object at ...> has type builtins.object, ...
    """


class StateTypeError(StateError, TypeError):
    """A value does not fit a typed state's declared type (names state, key and value).

    Example:

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> count = backend.get_state(ValueStateDescriptor("n", "long"))
    >>> backend.set_current_key("b")
    >>> count.update("x")
    Traceback (most recent call last):
    asyncio_ops.StateTypeError: state 'n', key 'b': value 'x' does not fit the declared type ...
    """


class IncompatibleStateError(StateError, ValueError):
    """A checkpoint's typed state cannot be restored into the declared state: another
    kind, a narrowed or changed type, typed against untyped (names both and what to do).

    Example::

        from asyncio_ops import IncompatibleStateError

        try:
            keyed_process(stream, fn, key="k", output_schema="k long, n long",
                          checkpoint_location=location)  # "n" was bigint, is now int
        except IncompatibleStateError as exc:  # raised on the driver, before any job
            print(exc)  # names the version, the state, both types and what to do
    """


class CorruptStateError(StateError, ValueError):
    """A snapshot blob or checkpoint file failed verification (names which).

    Example:

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> backend.restore({3: b"junk"})
    Traceback (most recent call last):
    asyncio_ops.CorruptStateError: key group 3: snapshot blob is truncated: ...
    """


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
