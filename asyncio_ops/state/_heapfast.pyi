"""Types of the C accelerator of the heap backend (``_heapfast.c``)."""

from collections.abc import Callable
from typing import Any

class KeyContext:
    key: Any
    def __init__(
        self,
        no_key: Any,
        cache: dict[Any, Any],
        on_new_key: Callable[[Any], None],
        no_key_error: Callable[[], BaseException],
    ) -> None: ...
    def set_current_key(self, key: Any, /) -> None: ...

class ValueCell:
    def __init__(self, ctx: KeyContext, d: dict[Any, Any], /) -> None: ...
    def value(self) -> Any: ...
    def update(self, value: Any, /) -> None: ...
    def clear(self) -> None: ...
