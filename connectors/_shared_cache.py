"""The shared layer of a LookupCache: the same answers for every worker, through Redis.

Contract. A :class:`~asyncio_ops.connectors.LookupCache` given ``shared=
"redis://host:port/db"`` and a ``name`` keeps its local, bounded layer in
front and, behind it, this one: a lookup's keys the local layer misses are read
from Redis in one ``MGET`` before the connector calls out, and the answers it
fetched are written back in one pipeline, each under
``asyncio_ops:cache:<name>:<scope>:<fingerprint>`` with the cache's ``ttl``.
``scope`` is what the answers answer: the lookup's fingerprint of everything
that decides them besides the key (its query and columns, DSN without
password, URL template, method, body, model, system message, prompt template,
sampling settings: ``BaseLookup.cache_identity``; never a credential), or the
user's ``cache_key`` for sharing on purpose. ``fingerprint`` is the SHA-256 of
the key's canonical bytes (``asyncio_ops.state.canonical_bytes``: the same key
gives the same fingerprint in every process and release). So every worker,
task attempt, speculative copy, second action and rerun of a job that names
the cache and asks the same question reads what any of them already paid for,
and a lookup asking another question never reads it.

Answers are stored typed, never pickled: a connector's rows as one Arrow IPC
stream (an empty answer as one byte); rows Arrow cannot type together (a column
of mixed kinds) and keys that have no canonical bytes stay local, counted as
``skipped``. Redis unreachable, slow (``timeout``) or failing is a miss (and a
write not made), counted as ``errors`` and logged once per process: never a
failure of the lookup.

Signing. Without a key, whatever is stored under a key is served: anyone who
can write to the Redis (or its network) decides the answers every job naming
the cache gets. With a key in ``ASYNCIO_OPS_STATE_SIGNING_KEY`` (read as
checkpoints read it: ``asyncio_ops.signing_key``, at each read and write),
every entry is written signed, an HMAC-SHA256 (``asyncio_ops.mac``) over its
bytes and its Redis key, and read only if it verifies: an entry with no
signature, one signed with another key, an altered one, or a genuine one
copied under another key (another question's answer) is refused before it is
parsed: a miss, so the lookup asks the service and writes its answer back,
signed, over it. Refusals are counted (``refused``; each key read from Redis
is one of ``hits``, ``misses`` or ``refused``) and logged: the first in a
process naming the cache and the entry's key, then at most once a minute (and
when the lookup closes) how many more. A signature proves who wrote an answer
to which question, not when: someone who can write to the Redis can still
delete entries (more calls), or put back an older genuine answer to the same
question. Without a key nothing is verified, signed or not: a signed entry is
read without its signature (a job without the key reads what a signed one
paid for), an unsigned one as always.

Format, by the first byte: ``0x00`` an empty answer, ``0x01`` rows (an Arrow
IPC stream follows), ``0x02`` signed: the signature (32 bytes), then one of
the first two, which the signature covers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import redis.asyncio as aioredis

from asyncio_ops import SIGNING_KEY_ENV, mac, signing_key, verifies

from ._redact import redact_dsn

log = logging.getLogger("asyncio_ops.connectors")

_EMPTY: Final = b"\x00"
_ROWS: Final = b"\x01"
_SIGNED: Final = b"\x02"
# the first part an entry's signature covers: what it signs (no checkpoint frame's
# signature verifies as an entry's: theirs begins with an identity, a NUL and a kind)
_PURPOSE: Final = b"asyncio_ops shared cache entry"
_SIGNATURE_SIZE: Final = len(mac(b"", b""))
# after the first refusal is logged, how often the count of later ones is (seconds)
_REFUSALS_LOGGED_EVERY: Final = 60.0


class SharedLayer:
    """One cache's Redis side in one process and event loop (see the module docstring)."""

    def __init__(self, url: str, name: str, ttl: float, timeout: float) -> None:
        self.url = url
        self.name = name
        # the question the answers answer (LookupCache.bind), before the first read
        self.scope: str | None = None
        self.ttl_ms = None if ttl == float("inf") else max(1, int(ttl * 1000))
        self.timeout = timeout
        self.client: aioredis.Redis | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.skipped = 0
        self.refused = 0  # entries that did not verify under the signing key
        self._warned = False
        self._refusals_logged_at: float | None = None  # time.monotonic() of the last log
        self._refusals_unlogged = 0

    def _client(self) -> aioredis.Redis:
        loop = asyncio.get_running_loop()
        if self.client is None or self.loop is not loop:
            import redis.asyncio as aioredis

            self.client = aioredis.Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
            self.loop = loop
        return self.client

    def _key(self, key: Hashable) -> str | None:
        from asyncio_ops import UnsupportedKeyError, canonical_bytes

        try:
            raw = canonical_bytes(key)
        except UnsupportedKeyError:
            return None
        assert self.scope is not None, "LookupCache.bind() comes before the first read"
        digest = hashlib.sha256(raw).hexdigest()[:32]
        return f"asyncio_ops:cache:{self.name}:{self.scope}:{digest}"

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "shared cache %r at %s: %s: %s (a miss; the lookup goes on)",
                self.name, redact_dsn(self.url), type(exc).__name__, exc,
            )  # fmt: skip

    def _opened(self, name: str, value: bytes, secret: bytes | None) -> bytes | None:
        """The entry stored under ``name`` without its signature; None (counted, logged)
        when a key is set and it does not verify."""
        signed = value.startswith(_SIGNED)
        if secret is None:  # nothing is verified: a signed entry's signature is skipped
            return value[1 + _SIGNATURE_SIZE :] if signed else value
        if not signed:
            self._refuse(name, "it is not signed")
            return None
        signature, entry = value[1 : 1 + _SIGNATURE_SIZE], value[1 + _SIGNATURE_SIZE :]
        if not verifies(secret, signature, _PURPOSE, entry, name.encode()):
            self._refuse(name, "its signature does not verify: another key, another "
                               "question's entry, or altered")  # fmt: skip
            return None
        return entry

    def _refuse(self, name: str, why: str) -> None:
        self.refused += 1
        now = time.monotonic()
        if self._refusals_logged_at is None:
            self._refusals_logged_at = now
            log.warning(
                "shared cache %r at %s: the entry %s failed verification under %s (%s): "
                "refused, a miss; the lookup asks the service and writes its answer over it "
                "(later refusals are counted in statistics().refused and logged at most "
                "once a minute)",
                self.name, redact_dsn(self.url), name, SIGNING_KEY_ENV, why,
            )  # fmt: skip
            return
        self._refusals_unlogged += 1
        if now - self._refusals_logged_at >= _REFUSALS_LOGGED_EVERY:
            self._log_refusals(now)

    def _log_refusals(self, now: float) -> None:
        log.warning(
            "shared cache %r at %s: %d more entries failed verification under %s and were "
            "refused since the last warning (%d in all)",
            self.name, redact_dsn(self.url), self._refusals_unlogged, SIGNING_KEY_ENV,
            self.refused,
        )  # fmt: skip
        self._refusals_logged_at = now
        self._refusals_unlogged = 0

    async def get_many(self, keys: Sequence[Hashable]) -> dict[Hashable, tuple[Any, ...]]:
        """The answers Redis holds for ``keys`` (a miss for everything on an error; with a
        signing key, only the entries that verify)."""
        names: dict[Hashable, str] = {}
        for k in keys:
            name = self._key(k)
            if name is not None:
                names[k] = name
        asked = list(names)
        self.skipped += len(keys) - len(asked)
        if not asked:
            return {}
        try:
            raw = await self._client().mget([names[k] for k in asked])
        except Exception as exc:
            self._failed(exc)
            return {}
        secret = signing_key()
        found: dict[Hashable, tuple[Any, ...]] = {}
        for key, value in zip(asked, raw, strict=True):
            if not isinstance(value, bytes):  # None: not there
                self.misses += 1
                continue
            entry = self._opened(names[key], value, secret)
            if entry is None:  # refused (counted)
                continue
            rows = _decode(entry)
            if rows is None:  # damaged or of another release: a miss
                self.misses += 1
                continue
            self.hits += 1
            found[key] = rows
        return found

    async def put_many(self, items: Sequence[tuple[Hashable, Sequence[Any]]]) -> None:
        """Write answers back (each with the TTL; signed with a signing key); nothing on an
        error."""
        secret = signing_key()
        writes = []
        for key, rows in items:
            name = self._key(key)
            data = _encode(rows) if name is not None else None
            if name is None or data is None:
                self.skipped += 1
                continue
            if secret is not None:
                data = _SIGNED + mac(secret, _PURPOSE, data, name.encode()) + data
            writes.append((name, data))
        if not writes:
            return
        try:
            async with self._client().pipeline(transaction=False) as pipe:
                for name, data in writes:
                    pipe.set(name, data, px=self.ttl_ms)
                await pipe.execute()
        except Exception as exc:
            self._failed(exc)

    async def aclose(self) -> None:
        if self._refusals_unlogged:
            self._log_refusals(time.monotonic())
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()


def _encode(rows: Sequence[Any]) -> bytes | None:
    if not rows:
        return _EMPTY
    import pyarrow as pa

    try:
        table = pa.Table.from_pylist([dict(r.items()) for r in rows])
    except (pa.ArrowInvalid, pa.ArrowTypeError, AttributeError, TypeError):
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return _ROWS + data


def _decode(data: bytes) -> tuple[Any, ...] | None:
    if data == _EMPTY:
        return ()
    if not data.startswith(_ROWS):
        return None
    import pyarrow as pa

    try:
        with pa.ipc.open_stream(pa.py_buffer(data[1:])) as reader:
            table = reader.read_all()
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError):
        return None
    return tuple(table.to_pylist())
