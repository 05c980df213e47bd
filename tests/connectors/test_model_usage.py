"""A budget never trusts the server: a model endpoint's reported usage is taken only when
each count is a whole number of tokens >= 0 (anything else is a LookupDecodeError naming
the endpoint and the prompt), and a budget charges every answered request at least its
estimate, so an answer reporting little, nothing or less than nothing never gives tokens
back. Against a real HTTP server on 127.0.0.1 answering the usage a test gives it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from asyncio_ops.connectors import LookupBudgetExceeded, LookupDecodeError
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.services.customers import ServiceThread


class _Reporting(ServiceThread):
    """``POST /v1/chat/completions``: an answer whose ``usage`` is :attr:`usage` (left out
    when it is ``...``); :attr:`asked` counts the requests."""

    def __init__(self) -> None:
        super().__init__(customers=0)
        self.usage: Any = ...
        self.asked = 0
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._app = app

    async def _chat(self, request: web.Request) -> web.Response:
        self.asked += 1
        answer: dict[str, Any] = {"choices": [{"message": {"content": "ok"}}]}
        if self.usage is not ...:
            answer["usage"] = self.usage
        # json.dumps writes Infinity for float("inf"), as a careless server would
        return web.json_response(answer)


@pytest.fixture
def server() -> Iterator[_Reporting]:
    with _Reporting() as service:
        yield service


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": -1000, "completion_tokens": 1}, {"prompt_tokens": "n/a"},
     {"prompt_tokens": float("inf")}, {"prompt_tokens": 2.5}, {"completion_tokens": 3},
     {"prompt_tokens": True}, "lots"],
    ids=["negative", "text", "infinite", "fraction", "no-prompt-tokens", "bool", "not-an-object"],
)  # fmt: skip
@pytest.mark.asyncio
async def test_a_usage_that_is_not_a_count_is_a_decode_error(
    server: _Reporting, usage: Any
) -> None:
    server.usage = usage
    async with ChatLookup(server.url, "m", prompt="Say {word}", max_total_tokens=200) as chat:
        with pytest.raises(LookupDecodeError, match=r"POST http://127\.0\.0\.1:\d+/v1/chat/"
                           r"completions answered a usage .*for the prompt 'Say hi'"):  # fmt: skip
            await chat.async_invoke({"word": "hi"})


@pytest.mark.parametrize("usage", [..., {"prompt_tokens": 0, "completion_tokens": 0}],
                         ids=["no-usage", "zero"])  # fmt: skip
@pytest.mark.asyncio
async def test_a_budget_charges_at_least_the_estimate(server: _Reporting, usage: Any) -> None:
    server.usage = usage
    # each request's estimate: len("Say hi") // 4 + 1 + max_tokens 10 = 12 tokens
    async with ChatLookup(server.url, "m", prompt="Say {word}", max_tokens=10,
                          max_total_tokens=50) as chat:  # fmt: skip
        for _ in range(4):  # 48 of 50 tokens
            assert await chat.async_invoke({"word": "hi"}) == [{"answer": "ok"}]
        with pytest.raises(LookupBudgetExceeded, match="max_total_tokens=50"):
            await chat.async_invoke({"word": "hi"})
    assert server.asked == 4  # before: answers reporting nothing refunded every estimate


@pytest.mark.asyncio
async def test_the_base_url_is_taken_as_the_openai_sdk_takes_it(
    server: _Reporting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.../v1``, the bare host, and ``OPENAI_BASE_URL`` when none is given, all reach
    ``/v1/chat/completions``."""
    server.usage = {"prompt_tokens": 1, "completion_tokens": 1}
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1/")
    for base in (f"{server.url}/v1", server.url, None):
        async with ChatLookup(base, "m", prompt="Say {word}") as chat:
            assert await chat.async_invoke({"word": "hi"}) == [{"answer": "ok"}]
    assert server.asked == 3
    monkeypatch.setenv("OPENAI_BASE_URL", "ftp://h")
    from asyncio_ops import ConfigurationError

    with pytest.raises(ConfigurationError, match="from OPENAI_BASE_URL"):
        ChatLookup(None, "m", prompt="Say {word}")
