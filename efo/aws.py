"""aiobotocore clients: the one place that knows endpoints, retries and pools.

Control-plane clients (ListShards, consumers, DynamoDB) use standard retries. The SubscribeToShard
client has botocore's retries off, since the subscription loop paces its own calls (1 per second
per shard, never within 5 s of a success); its events are decoded by efo.kinesis.decoder, not botocore.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import ProfileNotFound
from botocore.session import Session
from botocore.utils import get_environ_proxies

from efo import __version__

# aiobotocore's default pool is 10 connections and it silently stalls beyond; every
# subscription holds one connection for its whole life, so the data-plane pool is sized from
# the owned shards, with headroom for a full split of every shard.
MIN_DATA_CONNECTIONS = 32
SPARE_DATA_CONNECTIONS = 16  # grown before fewer than this many are left


#: Added to the end of botocore's User-Agent on every call, so that an operator can pick efo's calls
#: out in CloudTrail (its ``userAgent`` field). Added, not replacing botocore's own: an
#: ``AWS_SDK_UA_APP_ID`` of yours and the SDK's metadata stay in the header.
USER_AGENT_EXTRA = f"efo/{__version__}"


def data_connections_for(shard_count: int) -> int:
    return max(MIN_DATA_CONNECTIONS, 2 * shard_count + 16)


@dataclass(frozen=True, slots=True)
class Endpoints:
    region: str | None
    kinesis: str | None
    dynamodb: str | None


def dynamodb_config() -> AioConfig:
    """The DynamoDB client's settings (the lease table's calls)."""
    return AioConfig(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=5,
        read_timeout=10,
        max_pool_connections=32,  # the final checkpoints and releases of a stop go out 16 at once
        user_agent_extra=USER_AGENT_EXTRA,
        # Every DynamoDB request is built by efo.leases.table, and the service checks each one again:
        # its ValidationException (a table name of the wrong length or characters, say) is
        # translated to InvalidRequest naming the table like any other error. botocore's walk of
        # each request through the service model before sending is paid by every worker for every
        # shard's checkpoint every few seconds, about a tenth of its client CPU
        # (bench/dynamodb_client.py).
        parameter_validation=False,
    )


def verify_tls(endpoint: str | None) -> bool | None:
    """``verify`` for a client of ``endpoint``: None (the SDK's default: certificates checked against
    AWS_CA_BUNDLE or botocore's bundle) but for a plain ``http://`` endpoint reached without a
    proxy, where no connection is encrypted. There False spares each client the CA bundle's
    reading (about 0.1 s of CPU each at every start, four clients an ``efo run``); through a
    proxy (HTTP_PROXY, not bypassed by NO_PROXY) the proxy's own TLS is checked as before."""
    if endpoint is None or not endpoint.lower().startswith("http://"):
        return None
    return None if get_environ_proxies(endpoint).get("http") else False  # the entry botocore would use


def sdk_region() -> tuple[str | None, str | None]:
    """The region the AWS SDK picks when ``region`` (EFO_REGION) is not set, and where it found it:
    ``AWS_DEFAULT_REGION``, else the profile of the AWS config file. botocore does not read
    ``AWS_REGION``. Reads the environment and local files only: no AWS call."""
    session = Session()
    try:
        region = session.get_config_variable("region")
    except ProfileNotFound as exc:
        return None, f"none: {profile_not_found(exc)}"
    if not region:
        return None, None
    if os.environ.get("AWS_DEFAULT_REGION"):
        return str(region), "AWS_DEFAULT_REGION"
    config_file = os.path.expanduser(str(session.get_config_variable("config_file")))
    return str(region), f"AWS profile in {config_file}"


def profile_not_found(exc: ProfileNotFound) -> str:
    """What to do about ``AWS_PROFILE`` (or ``AWS_DEFAULT_PROFILE``) naming a profile the AWS config
    and credentials files do not have."""
    return (
        f"the AWS profile {exc.kwargs.get('profile')!r} (AWS_PROFILE) is in neither AWS config file "
        "(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE): fix or unset AWS_PROFILE"
    )


class Clients:
    """Owns the clients of one service run; ``close()`` closes them all."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self._session: AioSession = get_session()
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stack.aclose()

    async def kinesis(self) -> Any:
        config = AioConfig(
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=5,
            read_timeout=30,
            user_agent_extra=USER_AGENT_EXTRA,
        )
        return await self._enter("kinesis", self.endpoints.kinesis, config)

    async def dynamodb(self) -> Any:
        return await self._enter("dynamodb", self.endpoints.dynamodb, dynamodb_config())

    def subscriber(self, read_timeout_s: float) -> SubscriberClient:
        """The SubscribeToShard client, sized with the shards it serves (see SubscriberClient)."""
        return SubscriberClient(self, read_timeout_s)

    async def _subscription_client(self, connections: int, read_timeout_s: float) -> Any:
        """A Kinesis client for SubscribeToShard only: no SDK retries, a socket read timeout of
        ``read_timeout_s`` (a silent stream fails and is renewed), ``connections`` in its pool."""
        config = AioConfig(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=read_timeout_s,
            max_pool_connections=connections,
            user_agent_extra=USER_AGENT_EXTRA,
        )
        return await self._enter("kinesis", self.endpoints.kinesis, config)

    async def _enter(self, service: str, endpoint: str | None, config: AioConfig) -> Any:
        client = self._session.create_client(
            service,
            region_name=self.endpoints.region,
            endpoint_url=endpoint,
            config=config,
            verify=verify_tls(endpoint),
        )
        return await self._stack.enter_async_context(client)


class SubscriberClient:
    """What subscriptions call ``subscribe_to_shard`` on. Each subscription holds one connection for
    its whole life, so the connection pool must outgrow the shards read here: ``ensure_room(n)``
    before the n-th shard starts replaces the client with one of twice the room whenever a reshard
    or a rebalance brings more shards than it has. Subscriptions take the newest client at each
    call, so they move over as they renew; the older clients close with the rest at the end."""

    def __init__(self, clients: Clients, read_timeout_s: float) -> None:
        self._clients = clients
        self._read_timeout_s = read_timeout_s
        self._client: Any = None
        self.connections = 0
        self._lock = asyncio.Lock()

    async def ensure_room(self, shards: int) -> None:
        async with self._lock:
            if self._client is not None and shards + SPARE_DATA_CONNECTIONS <= self.connections:
                return
            connections = data_connections_for(shards)
            self._client = await self._clients._subscription_client(connections, self._read_timeout_s)
            self.connections = connections

    async def subscribe_to_shard(self, **kwargs: Any) -> Any:
        if self._client is None:
            await self.ensure_room(1)
        return await self._client.subscribe_to_shard(**kwargs)
