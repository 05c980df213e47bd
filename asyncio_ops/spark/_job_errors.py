"""A job that failed in the function, raised on the driver as the library's exception.

When a task fails on an executor, Spark's action (``collect``, ``count``,
``write...``, ``awaitTermination``) raises Spark's own exception
(``pyspark.errors.PythonException``, a ``StreamingQueryException``, or py4j's
``Py4JJavaError`` for RDD actions), whose text holds the worker's Python
traceback and, last in it, the exception that failed the task
(``asyncio_ops.AsyncOperatorError: async lookup failed for input {...}``).
The library raises its own exception in place of that one:

- :func:`install` (called by ``ordered_wait``, ``unordered_wait``,
  ``keyed_process``, ``read_state`` and ``session()`` on the driver) hooks the
  translation into py4j's return-value handler, where PySpark converts the
  JVM's exceptions into its own: wrapping PySpark's converter, never replacing
  it. From then on every action of a classic (py4j) session raises, when the
  task failed with an asyncio_ops exception, that exception: the same class
  under its public name (``asyncio_ops.AsyncOperatorError``,
  ``asyncio_ops.connectors.LookupQueryError``, ...), with the worker's message,
  and Spark's exception, with its trace, as ``__cause__``. Anything else
  (a failure that is not asyncio_ops', a driver-side error) passes unchanged.
  A later ``SparkSession`` re-installs PySpark's converter alone; the next call
  of the library's API installs the translation again.
- :func:`library_errors`, a context manager (and decorator) around actions,
  does the same for what the hook cannot reach: a Spark Connect client (no
  py4j), or an action run before any call of the library's API.
- :func:`library_error` is the translation itself, for an ``except`` clause of
  one's own: the library's exception for Spark's, or None.

The exception is rebuilt on the driver from the text of the trace: its class
(looked up under ``asyncio_ops`` only, and only a subclass of
:class:`~asyncio_ops.AsyncOpsError`) and its message, which names the option,
column, value or row at fault. Attributes of the executor's object
(``AsyncOperatorError.element``, ``LookupResponseError.status``) are not
carried: the message states them. Spark's log lines of the failed task
attempts (``ERROR Executor: Exception in task ...``) are Spark's logging and
are printed as before.
"""

from __future__ import annotations

import functools
import importlib
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from .._exceptions import AsyncOpsError

__all__ = ["install", "library_error", "library_errors"]

_TRACEBACK: Final = "Traceback (most recent call last):"
_FINAL: Final = re.compile(r"^(asyncio_ops(?:\.[A-Za-z_]\w*)*)\.([A-Za-z_]\w*)(?:: (.*))?$")
# where the exception's message ends in the text Spark wraps it in
_END: Final = re.compile(r"^(?:$|\s|JVM stacktrace:|at |Caused by: |Driver stacktrace:)")


def _spark_errors() -> tuple[type[BaseException], ...]:
    from pyspark.errors import PySparkException

    kinds: list[type[BaseException]] = [PySparkException]
    try:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    except ImportError:  # a Spark Connect client without py4j
        pass
    else:
        kinds.append(Py4JJavaError)
    return tuple(kinds)


def library_error(exc: BaseException) -> AsyncOpsError | None:
    """The asyncio_ops exception that failed the Spark task behind ``exc`` (Spark's
    exception of an action), its ``__cause__`` set to ``exc``; None when ``exc`` is
    not Spark's, or the task's last exception is not one of asyncio_ops'.

    Example::

        from pyspark.errors import PySparkException
        from asyncio_ops.spark import library_error

        try:
            enriched.write.parquet("out/")  # a Spark action on a plan of ordered_wait
        except PySparkException as exc:
            error = library_error(exc)  # e.g. the LookupTimeout a task raised
            raise (error or exc) from exc
    """
    if not isinstance(exc, _spark_errors()):
        return None
    try:
        text = str(exc)
    except Exception:  # a py4j error whose JVM is gone cannot render itself
        return None
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    lines = iter(text[at + len(_TRACEBACK) :].splitlines()[1:])
    final = next((line for line in lines if line and not line[0].isspace()), None)
    match = _FINAL.match(final or "")
    if match is None:
        return None
    module, name, first = match.groups()
    try:
        kind = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    if not (isinstance(kind, type) and issubclass(kind, AsyncOpsError)):
        return None
    message = [first or ""]
    for line in lines:
        if _END.match(line):
            break
        message.append(line)
    try:
        error = kind("\n".join(message))
    except Exception:  # a subclass with a constructor of its own
        error = kind.__new__(kind)
        Exception.__init__(error, "\n".join(message))
    error.__cause__ = exc
    error.add_note(
        "raised by a Spark task on an executor; Spark's error, with the worker's "
        "traceback, is this exception's __cause__"
    )
    return error


@contextmanager
def library_errors() -> Iterator[None]:
    """Around Spark actions: a task failed by an asyncio_ops exception raises that
    exception (:func:`library_error`) instead of Spark's, which becomes its cause.
    Also a decorator (``@library_errors()``).

    Example::

        from asyncio_ops import AsyncOpsError
        from asyncio_ops.spark import library_errors

        try:
            with library_errors():
                enriched.write.parquet("out/")  # a Spark action on a plan of ordered_wait
        except AsyncOpsError as error:  # a task's own exception, Spark's as __cause__
            print(type(error).__name__, error)
    """
    try:
        yield
    except Exception as exc:
        error = library_error(exc)
        if error is None:
            raise
        raise error from exc


_HOOKED: Final = "__asyncio_ops_library_errors__"
_translating = threading.local()


def install() -> None:
    """Hook :func:`library_error` into py4j's return-value handler (the one PySpark
    wraps with its own converter), once: idempotent, a no-op without py4j. Runs on
    the driver only; the hook calls the handler it found and translates only what
    that raises."""
    try:
        import py4j.java_gateway as gateway  # type: ignore[import-untyped]
    except ImportError:  # a Spark Connect client without py4j
        return
    handler: Callable[..., Any] = gateway.get_return_value
    if getattr(handler, _HOOKED, False):
        return

    @functools.wraps(handler)
    def get_return_value(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except Exception as exc:
            # rendering a py4j error calls the JVM through this same handler
            if getattr(_translating, "active", False):
                raise
            _translating.active = True
            try:
                error = library_error(exc)
            finally:
                _translating.active = False
            if error is None:
                raise
            raise error from exc

    setattr(get_return_value, _HOOKED, True)
    gateway.get_return_value = get_return_value
