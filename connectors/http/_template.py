"""Templates filled from row fields: URL, query parameters, JSON body.

Syntax is ``str.format``'s, restricted to plain field names: ``{customer_id}``,
optionally with a format spec (``{n:05d}``). Attribute and index access
(``{row.__class__}``, ``{a[0]}``), conversions (``{x!r}``) and positional
fields (``{}``) are rejected when the template is built: a template is
configuration, and it must not be able to walk into objects.

Escaping (the value is the row's; the template text is trusted):

- URL: each value is percent-encoded with nothing left safe (``/``, ``?``,
  ``#``, ``&``, ``%`` and spaces all encoded), so a value stays inside the path
  segment or query value it was put in. A value that is exactly ``.`` or ``..``
  is refused (``LookupKeyError`` naming the field): percent-encoding leaves
  dots alone, and a normalising proxy would read it as a dot segment. The
  resulting URL is sent as-is.
- Query parameters and JSON body: values are handed to aiohttp / ``json``,
  which encode them. A string that is exactly one placeholder (``"{id}"``)
  takes the field's value with its type (a JSON number stays a number);
  anything else is formatted into a string.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from asyncio_ops import ConfigurationError

from .._exceptions import LookupKeyError

__all__ = ["JsonTemplate", "ParamsTemplate", "Template", "text_of"]

_FORMATTER: Final = string.Formatter()
# RFC 3986 reserved and unreserved characters, plus "%" for escapes already present.
_URL_SAFE: Final = ":/?#[]@!$&'()*+,;=%~-._"


def _plain(text: str) -> bool:
    """True if ``text`` is ASCII letters and digits only (what quote() leaves as is)."""
    return text.isascii() and text.isalnum()


def _value(row: Mapping[str, Any], name: str) -> Any:
    try:
        return row[name]
    except KeyError:
        raise LookupKeyError(
            f"input row has no field {name!r} used by the request template; "
            f"fields present: {sorted(row)!r}"
        ) from None
    except TypeError:
        raise LookupKeyError(
            f"input must be a mapping of field names to values, got {type(row).__name__}"
        ) from None


def text_of(value: Any, spec: str = "") -> str:
    """How a value is written into a URL, a parameter or a batch key."""
    if value is None:
        return ""
    if isinstance(value, bool):
        # JSON/HTTP spelling rather than Python's True/False.
        return format("true" if value else "false", spec)
    return format(value, spec)


class Template:
    """A string with ``{field}`` placeholders, validated once, rendered per row."""

    __slots__ = ("_parts", "_url_parts", "fields", "single", "text")

    def __init__(self, text: str, *, option: str) -> None:
        if not isinstance(text, str):
            raise ConfigurationError(f"{option} must be a string, got {type(text).__name__}")
        parts: list[tuple[str, str | None, str]] = []
        try:
            parsed = list(_FORMATTER.parse(text))
        except ValueError as exc:
            raise ConfigurationError(
                f"{option} is not a valid template ({exc}): {text!r}"
            ) from None
        for literal, name, spec, conversion in parsed:
            if name is None:
                parts.append((literal, None, ""))
                continue
            if not name or any(c in name for c in ".[]") or name.isdigit():
                raise ConfigurationError(
                    f"{option}: placeholder {{{name}}} must be a plain field name "
                    "(no positional, attribute or index access)"
                )
            if conversion:
                raise ConfigurationError(
                    f"{option}: conversions like !{conversion} are not allowed"
                )
            if spec and "{" in spec:
                raise ConfigurationError(f"{option}: nested placeholders are not allowed")
            parts.append((literal, name, spec or ""))
        self.text = text
        self._parts = tuple(parts)
        # The template's own text is trusted: keep its reserved characters and
        # existing %-escapes, encode only what cannot appear in a URL at all.
        # Done once here, not per row.
        self._url_parts = tuple(
            (quote(literal, safe=_URL_SAFE), name, spec) for literal, name, spec in parts
        )
        self.fields = tuple(name for _, name, _ in parts if name is not None)
        # "{id}" alone: the raw value (with its type) can be used instead of text.
        self.single: str | None = (
            self.fields[0]
            if len(parts) == 1 and parts[0][0] == "" and parts[0][1] is not None and not parts[0][2]
            else None
        )

    def url_prefix(self) -> str:
        """The URL-encoded text before the first placeholder (all of it without one)."""
        out: list[str] = []
        for literal, name, _ in self._url_parts:
            out.append(literal)
            if name is not None:
                break
        return "".join(out)

    def render(self, row: Mapping[str, Any], *, url: bool = False) -> str:
        """The text with each placeholder replaced by the row's value.

        ``url=True`` percent-encodes every value completely (see module docstring).
        ``None`` renders as an empty string.
        """
        out: list[str] = []
        for literal, name, spec in self._url_parts if url else self._parts:
            out.append(literal)
            if name is not None:
                text = text_of(_value(row, name), spec)
                if url and (text == "." or text == ".."):
                    # quote() leaves dots as they are, and a normalising proxy or server
                    # would read the segment as "this" or "up one level" of the path
                    raise LookupKeyError(
                        f"field {name!r} is {text!r}, which cannot be put in a request URL "
                        "(a dot segment would move the path); filter such rows, or pass the "
                        "value as a query parameter"
                    )
                # ASCII letters and digits never need encoding (the common key).
                out.append(quote(text, safe="") if url and not _plain(text) else text)
        return "".join(out)

    def raw(self, row: Mapping[str, Any]) -> Any:
        """The row's value itself for a single-placeholder template, else the rendered text."""
        if self.single is not None:
            return _value(row, self.single)
        return self.render(row)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


class ParamsTemplate:
    """Query parameters: name -> template (or a constant). ``None`` values are left out."""

    __slots__ = ("_items", "fields")

    def __init__(self, params: Mapping[str, Any] | None, *, option: str = "params") -> None:
        items: list[tuple[str, Template | Any]] = []
        for name, value in (params or {}).items():
            if not isinstance(name, str):
                raise ConfigurationError(f"{option}: parameter names must be strings, got {name!r}")
            items.append(
                (
                    name,
                    Template(value, option=f"{option}[{name!r}]")
                    if isinstance(value, str)
                    else value,
                )
            )
        self._items = tuple(items)
        self.fields = tuple(f for _, v in items if isinstance(v, Template) for f in v.fields)

    def render(self, row: Mapping[str, Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name, value in self._items:
            actual = value.raw(row) if isinstance(value, Template) else value
            if actual is None:
                continue
            if isinstance(actual, list | tuple):
                # A list becomes a repeated parameter: ?id=1&id=2
                out.extend((name, text_of(v, "")) for v in actual if v is not None)
            else:
                out.append((name, text_of(actual, "")))
        return out

    def __bool__(self) -> bool:
        return bool(self._items)


class JsonTemplate:
    """A JSON body whose strings may hold placeholders; rendered per row.

    Dict keys are not templated (a schema is configuration, not data).
    """

    __slots__ = ("_body", "fields")

    def __init__(self, body: Any, *, option: str = "json") -> None:
        found: list[str] = []
        self._body = self._compile(body, option, found)
        self.fields = tuple(found)

    @classmethod
    def _compile(cls, node: Any, option: str, found: list[str]) -> Any:
        if isinstance(node, str):
            template = Template(node, option=option)
            found.extend(template.fields)
            return template if template.fields else node
        if isinstance(node, Mapping):
            return {k: cls._compile(v, f"{option}[{k!r}]", found) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [cls._compile(v, f"{option}[{i}]", found) for i, v in enumerate(node)]
        if node is None or isinstance(node, bool | int | float):
            return node
        raise ConfigurationError(f"{option}: {type(node).__name__} is not JSON")

    def render(self, row: Mapping[str, Any]) -> Any:
        return self._fill(self._body, row)

    @classmethod
    def _fill(cls, node: Any, row: Mapping[str, Any]) -> Any:
        if isinstance(node, Template):
            return node.raw(row)
        if isinstance(node, dict):
            return {k: cls._fill(v, row) for k, v in node.items()}
        if isinstance(node, list):
            return [cls._fill(v, row) for v in node]
        return node
