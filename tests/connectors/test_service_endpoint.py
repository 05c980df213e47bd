"""``CallsService``: each connector names the service it calls, without credentials, the
same for every lookup on that service (``capacity="auto"`` keeps a worker's learned
limit per service), and None where the service is not known before a row is."""

from __future__ import annotations

from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.redis import RedisLookup

from asyncio_ops import CallsService


def test_an_http_lookup_names_its_origin() -> None:
    a = HttpLookup("http://user:secret@127.0.0.1:8080/customers/{customer_id}")
    b = HttpLookup("http://127.0.0.1:8080/orders?id={id}")
    assert isinstance(a, CallsService)
    assert a.service_endpoint() == b.service_endpoint() == "http http://127.0.0.1:8080"
    assert HttpLookup("https://api.test/v1/{id}").service_endpoint() == "http https://api.test:443"
    assert HttpLookup("http://{host}:8080/x/{id}").service_endpoint() is None


def test_a_database_a_model_and_a_redis_server_are_named_without_credentials() -> None:
    dsn = "postgresql://app:secret@db.test:5432/shop"
    pg = PostgresLookup(dsn, "SELECT id, name FROM customers WHERE id = ANY($1)",
                        key="k", on="id")  # fmt: skip
    same_db = PostgresLookup(dsn, "SELECT id, tier FROM customers WHERE id = ANY($1)",
                             key="k", on="id")  # fmt: skip
    assert pg.service_endpoint() == same_db.service_endpoint()
    assert "db.test" in pg.service_endpoint() and "secret" not in pg.service_endpoint()
    chat = ChatLookup("http://127.0.0.1:8000/v1", "small", prompt="Classify: {text}")
    embed = EmbeddingLookup("http://127.0.0.1:8000/v1", "small", input="{text}")
    other = ChatLookup("http://127.0.0.1:8000/v1", "large", prompt="Classify: {text}")
    assert chat.service_endpoint() == embed.service_endpoint() != other.service_endpoint()
    redis = RedisLookup("redis://:secret@127.0.0.1:6379/0", key="k")
    assert "127.0.0.1:6379" in redis.service_endpoint()
    assert "secret" not in redis.service_endpoint()
