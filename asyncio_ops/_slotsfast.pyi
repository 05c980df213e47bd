"""Types of the C constructors of slotted classes (``_slotsfast.c``)."""

from typing import Any

class Constructor:
    def __init__(self, cls: type, fields: tuple[str, ...]) -> None: ...
    def __call__(self, *values: Any) -> Any: ...
