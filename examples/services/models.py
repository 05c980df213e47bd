"""A small OpenAI-compatible model service for the LLM example and the tests.

Speaks the two endpoints a lookup uses, with the request and response shapes of
the OpenAI API (so a client written for it, ours or ``openai.AsyncOpenAI``, works
against it unchanged), deterministic answers, token counting and a quota:

- ``POST /v1/chat/completions`` ``{"model", "messages", "max_tokens"?,
  "response_format"?}``: the answer to the last user message is a sentiment:
  ``positive`` when it has one of the words good, great, love, excellent, else
  ``negative``; with ``response_format`` of type ``json_object`` the content
  is a JSON object ``{"label", "score", "words"}``; of type ``json_schema`` it
  is an object of that schema (:func:`conforming`: ``label``, ``score`` and
  ``words`` as above where the schema has them, every other value made from
  its type and the text, deterministically (an integer: the words of the
  prompt's first line); a nullable property named
  ``*_null`` or ``*_none`` is null). A user message holding
  ``<<reply:TEXT>>`` is answered ``TEXT`` verbatim (to test what a client does
  with an answer that does not conform).
  ``usage``: prompt tokens (the words of every message), completion tokens.
- ``POST /v1/embeddings`` ``{"model", "input": str | [str]}``: per input an
  8-float vector from the SHA-256 of its text (:func:`embedding`).
- Tokens are words (whitespace-separated), at least 1 per text.
- Quota: ``requests_per_minute`` and ``tokens_per_minute`` (0: none) as
  token buckets refilled continuously, holding ``burst_seconds`` of the rate
  (a minute's by default); a request over either is answered ``429`` with
  ``Retry-After`` (whole seconds) and counted in ``rejected``.
- ``latency``: seconds each request served takes before it is answered (0: none), as
  a model's generation time.
- ``api_key``: when set, a request without ``Authorization: Bearer <key>``
  gets ``401``.
- ``GET /stats``: the counters below as JSON (``requests``, ``tokens``,
  ``rejected``); :attr:`OpenAIServiceThread.stats` also holds ``log``: per
  request served or refused ``(monotonic time, model, status)``, and
  ``bodies``: every chat request's JSON body.

Run: ``python -m asyncio_ops.services.models --port 8090`` (``--rpm``,
``--tpm``, ``--api-key``, ``--latency-ms``); in a program :class:`OpenAIServiceThread`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import re
import time
from typing import Any, Final

from aiohttp import web

from .customers import ServiceThread

POSITIVE: Final = frozenset({"good", "great", "love", "excellent"})
STATS: Final = web.AppKey("stats", dict)
QUOTA: Final = web.AppKey("quota", dict)
KEY: Final = web.AppKey("api_key", str)
LATENCY: Final = web.AppKey("latency", float)


def tokens(text: str) -> int:
    """The tokens of ``text`` as this service counts them: its words (at least 1)."""
    return max(1, len(text.split()))


def embedding(text: str) -> list[float]:
    """The vector this service answers for ``text``: 8 floats in [-1, 1)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 128.0 - 1.0, 6) for b in digest[:8]]


def sentiment(text: str) -> str:
    words = set(re.findall(r"[a-z]+", text.lower()))
    return "positive" if words & POSITIVE else "negative"


def _take(app: web.Application, cost: int) -> float:
    """Take one request and ``cost`` tokens from the quota; seconds to wait if refused."""
    quota = app[QUOTA]
    now = time.monotonic()
    waits = []
    for name, amount in (("requests", 1), ("tokens", cost)):
        per_minute = quota[f"{name}_per_minute"]
        if not per_minute:
            continue
        rate = per_minute / 60.0
        level = min(rate * quota["burst_seconds"], quota[name] + (now - quota["at"]) * rate)
        quota[name] = level
        if level < amount:
            waits.append((amount - level) / rate)
    quota["at"] = now
    if waits:
        return float(max(waits))
    for name, amount in (("requests", 1), ("tokens", cost)):
        if quota[f"{name}_per_minute"]:
            quota[name] -= amount
    return 0.0


async def _guard(request: web.Request, cost: int, model: str) -> web.Response | None:
    app = request.app
    key = app[KEY]
    if key and request.headers.get("Authorization") != f"Bearer {key}":
        return web.json_response({"error": {"message": "invalid api key"}}, status=401)
    wait = _take(app, cost)
    if wait > 0:
        app[STATS]["rejected"] += 1
        app[STATS]["log"].append((time.monotonic(), model, 429))
        return web.json_response(
            {"error": {"message": "rate limit reached", "type": "rate_limit"}},
            status=429, headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )  # fmt: skip
    app[STATS]["requests"] += 1
    app[STATS]["tokens"] += cost
    app[STATS]["log"].append((time.monotonic(), model, 200))
    if app[LATENCY] > 0:
        await asyncio.sleep(app[LATENCY])
    return None


_REPLY: Final = re.compile(r"<<reply:(.*?)>>", re.S)


def conforming(schema: Any, text: str, name: str = "") -> Any:
    """A value of the JSON Schema ``schema`` for the prompt ``text`` (see the module
    docstring), made deterministically."""
    label = sentiment(text)
    types = schema.get("type", "object") if isinstance(schema, dict) else "object"
    kinds = [types] if isinstance(types, str) else list(types)
    if "null" in kinds and name.endswith(("_null", "_none")):
        return None
    kind = next((k for k in kinds if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        if isinstance(properties, dict):
            return {key: conforming(sub, text, key) for key, sub in properties.items()}
        values = schema.get("additionalProperties")
        return (
            {w: conforming(values, text, w) for w in text.lower().split()[:2]}
            if isinstance(values, dict)
            else {}
        )
    if kind == "array":
        return [conforming(schema.get("items") or {}, text, name) for _ in range(2)]
    if kind == "string":
        if name == "label":
            return label
        fmt = schema.get("format")
        if fmt == "date":
            return "2024-05-17"
        if fmt == "date-time":  # a pattern: one without an offset (local time)
            return "2024-05-17T10:30:00" if "pattern" in schema else "2024-05-17T10:30:00+00:00"
        if schema.get("contentEncoding") == "base64":
            return base64.b64encode(text.encode()[:8]).decode()
        return f"{name or 'text'}: {label}"
    if kind == "integer":  # the words of the prompt's first line
        return tokens(text.split("\n", 1)[0])
    if kind == "number":
        return 0.9 if label == "positive" else 0.1
    if kind == "boolean":
        return label == "positive"
    return None


async def chat(request: web.Request) -> web.Response:
    body = await request.json()
    request.app[STATS]["bodies"].append(body)
    messages = body.get("messages") or []
    prompt = sum(tokens(str(m.get("content", ""))) for m in messages)
    refused = await _guard(
        request, prompt + int(body.get("max_tokens") or 16), str(body.get("model"))
    )
    if refused is not None:
        return refused
    text = str(messages[-1].get("content", "")) if messages else ""
    label = sentiment(text)
    response_format = body.get("response_format") or {}
    kind = response_format.get("type")
    verbatim = _REPLY.search(text)
    if verbatim is not None:
        content = verbatim.group(1)
    elif kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {}
        content = json.dumps(conforming(schema, text))
    elif kind == "json_object":
        score = 0.9 if label == "positive" else 0.1
        content = json.dumps({"label": label, "score": score, "words": tokens(text)})
    else:
        content = label
    completion = tokens(content)
    return web.json_response({
        "id": "chatcmpl-local", "object": "chat.completion", "model": body.get("model"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    })  # fmt: skip


async def embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    given = body.get("input")
    inputs = [given] if isinstance(given, str) else list(given or [])
    cost = sum(tokens(str(t)) for t in inputs)
    refused = await _guard(request, cost, str(body.get("model")))
    if refused is not None:
        return refused
    request.app[STATS]["batches"].append(len(inputs))
    return web.json_response({
        "object": "list", "model": body.get("model"),
        "data": [{"object": "embedding", "index": i, "embedding": embedding(str(t))}
                 for i, t in enumerate(inputs)],
        "usage": {"prompt_tokens": cost, "total_tokens": cost},
    })  # fmt: skip


def make_app(
    *, requests_per_minute: int = 0, tokens_per_minute: int = 0, api_key: str = "",
    burst_seconds: float = 60.0, latency: float = 0.0,
) -> web.Application:  # fmt: skip
    """``burst_seconds``: how many seconds of the quota may go at once (a minute's by
    default, as per-minute quotas allow); ``latency``: seconds per request served."""
    if latency < 0:
        raise ValueError(f"latency must be >= 0, got {latency}")
    app = web.Application()
    app[LATENCY] = latency
    app[STATS] = {"requests": 0, "tokens": 0, "rejected": 0, "batches": [], "log": [], "bodies": []}
    app[QUOTA] = {"requests_per_minute": requests_per_minute,
                  "requests": requests_per_minute * burst_seconds / 60,
                  "tokens_per_minute": tokens_per_minute,
                  "tokens": tokens_per_minute * burst_seconds / 60,
                  "burst_seconds": burst_seconds, "at": time.monotonic()}  # fmt: skip
    app[KEY] = api_key
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/stats", stats)
    return app


async def stats(request: web.Request) -> web.Response:
    counts = request.app[STATS]
    return web.json_response({k: counts[k] for k in ("requests", "tokens", "rejected")})


class OpenAIServiceThread(ServiceThread):
    """The service on a free local port from a daemon thread (see ``ServiceThread``);
    :attr:`stats`: requests and tokens served, requests ``rejected`` (429), and the
    size of every embeddings request (``batches``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(customers=0)
        self._app = make_app(**options)
        self.stats: dict[str, Any] = self._app[STATS]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m asyncio_ops.services.models", description=__doc__.splitlines()[0]
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--rpm", type=int, default=0, help="requests per minute (0: no quota)")
    p.add_argument("--tpm", type=int, default=0, help="tokens per minute (0: no quota)")
    p.add_argument("--api-key", default="", help="require this bearer token")
    p.add_argument("--latency-ms", type=float, default=0.0, help="per request served")
    args = p.parse_args(argv)
    print(
        f"model service on {args.host}:{args.port}: base URL http://{args.host}:{args.port}/v1",
        flush=True,
    )
    web.run_app(make_app(requests_per_minute=args.rpm, tokens_per_minute=args.tpm,
                         api_key=args.api_key, latency=args.latency_ms / 1000),
                host=args.host, port=args.port,
                access_log=None, print=None)  # fmt: skip


if __name__ == "__main__":
    main()
