"""Signing what asyncio_ops writes: one key from the environment, HMAC-SHA256.

With a key in :data:`SIGNING_KEY_ENV`, every checkpoint file
(``asyncio_ops._storage._checkpoint_storage``) and every state blob (``asyncio_ops.state._blob``)
is signed when written, and only what verifies is read at all: an unsigned file,
one signed with another key, an altered one, or (for checkpoint files) one that
was written for another operator, version, partition, key group or file kind is
refused before its payload is parsed, naming it. Without a key nothing is signed
and a signed file is refused with a message saying which variable to set.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

__all__ = ["MAC_SIZE", "SIGNING_KEY_ENV", "mac", "signing_key", "verifies"]

SIGNING_KEY_ENV: Final = "ASYNCIO_OPS_STATE_SIGNING_KEY"
"""The environment variable holding the key that signs and verifies what is written."""
MAC_SIZE: Final = hashlib.sha256().digest_size


def signing_key() -> bytes | None:
    """The key of :data:`SIGNING_KEY_ENV`, or None when it is unset or empty.

    Example:

    >>> import os
    >>> from asyncio_ops import SIGNING_KEY_ENV, signing_key
    >>> os.environ[SIGNING_KEY_ENV] = "a secret of the deployment"
    >>> signing_key() is not None
    True
    >>> del os.environ[SIGNING_KEY_ENV]
    >>> signing_key() is None  # nothing signed, nothing verified
    True
    """
    key = os.environ.get(SIGNING_KEY_ENV)
    return key.encode("utf-8") if key else None


def mac(key: bytes, *parts: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of ``parts``, each preceded by its length (so that no two different
    sequences of parts sign alike).

    Example:

    >>> from asyncio_ops import mac
    >>> len(mac(b"key", b"the file's identity", b"its bytes"))  # HMAC-SHA256
    32
    """
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.digest()


def verifies(key: bytes, signature: bytes | memoryview, *parts: bytes | memoryview) -> bool:
    """Whether ``signature`` is :func:`mac` of ``parts`` (compared in constant time).

    Example:

    >>> from asyncio_ops import mac, verifies
    >>> signature = mac(b"key", b"uid/v3/kg-p0", b"section bytes")
    >>> verifies(b"key", signature, b"uid/v3/kg-p0", b"section bytes")
    True
    >>> verifies(b"key", signature, b"uid/v4/kg-p0", b"section bytes")  # another file's
    False
    """
    return hmac.compare_digest(bytes(signature), mac(key, *parts))
