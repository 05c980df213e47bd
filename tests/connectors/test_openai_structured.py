"""Structured chat answers: the declared Spark schema becomes the request's JSON Schema,
and the answer is typed into the columns or is an error naming the column. Against the
example OpenAI-compatible server on 127.0.0.1 (it answers a json_schema request with an
object of that schema, and ``<<reply:TEXT>>`` verbatim)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import LookupDecodeError
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.services.models import OpenAIServiceThread, tokens
from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import unordered_wait
from tests.spark.conftest import spark

__all__ = ["spark"]

EVERY_TYPE = (  # checked in this order: a nested mismatch first
    "author struct<name:string, karma:int, badges:array<string>>, label string, "
    "flag boolean, tiny tinyint, small smallint, n int, big bigint, "
    "ratio float, score double, price decimal(10,2), day date, at timestamp, "
    "local timestamp_ntz, raw binary, tags array<string>, "
    "items array<struct<sku:string, qty:int>>, counts map<string,int>, note_null string"
)


@pytest.fixture
def service() -> Iterator[OpenAIServiceThread]:
    with OpenAIServiceThread() as s:
        yield s


@pytest.mark.spark
def test_every_column_type_is_asked_for_and_typed_in_spark(spark: SparkSession) -> None:
    """One job: each row's answer lands in typed columns (nested structs, arrays of
    structs, maps, nulls); a malformed answer and one whose nested field has the wrong
    type are error rows naming the column."""
    with OpenAIServiceThread() as service:
        reviews = spark.createDataFrame(
            [(1, "a great film"), (2, "dull and long"),
             (3, "<<reply:{not json>>"),
             (4, '<<reply:{"author": {"name": "a", "karma": "lots", "badges": []}}>>')],
            "id long, text string",
        )  # fmt: skip
        chat = ChatLookup(service.url, "local", prompt="{text}")
        out = unordered_wait(reviews, chat, timeout=30, output_schema=EVERY_TYPE,
                             on_error="error_column")  # fmt: skip
        rows = {r.id: r for r in out.collect()}
    for i, text, label, score in ((1, "a great film", "positive", 0.9),
                                  (2, "dull and long", "negative", 0.1)):  # fmt: skip
        r = rows[i]
        assert r._error is None
        n = tokens(text)
        assert (r.label, r.flag, r.tiny, r.small, r.n, r.big) == (
            label,
            label == "positive",
            n,
            n,
            n,
            n,
        )
        assert r.ratio == pytest.approx(score) and r.score == score
        assert r.price == Decimal(str(score))
        assert r.day == dt.date(2024, 5, 17)
        assert r.at.astimezone(dt.UTC) == dt.datetime(2024, 5, 17, 10, 30, tzinfo=dt.UTC)
        assert r.local == dt.datetime(2024, 5, 17, 10, 30)
        assert bytes(r.raw) == text.encode()[:8]
        assert r.tags == [f"tags: {label}"] * 2
        assert r.author.asDict(recursive=True) == {
            "name": f"name: {label}",
            "karma": n,
            "badges": [f"badges: {label}"] * 2,
        }
        assert [x.asDict() for x in r.items] == [{"sku": f"sku: {label}", "qty": n}] * 2
        assert r.counts == {w: n for w in text.split()[:2]}
        assert r.note_null is None
    malformed, mismatched = rows[3]._error, rows[4]._error
    assert malformed.exception == "LookupDecodeError"
    assert "not the JSON object asked for" in malformed.message
    assert mismatched.exception == "LookupDecodeError"
    assert "output column 'author.karma'" in mismatched.message
    assert '"lots"' in mismatched.message
    # the request carried the schema derived from the Spark types
    (request,) = [r for r in service.stats["bodies"] if "a great film" in json.dumps(r)]
    schema = request["response_format"]["json_schema"]["schema"]
    assert schema["required"] == [
        "author", "label", "flag", "tiny", "small", "n", "big", "ratio", "score", "price",
        "day", "at", "local", "raw", "tags", "items", "counts", "note_null",
    ]  # fmt: skip
    assert schema["properties"]["price"] == {"type": ["number", "null"]}
    assert schema["properties"]["author"]["properties"]["badges"] == {
        "type": ["array", "null"],
        "items": {"type": ["string", "null"]},
    }
    assert schema["properties"]["local"]["format"] == "date-time"
    assert "pattern" in schema["properties"]["local"]
    assert "pattern" not in schema["properties"]["at"]
    assert request["response_format"]["json_schema"]["strict"] is False  # a map


SCHEMA = pa.schema([
    pa.field("label", pa.string(), nullable=False),
    pa.field("tiny", pa.int8()),
    pa.field("price", pa.decimal128(5, 2)),
    pa.field("day", pa.date32()),
    pa.field("local", pa.timestamp("us")),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("author", pa.struct([pa.field("name", pa.string()), pa.field("karma", pa.int32())])),
])  # fmt: skip

GOOD: dict[str, Any] = {
    "label": "positive", "tiny": 3, "price": 12.5, "day": "2024-01-02",
    "local": "2024-01-02T03:04:05", "tags": ["a", None], "author": {"name": None, "karma": 2},
}  # fmt: skip


async def _answer(service: OpenAIServiceThread, answer: dict[str, Any] | str) -> Any:
    lookup = ChatLookup(service.url, "local", prompt="{text}")
    lookup.bind_output_columns(SCHEMA.names)
    lookup.bind_output_schema(SCHEMA)
    text = answer if isinstance(answer, str) else json.dumps(answer)
    async with lookup:
        return await lookup.async_invoke({"text": f"<<reply:{text}>>"})


@pytest.mark.asyncio
async def test_a_conforming_answer_is_typed_with_its_nulls(service: OpenAIServiceThread) -> None:
    extra = {**GOOD, "unasked": 1}  # a field not declared is left out, as from_json does
    assert await _answer(service, extra) == [{
        "label": "positive", "tiny": 3, "price": Decimal("12.5"), "day": dt.date(2024, 1, 2),
        "local": dt.datetime(2024, 1, 2, 3, 4, 5), "tags": ["a", None],
        "author": {"name": None, "karma": 2},
    }]  # fmt: skip
    nulls = {**GOOD, "tiny": None, "price": None, "day": None, "local": None, "tags": None,
             "author": None}  # fmt: skip
    assert await _answer(service, nulls) == [{"label": "positive", **{
        k: None for k in ("tiny", "price", "day", "local", "tags", "author")}}]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answer", "named"),
    [
        ("{not json", "not the JSON object asked for"),
        ("[1, 2]", "answered a JSON list, not an object"),
        ({k: v for k, v in GOOD.items() if k != "day"}, "lacks the column 'day'"),
        ({**GOOD, "label": None}, "output column 'label': a value (the column is not nullable)"),
        ({**GOOD, "label": 7}, "output column 'label': a string expected, got 7"),
        ({**GOOD, "tiny": 300}, "output column 'tiny': an integer from -128 to 127"),
        ({**GOOD, "tiny": True}, "output column 'tiny': an integer"),
        ({**GOOD, "price": 1.234}, "output column 'price': a number with at most 2 decimal"),
        ({**GOOD, "price": 12345.0}, "output column 'price': a number with at most 2 decimal"),
        ({**GOOD, "day": "yesterday"}, "output column 'day': a date"),
        ({**GOOD, "local": "2024-01-02T03:04:05+02:00"}, "output column 'local'"),
        ({**GOOD, "tags": "a"}, "output column 'tags': an array"),
        ({**GOOD, "tags": ["a", 2]}, "output column 'tags[1]': a string"),
        ({**GOOD, "author": {"name": "x"}}, "lacks the field 'author.karma'"),
        ({**GOOD, "author": {"name": "x", "karma": "many"}}, "output column 'author.karma'"),
    ],
)
async def test_a_non_conforming_answer_names_the_column(
    service: OpenAIServiceThread, answer: dict[str, Any] | str, named: str
) -> None:
    with pytest.raises(LookupDecodeError) as info:
        await _answer(service, answer)
    assert named in str(info.value)


def test_the_json_schema_of_each_type() -> None:
    from asyncio_ops.connectors.openai._schema import AnswerSchema

    schema = AnswerSchema(pa.schema([
        pa.field("b", pa.binary()), pa.field("m", pa.map_(pa.string(), pa.float64())),
        pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]))  # fmt: skip
    assert schema.json_schema == {
        "type": "object", "required": ["b", "m", "at"], "additionalProperties": False,
        "properties": {
            "b": {"type": ["string", "null"], "contentEncoding": "base64"},
            "m": {"type": ["object", "null"],
                  "additionalProperties": {"type": ["number", "null"]}},
            "at": {"type": "string", "format": "date-time"},
        },
    }  # fmt: skip
    raw = base64.b64encode(b"\x00\x01").decode()
    typed = schema.typed(json.dumps({"b": raw, "m": {"x": 1}, "at": "2024-01-02T03:04:05+01:00"}))
    assert typed == {"b": b"\x00\x01", "m": [("x", 1.0)],
                     "at": dt.datetime(2024, 1, 2, 2, 4, 5, tzinfo=dt.UTC)}  # fmt: skip
    with pytest.raises(ConfigurationError, match="output column 'span' of type"):
        AnswerSchema(pa.schema([pa.field("span", pa.duration("us"))]))
