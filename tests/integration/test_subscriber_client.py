"""efo's SubscribeToShard client against a SubscribeToShard server on loopback that answers every
call and keeps every stream open: each subscription holds one connection of the client's pool, so
the pool must grow with the shards read, or the calls past it wait for ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from efo.aws import MIN_DATA_CONNECTIONS, Clients, Endpoints
from efo.devstack.proxy import INITIAL_RESPONSE

from .loopback import serving

pytestmark = pytest.mark.integration

CONSUMER = "arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1"


@asynccontextmanager
async def holding_server() -> AsyncIterator[str]:
    """Answers SubscribeToShard with the initial response, then holds the stream open."""

    closing = asyncio.Event()

    async def subscribe(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/vnd.amazon.eventstream"})
        await response.prepare(request)
        await response.write(INITIAL_RESPONSE)
        await closing.wait()
        return response

    app = web.Application()
    app.router.add_post("/", subscribe)
    async with serving(app) as url:
        try:
            yield url
        finally:
            closing.set()  # the held streams end before the server cleans up


async def _open(client: Any, shards: int) -> list[Any]:
    """Open ``shards`` subscriptions at once; each keeps its connection."""

    async def one(i: int) -> Any:
        response = await client.subscribe_to_shard(
            ConsumerARN=CONSUMER, ShardId=f"shardId-{i:012d}", StartingPosition={"Type": "LATEST"}
        )
        return response["EventStream"]

    return list(await asyncio.gather(*(one(i) for i in range(shards))))


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


def test_the_pool_grows_with_the_shards_so_every_subscription_is_answered() -> None:
    shards = MIN_DATA_CONNECTIONS + 24

    async def scenario() -> None:
        async with holding_server() as endpoint, Clients(Endpoints("us-east-1", endpoint, None)) as clients:
            client = clients.subscriber(read_timeout_s=30)
            await client.ensure_room(1)  # the service started with one shard ...
            first = await _open(client, 1)
            await client.ensure_room(shards)  # ... and a reshard brought the rest
            rest = await asyncio.wait_for(_open(client, shards - 1), 10)
            assert len(first) + len(rest) == shards
            assert client.connections >= shards
            for stream in first + rest:
                stream.close()

    asyncio.run(scenario())


def test_a_call_past_a_full_pool_waits_which_is_why_subscriptions_bound_their_calls() -> None:
    # The stall that ensure_room prevents and that the subscription's bounded call turns into a
    # retriable error (StartTimeout) if it ever happens.
    async def scenario() -> None:
        async with holding_server() as endpoint, Clients(Endpoints("us-east-1", endpoint, None)) as clients:
            client = clients.subscriber(read_timeout_s=30)
            await client.ensure_room(1)
            held = await _open(client, client.connections)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(_open(client, 1), 2)
            for stream in held:
                stream.close()

    asyncio.run(scenario())
