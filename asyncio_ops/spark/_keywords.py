"""Unknown keywords of the public Spark functions fail as ConfigurationError, with a hint.

Python's own ``TypeError: got an unexpected keyword argument 'on_emtpy'`` names
neither the option meant nor the ones there are. :func:`known_keywords`, applied
once to each public function (``ordered_wait``, ``unordered_wait``,
``keyed_process``, ``AsyncDataStream``'s methods), checks the keywords of a call
before it runs: a keyword that is not a parameter raises
:class:`~asyncio_ops.ConfigurationError` naming the function, the keyword and its
value, and suggesting the closest parameter names (``difflib``). A function
whose ``**options`` are passed on to another (``AsyncDataStream`` to
``ordered_wait``) accepts that one's keywords too (``forwards_to``). Known
keywords pass untouched: the function's own checks judge their values.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .._exceptions import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])


def keyword_names(fn: Callable[..., Any]) -> frozenset[str]:
    """The parameters of ``fn`` that a caller may give by keyword (its ``**`` excluded)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds)


def known_keywords(*, forwards_to: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Decorate a public function: an unknown keyword raises ConfigurationError with a hint."""

    def decorate(fn: F) -> F:
        names = keyword_names(fn) | (keyword_names(forwards_to) if forwards_to else frozenset())
        name = fn.__qualname__

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for keyword, value in kwargs.items():
                if keyword not in names:
                    raise unknown_keyword(name, keyword, value, names)
            return fn(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def unknown_keyword(
    function: str, keyword: str, value: Any, names: frozenset[str]
) -> ConfigurationError:
    """The error for ``function(keyword=value)`` when ``keyword`` is none of ``names``."""
    close = difflib.get_close_matches(keyword, sorted(names), n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?"
        if close
        else f"its options are {', '.join(sorted(names))}"
    )
    return ConfigurationError(
        f"{function}() has no option {keyword!r} (given {keyword}={value!r:.100}): {hint}"
    )
