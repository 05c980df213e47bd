"""Secrets stay out of what the connectors print."""

from __future__ import annotations

from asyncio_ops.connectors._redact import (
    Scrubber,
    redact_dsn,
    redact_headers,
    redact_url,
    url_secrets,
)


def test_redact_dsn_forms() -> None:
    assert redact_dsn("postgresql://u:pw123@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"
    assert "pw123" not in redact_dsn("postgresql://u@h/db?password=pw123&sslmode=require")
    assert redact_dsn("host=h user=u password=pw123 dbname=d") == (
        "host=h user=u password=*** dbname=d"
    )
    assert "se cret" not in redact_dsn("host=h password='se cret' dbname=d")


def test_redact_url_keeps_templates_and_masks_credentials() -> None:
    url = "https://u:pw@h/x/{id}?api_key=abc&q={q}"
    assert redact_url(url) == "https://u:***@h/x/{id}?api_key=***&q={q}"
    assert set(url_secrets(url)) == {"pw", "abc"}


def test_headers_and_scrubber() -> None:
    assert redact_headers({"Authorization": "Bearer t", "Accept": "json", "X-Api-Key": "k"}) == {
        "Authorization": "***",
        "Accept": "json",
        "X-Api-Key": "***",
    }
    scrub = Scrubber(["secret-token", None, "ab"])
    assert scrub("failed with secret-token and ab") == "failed with *** and ab"
    assert "secret-token" not in repr(scrub)
