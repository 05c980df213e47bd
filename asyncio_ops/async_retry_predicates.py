"""Ready-made retry predicates (PyFlink's ``async_retry_predicates``).

``empty_result_predicate`` retries a completed attempt whose result is empty;
``has_exception_predicate`` retries any exception;
``exception_type_predicate(T)`` retries exceptions that are instances of ``T``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["empty_result_predicate", "exception_type_predicate", "has_exception_predicate"]


def empty_result_predicate(results: Sequence[Any] | None) -> bool:
    """True when the attempt returned nothing to emit."""
    return results is None or len(results) == 0


def has_exception_predicate(exc: BaseException | None) -> bool:
    """True for any exception."""
    return exc is not None


def exception_type_predicate(
    exception_type: type[BaseException] | tuple[type[BaseException], ...],
) -> Callable[[BaseException | None], bool]:
    """A predicate true for exceptions that are instances of ``exception_type``."""

    def predicate(exc: BaseException | None) -> bool:
        return isinstance(exc, exception_type)

    predicate.__qualname__ = f"exception_type_predicate({exception_type!r})"
    return predicate
