"""ChatLookup and EmbeddingLookup: rows through an OpenAI-compatible model endpoint.

Any server that speaks the OpenAI API's ``/v1/chat/completions`` and
``/v1/embeddings`` (hosted APIs, vLLM, Ollama, llama.cpp's server) answers them.
``base_url`` is taken as the OpenAI SDK takes it: the API's root (``.../v1``) or
the bare host; None reads ``OPENAI_BASE_URL``, as the key comes from
``OPENAI_API_KEY`` (``api_key_env``).

Call order (the connector base's lifecycle)::

    ChatLookup(base_url, model, prompt=...)   on the driver: nothing is opened
    open(ctx)                                 on a worker: the process's HTTP session
    async_invoke(row)                         one chat completion per row (cached)
    EmbeddingLookup.async_invoke_arrow(batch) embeddings, batch_size inputs a request
    (both through the connector base's NULL-key rule: a row NULL in a column of the
    prompt or input is sent nothing and gets no result)
    close()

Semantics:

- ``prompt`` (and ``input``) is a template over the row's columns,
  ``"Classify: {text}"`` (``str.format`` fields; a column the row lacks is a
  :class:`LookupKeyError` naming it). ``system``: an optional system message.
- A chat answer is the column ``answer`` (declare ``answer string``); with
  other declared output columns (``output_schema="label string, score
  double, tags array<string>"``) the answer is asked for as JSON matching a
  JSON Schema derived from the declared Spark schema (``response_format``
  ``json_schema``; types, nested structs and arrays, nulls: see
  :mod:`._schema`) and typed into the columns: an answer that is not JSON,
  lacks a column or a struct field, or holds a value that does not fit its
  column is a :class:`LookupDecodeError` naming the column (an error row
  with ``on_error="error_column"``). Outside Spark, with only column names
  bound (``bind_output_columns``), it is asked for as a ``json_object`` with
  those fields, values as the model gave them.
- An embedding is the column ``embedding`` (``array<float>``), or the one
  declared output column; a chunk's inputs go ``batch_size`` per request.
- The API key comes from the environment variable ``api_key_env``
  (``OPENAI_API_KEY``; none sent when unset), read on the worker: it is never in
  the lookup's pickle, repr, errors or checkpoints.
- ``rate_limit``: a :class:`~asyncio_ops.connectors.RateLimit` (per worker, or
  shared through Redis by every executor): each request acquires one request
  and its estimated tokens (prompt characters / 4, plus ``max_tokens``) before
  it is sent; a 429 or 503 with ``Retry-After`` pauses the limit for everyone.
- A 429 or 503 asks the client to slow down, and never fails a row by itself:
  the request is sent again, as often as it takes within the operator's
  ``timeout``, after its ``Retry-After`` (at most ``max_retry_after`` seconds:
  a longer one is clipped and logged); without a ``rate_limit`` the process's
  pace for the endpoint slows down (``connectors/_slow_down.py``). A 500, 502
  or 504 is sent again up to ``max_retries`` times; other statuses raise
  :class:`LookupResponseError`. Once answered, the request's estimate is
  settled against what a quota counts for it (``RateLimit.settle``): the
  prompt tokens the answer reports, and ``max_tokens`` (or the completion, if
  longer), as providers count a request's tokens before it is answered.
- ``usage()``: the prompt and completion tokens the server reported, the
  requests, and the cost when ``prices`` (per 1,000 prompt and completion
  tokens) are given; per lookup object, in this process. The runtime sums them
  in ``AsyncMetrics``, with the permits and tokens taken from ``rate_limit``
  and the seconds spent waiting for them.
- ``max_total_tokens``: a budget of tokens (prompt and completion) for the
  lookup object built on the driver, i.e. for every task, attempt and action
  of the job that uses it. Before each request its estimate is reserved from
  the budget and, once answered, settled to the usage reported, and at least
  the estimate (refunded if no answer came), so the budget is never passed by
  more than the estimates fell short. A usage that is not a whole number of
  tokens >= 0 (negative, a string, infinite, ``prompt_tokens`` missing) is a
  :class:`LookupDecodeError` naming the endpoint and the rows: nothing the
  server reports gives tokens back. A request the budget cannot hold is not sent: the row raises
  :class:`LookupBudgetExceeded` (not retryable: an error row with
  ``on_error="error_column"``, else the job fails); cached answers still
  come. Scope: with ``rate_limit`` a RateLimit shared through Redis the
  total is one for the whole job, counted on that server
  (``asyncio_ops:rate:<name>:total:<lookup id>``); otherwise it is per
  worker process (each Python worker spends up to the budget).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import aiohttp

from asyncio_ops import ConfigurationError
from asyncio_ops.options import at_least, seconds

from .. import (
    BaseLookup,
    BatchStatistics,
    LookupBudgetExceeded,
    LookupCache,
    LookupDecodeError,
    LookupResponseError,
    RateLimit,
    Row,
    SharedResources,
)
from .._redact import Scrubber, redact_url
from .._slow_down import SLOW_DOWN, pace_of
from ..http._aiohttp_errors import aiohttp_error
from ..http._http_lookup import parse_retry_after
from ._wire import Template, api_root, reported_usage

if TYPE_CHECKING:
    import pyarrow as pa

    from ._schema import AnswerSchema  # imports pyarrow: only once a schema is bound

__all__ = ["ChatLookup", "EmbeddingLookup", "Usage"]

_NO_BATCHES: Final = BatchStatistics(0, 0, 0, 0, 0)
# tokens spent from each lookup's max_total_tokens in this process, by the lookup's
# budget id (without a shared RateLimit)
_SPENT: Final[dict[str, int]] = {}


async def _create_session(settings: Hashable) -> aiohttp.ClientSession:
    assert isinstance(settings, int)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=settings))


async def _close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


def _abandon_session(session: aiohttp.ClientSession) -> None:
    connector = session.connector
    if connector is not None:
        connector._close()


_SESSIONS: Final[SharedResources[aiohttp.ClientSession]] = SharedResources(
    "openai session", create=_create_session, aclose=_close_session,
    terminate=_abandon_session,
)  # fmt: skip


@dataclass(frozen=True)
class Usage:
    """Tokens the server reported and requests made by one lookup in this process;
    ``cost`` in the unit of ``prices`` (None without them).

    Example::

        usage = chat.usage()  # after its calls: Usage(requests=1, prompt_tokens=7, ...)
    """

    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None


class _ModelLookup(BaseLookup[aiohttp.ClientSession]):
    """What both lookups share: the session, the key, the limit, retries, usage."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        *,
        api_key_env: str,
        rate_limit: RateLimit | None,
        cache: LookupCache[Any] | None,
        timeout: float,
        max_retries: int,
        max_connections: int,
        prices: tuple[float, float] | None,
        max_total_tokens: int | None,
        max_retry_after: float,
    ) -> None:
        super().__init__(cache=cache)
        base_url = api_root(base_url)
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"model must be a model name, got {model!r}")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise ConfigurationError(
                f"rate_limit must be an asyncio_ops.connectors.RateLimit, got {rate_limit!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.rate_limit = rate_limit
        self.request_timeout = seconds(timeout, "timeout")
        self.max_retries = at_least(max_retries, "max_retries", 0)
        self.max_retry_after = seconds(max_retry_after, "max_retry_after", low_ok=True)
        self.max_connections = at_least(max_connections, "max_connections", 1)
        self.prices = prices
        self.max_total_tokens = (
            None if max_total_tokens is None
            else at_least(max_total_tokens, "max_total_tokens", 1)
        )  # fmt: skip
        # drawn on the driver: every pickled copy of this lookup (each task, attempt and
        # action of the job) spends from one budget
        self.budget_id = uuid.uuid4().hex
        self.output_columns: tuple[str, ...] | None = None
        self._requests = 0
        self._prompt_tokens = 0
        self._completion_tokens = 0

    def service_endpoint(self) -> str:
        """The model endpoint: the API's root URL (without credentials) and the model."""
        return f"model {redact_url(self.base_url)} {self.model}"

    async def _open_runtime(self) -> aiohttp.ClientSession:
        return await _SESSIONS.acquire(self.max_connections)

    async def _close_runtime(self, runtime: aiohttp.ClientSession) -> None:
        await _SESSIONS.release(self.max_connections)

    def _runtime_batch_statistics(self, runtime: aiohttp.ClientSession) -> BatchStatistics:
        return _NO_BATCHES

    def bind_output_columns(self, columns: Sequence[str]) -> None:
        self.output_columns = tuple(columns)

    def token_usage(self) -> tuple[int, int, float | None]:
        """``asyncio_ops.SupportsTokenUsage``: what reaches ``AsyncMetrics``."""
        usage = self.usage()
        return usage.prompt_tokens, usage.completion_tokens, usage.cost

    def usage(self) -> Usage:
        cost = None
        if self.prices is not None:
            cost = (self._prompt_tokens * self.prices[0]
                    + self._completion_tokens * self.prices[1]) / 1000  # fmt: skip
        return Usage(self._requests, self._prompt_tokens, self._completion_tokens, cost)

    async def _post(self, path: str, body: dict[str, Any], estimate: int, what: str) -> Any:
        """POST ``body``; the decoded JSON answer. A 429/503 is sent again after its
        Retry-After (pausing the limit, or slowing the pace) within the operator's
        timeout, a 5xx up to ``max_retries`` times (module docstring). ``estimate``: its
        tokens before it is sent; ``what``: the rows it asks for, for errors."""
        reserved = await self._reserve_budget(estimate, what)
        answered = False
        billed: int | None = None
        try:
            answer, billed = await self._post_limited(path, body, estimate, what)
            answered = True
        finally:
            if reserved:
                # no answer: refunded; an answer: what it reports, and at least the
                # estimate (a server reporting less, or nothing, never gives tokens back)
                spent = max(billed or 0, reserved) if answered else 0
                await self._spend(spent - reserved)
        return answer

    async def _reserve_budget(self, estimate: int, what: str) -> int:
        """Take ``estimate`` from ``max_total_tokens`` (0 without one); a
        LookupBudgetExceeded naming the option when it cannot hold it."""
        maximum = self.max_total_tokens
        if maximum is None:
            return 0
        units = min(estimate, maximum)  # a request larger than the budget still fits alone
        total = await self._spend(units, maximum)
        if total is None:
            spent = await self._spend(0)
            scope = ("in the job (shared through Redis)" if self._budget_shared()
                     else "in this worker process")  # fmt: skip
            raise LookupBudgetExceeded(
                f"max_total_tokens={maximum} of {type(self).__name__}(model {self.model!r}) is "
                f"spent: {spent} tokens used {scope}, and this request needs about "
                f"{estimate}; not sent for {what}"
            )
        return units

    def _budget_shared(self) -> bool:
        limit = self.rate_limit
        return limit is not None and limit.shared is not None

    async def _spend(self, units: int, maximum: int | None = None) -> int | None:
        """Add ``units`` to this lookup's spent tokens unless that passes ``maximum``;
        the total after, None when refused."""
        limit = self.rate_limit
        if limit is not None and limit.shared is not None:
            return await limit.take_total(self.budget_id, units, maximum)
        total = _SPENT.get(self.budget_id, 0)
        if units > 0 and maximum is not None and total + units > maximum:
            return None
        total = _SPENT[self.budget_id] = total + units
        return total

    async def _post_limited(
        self, path: str, body: dict[str, Any], estimate: int, what: str
    ) -> tuple[Any, int | None]:
        """The answer, and the tokens it was billed (None if it reports no usage)."""
        session = self._require_runtime()
        url = f"{self.base_url}{path}"
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        limit = self.rate_limit
        attempt = 0
        # no RateLimit: the process's pace for this endpoint, learned from its 429s and 503s
        pace = pace_of(("model", self.base_url), f"{type(self).__name__} {redact_url(url)}") if (
            limit is None
        ) else None  # fmt: skip
        while True:
            if pace is not None and not pace.free():
                self._throttle_waited += await pace.wait()
            try:
                async with self._limited(limit, estimate):
                    status, raw, after = await self._send(session, url, body, headers)
            except Exception as exc:
                mapped = aiohttp_error(exc, "POST", url, Scrubber([key]))
                if mapped is None:
                    raise
                raise mapped from exc
            self._requests += 1
            if 200 <= status < 300:
                if pace is not None:
                    pace.answered()
                try:
                    answer = json.loads(raw)
                except ValueError as exc:
                    raise LookupDecodeError(
                        f"POST {redact_url(url)} answered {status} with no JSON", status=status
                    ) from exc
                usage = answer.get("usage") if isinstance(answer, dict) else None
                billed = None
                if usage is not None:
                    prompt, completion = reported_usage(usage, url, what)
                    billed = prompt + completion
                    self._prompt_tokens += prompt
                    self._completion_tokens += completion
                    if limit is not None:  # what the quota counted, not the estimate:
                        # the prompt, and max_tokens (quotas count it before the answer)
                        counted = prompt + max(completion, int(body.get("max_tokens") or 0))
                        await self._settle(limit, estimate, counted)
                return answer, billed
            if status in SLOW_DOWN:  # sent again, not counted against max_retries
                await self._slowed_down(pace, limit, status, self._refused(url, status, after, raw),
                                        after, self.max_retry_after, 0.5)  # fmt: skip
                continue
            if status in (500, 502, 504) and attempt < self.max_retries:
                await self._before_retry(min(30.0, 0.5 * 2**attempt), status)
                attempt += 1
                continue
            raise self._refused(url, status, after, raw)

    def _refused(self, url: str, status: int, after: float | None, raw: bytes) -> Exception:
        return LookupResponseError(
            f"POST {redact_url(url)} answered {status} (model {self.model!r})",
            status=status, retry_after=after, body=raw[:200],
            retryable=status in (429, 500, 502, 503, 504),
        )  # fmt: skip

    async def _send(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any],
        headers: dict[str, str],
    ) -> tuple[int, bytes, float | None]:  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with session.post(url, json=body, headers=headers, timeout=timeout) as response:
            raw = await response.read()
            after = parse_retry_after(response.headers.get("Retry-After"))
            return response.status, raw, after

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({redact_url(self.base_url)!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r})"
        )


class ChatLookup(_ModelLookup):
    """One chat completion per row (see the module docstring).

    Example:

    >>> import asyncio
    >>> from asyncio_ops.connectors.openai import ChatLookup
    >>> from asyncio_ops.services.models import OpenAIServiceThread
    >>> async def main(base):
    ...     chat = ChatLookup(base, "local", prompt="Is this review positive? {text}",
    ...                       max_tokens=16)
    ...     async with chat:
    ...         return await chat.async_invoke({"text": "a great product"})
    >>> with OpenAIServiceThread() as service:  # any OpenAI-compatible server's base URL
    ...     asyncio.run(main(service.url))
    [{'answer': 'positive'}]

    In Spark: ``unordered_wait(reviews, chat, timeout=60, output_schema="label string,
    score double")`` asks for JSON of those columns (docs/enrich-models.md).
    """

    def __init__(
        self,
        base_url: str | None,
        model: str,
        *,
        prompt: str,
        system: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        api_key_env: str = "OPENAI_API_KEY",
        rate_limit: RateLimit | None = None,
        cache: LookupCache[Any] | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_connections: int = 16,
        prices: tuple[float, float] | None = None,
        max_total_tokens: int | None = None,
        max_retry_after: float = 60.0,
    ) -> None:
        super().__init__(
            base_url, model, api_key_env=api_key_env, rate_limit=rate_limit, cache=cache,
            timeout=timeout, max_retries=max_retries, max_connections=max_connections,
            prices=prices, max_total_tokens=max_total_tokens, max_retry_after=max_retry_after,
        )  # fmt: skip
        self.prompt = Template(prompt, "prompt")
        self.system = system
        self.max_tokens = at_least(max_tokens, "max_tokens", 1)
        self.temperature = float(temperature)
        self.answer_schema: AnswerSchema | None = None

    def bind_output_schema(self, schema: pa.Schema) -> None:
        """``asyncio_ops.SupportsOutputSchema``: the declared columns with their types; the
        answer is then asked for as JSON of that schema and typed by it (a single
        ``answer`` column stays the plain text)."""
        from ._schema import AnswerSchema

        self.answer_schema = None if schema.names == ["answer"] else AnswerSchema(schema)

    def _structured(self) -> tuple[str, ...] | None:
        columns = self.output_columns
        return None if columns is None or columns == ("answer",) else columns

    def request_fields(self) -> tuple[str, ...]:
        """The prompt's columns: a NULL in any of them sends no prompt."""
        return self.prompt.fields

    def cache_identity(self) -> dict[str, Any]:
        """What decides an answer besides the prompt's values: the endpoint, the model,
        the system message, the prompt template, the sampling settings and the answer's
        declared shape (the API key never)."""
        schema = self.answer_schema
        return {"base_url": redact_url(self.base_url), "model": self.model,
                "system": self.system, "prompt": self.prompt.text,
                "max_tokens": self.max_tokens, "temperature": self.temperature,
                "columns": self.output_columns,
                "schema": schema.json_schema if schema is not None else None}  # fmt: skip

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        self._require_runtime()
        text = self.prompt.render(value)
        fields = self._structured()
        schema = self.answer_schema if fields is not None else None
        # a changed schema is another question: its answers are cached apart
        shape: Hashable = (
            json.dumps(schema.json_schema, sort_keys=True) if schema is not None else fields
        )

        async def ask() -> tuple[Row, ...]:
            return (await self._ask(text, fields, schema),)

        rows: tuple[Row, ...] = await self._cached((text, shape), ask)
        return [dict(row) for row in rows]

    async def _ask(
        self, text: str, fields: tuple[str, ...] | None, schema: AnswerSchema | None
    ) -> Row:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        content = text
        if fields is not None:
            content += ("\nAnswer with a JSON object with the fields: "
                        + ", ".join(fields) + ".")  # fmt: skip
        messages.append({"role": "user", "content": content})
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }  # fmt: skip
        if schema is not None:
            body["response_format"] = schema.response_format()
        elif fields is not None:
            body["response_format"] = {"type": "json_object"}
        answer = await self._post("/chat/completions", body,
                                  len(content) // 4 + 1 + self.max_tokens,
                                  f"the prompt {text[:80]!r}")  # fmt: skip
        try:
            said = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LookupDecodeError(f"a chat answer without choices[0].message.content: {exc}"
                                    ) from exc  # fmt: skip
        if fields is None:
            return {"answer": said}
        if schema is not None:
            return schema.typed(said)
        from ._schema import answer_object  # (imports pyarrow, which Spark has loaded)

        parsed = answer_object(said, list(fields))
        return {f: parsed[f] for f in fields}


class EmbeddingLookup(_ModelLookup):
    """Embeddings of a row's text, ``batch_size`` rows per request (see the module
    docstring).

    Example::

        embed = EmbeddingLookup(base, "text-embedding-3-small", input="{text}")
        vectors = unordered_wait(reviews, embed, timeout=60,
                                 output_schema="embedding array<float>")
    """

    def __init__(
        self,
        base_url: str | None,
        model: str,
        *,
        input: str,
        batch_size: int = 64,
        api_key_env: str = "OPENAI_API_KEY",
        rate_limit: RateLimit | None = None,
        cache: LookupCache[Any] | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_connections: int = 16,
        prices: tuple[float, float] | None = None,
        max_total_tokens: int | None = None,
        max_retry_after: float = 60.0,
    ) -> None:
        super().__init__(
            base_url, model, api_key_env=api_key_env, rate_limit=rate_limit, cache=cache,
            timeout=timeout, max_retries=max_retries, max_connections=max_connections,
            prices=prices, max_total_tokens=max_total_tokens, max_retry_after=max_retry_after,
        )  # fmt: skip
        self.input = Template(input, "input")
        self.batch_size = at_least(batch_size, "batch_size", 1)

    def _column(self) -> str:
        columns = self.output_columns
        return columns[0] if columns else "embedding"

    def preferred_chunk_rows(self) -> int:
        return self.batch_size

    def preferred_capacity(self) -> int:
        return self.max_connections

    def request_fields(self) -> tuple[str, ...]:
        """The input's columns: a NULL in any of them sends nothing."""
        return self.input.fields

    def cache_identity(self) -> dict[str, Any]:
        """What decides a vector besides the input's values: the endpoint, the model and
        the input template (the API key never)."""
        return {"base_url": redact_url(self.base_url), "model": self.model,
                "input": self.input.text}  # fmt: skip

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        index, columns = await self._embed([self.input.render(value)])
        return [{name: values[0] for name, values in columns.items()}] if index else []

    async def lookup_many(self, batch: pa.RecordBatch) -> tuple[list[int], dict[str, Any]]:
        rows = batch.to_pylist()
        return await self._embed([self.input.render(row) for row in rows])

    async def _embed(self, texts: list[str]) -> tuple[list[int], dict[str, Any]]:
        self._require_runtime()
        known = await self._matches_of(texts, self._fetch, self.batch_size)
        column = self._column()
        return list(range(len(texts))), {column: [known[t][0]["vector"] for t in texts]}

    async def _fetch(self, texts: Sequence[Hashable]) -> dict[Hashable, Any]:
        inputs = [str(t) for t in texts]
        answer = await self._post("/embeddings", {"model": self.model, "input": inputs},
                                  sum(len(t) // 4 + 1 for t in inputs),
                                  f"the inputs {[t[:40] for t in inputs[:3]]!r}"
                                  + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else ""),
                                  )  # fmt: skip
        try:
            data = sorted(answer["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (KeyError, TypeError, ValueError) as exc:
            raise LookupDecodeError(f"an embeddings answer without data[].embedding: {exc}"
                                    ) from exc  # fmt: skip
        if len(vectors) != len(inputs):
            raise LookupDecodeError(
                f"the embeddings answer holds {len(vectors)} vectors for {len(inputs)} inputs"
            )
        # cached as rows, as every connector's answers (typed by Arrow when shared)
        return {text: ({"vector": vector},) for text, vector in zip(texts, vectors, strict=True)}
