"""Keeping secrets out of messages, reprs and logs.

Two complementary tools: structural redaction of the things we print on purpose
(a DSN, a URL, a headers mapping) and :class:`Scrubber`, which replaces every
known secret value in free text. The second catches what the first cannot
reach: a library's error message that happens to quote the DSN or a header.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "REDACTED",
    "Scrubber",
    "is_sensitive_name",
    "redact_dsn",
    "redact_headers",
    "redact_url",
    "url_secrets",
]

REDACTED: Final = "***"

# Header and query parameter names whose values are credentials. Matching is by
# substring so that vendor spellings (X-Api-Key, x-auth-token, client_secret)
# are covered without a list of every vendor.
_SENSITIVE_PARTS: Final = (
    "authorization",
    "auth",
    "cookie",
    "token",
    "secret",
    "password",
    "passwd",
    "apikey",
    "api-key",
    "api_key",
    "signature",
    "credential",
)

# libpq key=value DSN: password=secret or password='se cret'
_KV_PASSWORD: Final = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def is_sensitive_name(name: str) -> bool:
    """Is a header or parameter called ``name`` likely to carry a credential?"""
    lowered = name.lower()
    return any(part in lowered for part in _SENSITIVE_PARTS)


def _password_of(dsn: str) -> str | None:
    match = _KV_PASSWORD.search(dsn)
    if match:
        return match.group(2).strip("'")
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return None
    if parts.password:
        return parts.password
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() == "password" and value:
            return value
    return None


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password (URL userinfo, ``?password=`` or ``password=``) masked."""
    text = _KV_PASSWORD.sub(lambda m: m.group(1) + REDACTED, dsn)
    if "://" not in text:
        return text
    return redact_url(text)


def redact_url(url: str) -> str:
    """``url`` with userinfo password and credential-like query values masked.

    Template placeholders (``{field}``) survive untouched, so a templated URL
    can be shown in a repr.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_sensitive_name(name) for name, _ in pairs):
            query = urlencode(
                [(n, REDACTED if is_sensitive_name(n) else v) for n, v in pairs], safe="{}*"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The secret values inside ``url`` (password, sensitive query values), for a Scrubber."""
    found: list[str] = []
    password = _password_of(url)
    if password:
        found.append(password)
    try:
        query = urlsplit(url).query
    except ValueError:
        return found
    found.extend(v for n, v in parse_qsl(query) if is_sensitive_name(n) and v)
    return found


def redact_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``headers`` with credential values replaced by ``***``."""
    return {k: (REDACTED if is_sensitive_name(k) else v) for k, v in (headers or {}).items()}


class Scrubber:
    """Replaces known secret values in text with ``***``.

    Secrets shorter than 3 characters are ignored: masking every ``a`` in a
    message would hide more than it protects (and such a secret protects little).
    """

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first so that a secret containing another is masked whole.
        unique = {s for s in secrets if s and len(s) >= 3}
        self._secrets: tuple[str, ...] = tuple(sorted(unique, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"Scrubber(<{len(self._secrets)} secrets>)"
