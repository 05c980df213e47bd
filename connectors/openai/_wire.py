"""What the model lookups put on and take off the wire: the API's root URL as the OpenAI
SDK takes it, prompt templates over a row's columns, and the usage an answer reports,
trusted only when it is a count of tokens."""

from __future__ import annotations

import os
import string
from collections.abc import Mapping
from typing import Any

from asyncio_ops import ConfigurationError

from .. import LookupDecodeError, LookupKeyError
from .._redact import redact_url

__all__ = ["Template", "api_root", "reported_usage"]


class Template:
    """``str.format`` fields over a row; a missing column named."""

    def __init__(self, text: str, option: str) -> None:
        if not isinstance(text, str) or not text:
            raise ConfigurationError(f"{option} must be a non-empty template, got {text!r}")
        try:
            self.fields = tuple(
                dict.fromkeys(f for _, f, _, _ in string.Formatter().parse(text) if f)
            )
        except ValueError as exc:
            raise ConfigurationError(f"{option} {text!r} is not a valid template: {exc}") from exc
        self.text = text
        self.option = option

    def render(self, row: Mapping[str, Any]) -> str:
        try:
            return self.text.format_map(row)
        except KeyError as exc:
            raise LookupKeyError(
                f"{self.option} uses the column {exc.args[0]!r}, which the row lacks; "
                f"columns present: {sorted(row)!r}"
            ) from None


def reported_usage(usage: Any, url: str, what: str) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of an answer's ``usage``, trusted only when
    each is a whole number >= 0 (``prompt_tokens`` required; ``completion_tokens`` 0 when
    absent, as embeddings report none): anything else is a LookupDecodeError naming the
    endpoint and the rows, never a count that gives tokens back to a budget or a limit."""
    counts = []
    for name, required in (("prompt_tokens", True), ("completion_tokens", False)):
        value = usage.get(name) if isinstance(usage, dict) else None
        if value is None and not required:
            counts.append(0)
            continue
        if type(value) is not int or value < 0:
            raise LookupDecodeError(
                f"POST {redact_url(url)} answered a usage whose {name} is {value!r}, not a "
                f"whole number of tokens >= 0 (usage {usage!r:.200}), for {what}"
            )
        counts.append(value)
    return counts[0], counts[1]


def api_root(base_url: str | None) -> str:
    """The API's root URL, as the OpenAI SDK takes its base URL: given, else the
    environment's ``OPENAI_BASE_URL`` (read on the driver, where the lookup is built),
    else ``https://api.openai.com/v1``; the bare host (``http://host:8000``) means its
    ``/v1``, a URL ending in ``/v1`` is the root itself. Requests go to
    ``<root>/chat/completions`` and ``<root>/embeddings``."""
    given = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
    url = (given or "https://api.openai.com/v1").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"base_url must be an http(s) URL, got {redact_url(url)!r}"
            + (" (from OPENAI_BASE_URL)" if base_url is None else "")
        )
    return url if url.endswith("/v1") else f"{url}/v1"
