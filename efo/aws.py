"""aiobotocore sessions and clients: the one place that knows endpoints, retries and pools.

Two sessions: the control plane (ListShards, consumers, DynamoDB) keeps botocore's defaults and
standard retries; the data plane (SubscribeToShard) has botocore's retries off, since the
subscription loop paces its own calls (1 per second per shard, never within 5 s of a success),
and parses timestamps to epoch seconds instead of building a datetime per record.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session

# aiobotocore's default pool is 10 connections and it silently stalls beyond; every
# subscription holds one connection for its whole life, so the data-plane pool is sized from
# the shard count, with headroom for a full split of every shard.
MIN_DATA_CONNECTIONS = 32


def data_connections_for(shard_count: int) -> int:
    return max(MIN_DATA_CONNECTIONS, 2 * shard_count + 16)


def _epoch_seconds(value: Any) -> float:
    return float(value)


@dataclass(frozen=True, slots=True)
class Endpoints:
    region: str | None
    kinesis: str | None
    dynamodb: str | None


class Clients:
    """Owns the clients of one service run; ``close()`` closes them all."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self._control_session: AioSession = get_session()
        self._data_session: AioSession = get_session()
        parser_factory = self._data_session.get_component("response_parser_factory")
        parser_factory.set_parser_defaults(timestamp_parser=_epoch_seconds)
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stack.aclose()

    async def kinesis(self) -> Any:
        config = AioConfig(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=30)
        return await self._enter(self._control_session, "kinesis", self.endpoints.kinesis, config)

    async def dynamodb(self) -> Any:
        config = AioConfig(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10)
        return await self._enter(self._control_session, "dynamodb", self.endpoints.dynamodb, config)

    async def subscriptions(self, shard_count: int, read_timeout_s: float) -> Any:
        """A Kinesis client for SubscribeToShard only: no SDK retries, a socket read timeout of
        ``read_timeout_s`` (a silent stream fails and is renewed), one connection per subscription."""
        config = AioConfig(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=read_timeout_s,
            max_pool_connections=data_connections_for(shard_count),
        )
        return await self._enter(self._data_session, "kinesis", self.endpoints.kinesis, config)

    async def _enter(self, session: AioSession, service: str, endpoint: str | None, config: AioConfig) -> Any:
        client = session.create_client(service, region_name=self.endpoints.region, endpoint_url=endpoint, config=config)
        return await self._stack.enter_async_context(client)
