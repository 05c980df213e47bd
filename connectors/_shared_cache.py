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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import redis.asyncio as aioredis

from ._redact import redact_dsn

log = logging.getLogger("asyncio_ops.connectors")

_EMPTY: Final = b"\x00"
_ROWS: Final = b"\x01"


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
        self._warned = False

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
        from asyncio_ops import UnsupportedKeyError
        from asyncio_ops.state import canonical_bytes

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

    async def get_many(self, keys: Sequence[Hashable]) -> dict[Hashable, tuple[Any, ...]]:
        """The answers Redis holds for ``keys`` (a miss for everything on an error)."""
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
        found: dict[Hashable, tuple[Any, ...]] = {}
        for key, value in zip(asked, raw, strict=True):
            if value is None:
                self.misses += 1
                continue
            rows = _decode(value) if isinstance(value, bytes) else None
            if rows is None:  # damaged or of another release: a miss
                self.misses += 1
                continue
            self.hits += 1
            found[key] = rows
        return found

    async def put_many(self, items: Sequence[tuple[Hashable, Sequence[Any]]]) -> None:
        """Write answers back (each with the TTL); nothing on an error."""
        writes = []
        for key, rows in items:
            name = self._key(key)
            data = _encode(rows) if name is not None else None
            if name is None or data is None:
                self.skipped += 1
                continue
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
