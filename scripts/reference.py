"""docs/reference.md, generated from the docstrings of the public names.

    python -m scripts.reference          # rewrite docs/reference.md
    python -m scripts.reference --check  # exit 1 (saying so) when the page is out of date

Every name in the ``__all__`` of :data:`MODULES`, in that order: a class or a function
with its signature (without annotations) and the first paragraph of its own docstring, an
enum with its members, any other value with its ``repr``. reST markup is made Markdown
(````x```` and ``:class:`x``` become ```x```). The page is a function of the code alone
(no addresses, no timestamps), so tests/test_docs.py can compare it with a fresh one.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference.md"

MODULES = (
    "asyncio_ops",
    "asyncio_ops.spark",
    "asyncio_ops.state",
    "asyncio_ops.connectors",
    "asyncio_ops.connectors.postgres",
    "asyncio_ops.connectors.http",
    "asyncio_ops.connectors.redis",
    "asyncio_ops.connectors.openai",
)

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


@dataclass(frozen=True)
class Entry:
    """One public name of one module, as the page shows it."""

    module: str
    name: str
    obj: Any

    @property
    def kind(self) -> str:
        if isinstance(self.obj, type):
            if issubclass(self.obj, BaseException):
                return "exception"
            if issubclass(self.obj, enum.Enum):
                return "enum"
            return "protocol" if getattr(self.obj, "_is_protocol", False) else "class"
        return "function" if is_function(self.obj) else "value"

    @property
    def documented(self) -> bool:
        """A class or a function: the kinds that carry a docstring of their own."""
        return self.kind not in ("value",)


def is_function(obj: object) -> bool:
    """A function of the project (plain, or wrapped by a decorator that keeps its name)."""
    if not callable(obj) or isinstance(obj, type) or not hasattr(obj, "__qualname__"):
        return False
    return inspect.isfunction(inspect.unwrap(obj))


def entries() -> Iterator[Entry]:
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield Entry(module_name, name, getattr(module, name))


def own_doc(obj: object) -> str:
    """The object's own docstring, dedented ("" when it has none: never a base class's)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def first_paragraph(doc: str) -> str:
    paragraph = doc.split("\n\n", 1)[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def _default(value: object) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, type):
        return value.__qualname__
    text = repr(value)
    if " at 0x" in text:  # a sentinel or a function: its name, never its address
        return getattr(value, "__qualname__", type(value).__qualname__)
    return text


def signature(obj: Any) -> str | None:
    """``(a, b, *, c=1)``: the parameters without annotations; None when it says nothing."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    parts: list[str] = []
    previous = None
    for p in sig.parameters.values():
        if previous is p.POSITIONAL_ONLY and p.kind is not p.POSITIONAL_ONLY:
            parts.append("/")
        if p.kind is p.KEYWORD_ONLY and previous not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            parts.append("*")
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            default = "" if p.default is p.empty else f"={_default(p.default)}"
            parts.append(f"{p.name}{default}")
        previous = p.kind
    if previous is inspect.Parameter.POSITIONAL_ONLY:
        parts.append("/")
    text = f"({', '.join(parts)})"
    return None if text in ("(*args, **kwargs)", "()") and isinstance(obj, type) else text


def render_entry(entry: Entry) -> str:
    obj, kind = entry.obj, entry.kind
    if kind == "value":
        return f"### `{entry.name}`\n\n`{entry.name} = {_default(obj)}`\n"
    if kind == "enum":
        members = ", ".join(f"`{m.name}`" for m in obj)
        head = f"### `{entry.name}` (enum)\n\nMembers: {members}.\n"
    else:
        sig = signature(obj)
        label = "" if kind == "function" else f" ({kind})"
        head = f"### `{entry.name}`{label}\n\n"
        if sig is not None:
            head += f"`{entry.name}{sig}`\n"
    doc = own_doc(obj)
    body = first_paragraph(doc) if doc else "(no docstring)"
    return f"{head.rstrip()}\n\n{body}\n"


def render() -> str:
    out = [
        "# Reference: every public name\n",
        "Generated from the code by `python -m scripts.reference` (tests/test_docs.py fails "
        "when this page is out of date): every name of the modules' `__all__`, its "
        "signature and the first paragraph of its docstring, whose full text (with an "
        "example) is `help(name)`. The guides are listed in the "
        "[README](../README.md#documentation).\n",
    ]
    by_module: dict[str, list[Entry]] = {}
    for entry in entries():
        by_module.setdefault(entry.module, []).append(entry)
    out.append("\n".join(f"- [`{m}`](#{m.replace('.', '')})" for m in by_module) + "\n")
    for module, items in by_module.items():
        out.append(f"## `{module}`\n")
        out.extend(render_entry(e) for e in items)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--check"]:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python -m scripts.reference")
            return 1
        return 0
    if args:
        print(__doc__)
        return 2
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
