"""What ``efo run`` checks before it changes anything in the account.

A start registers the consumer if it is missing (billed per shard-hour from then on, read or not)
and creates the lease table if it is missing. Everything that can refuse the start without a change
is asked first, read-only: each stream (exists, not being deleted), its consumer (a given ARN
registered; a name registered, or room under the limit for one more), the table (reachable, keyed
as efo's, its rows of this application written for this stream and in this layout). The sink and
Spark are checked by the driver between this and the changes (sparkbridge/app.py).

:func:`inspect` returns a :class:`Plan`: what the start will change. Should the start then fail
after a change, :meth:`Plan.after_failure` says what was changed and how to undo it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog

from efo.aws import Clients, Endpoints
from efo.config import Settings
from efo.errors import EfoError, ResourceNotFound
from efo.kinesis.registration import (
    CONSUMER_LIMITS,
    CONSUMERS_PER_STREAM,
    StreamInfo,
    describe_consumer,
    describe_stream,
)
from efo.leases.table import LeaseTable
from efo.worker.shardsync import ShardSync

log = structlog.get_logger("efo.preflight")

#: How long the look after a failed start may take (it describes the consumers it was to register).
AFTER_FAILURE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ToRegister:
    """A consumer the start will register: ``name`` on ``stream``."""

    stream: StreamInfo
    name: str


@dataclass
class Plan:
    """What the start will change: the consumers it registers, the table it creates (if any)."""

    register: list[ToRegister] = field(default_factory=list)
    create_table: str | None = None

    def changes(self) -> list[str]:
        found = [f"register consumer {r.name!r} on stream {r.stream.name!r}" for r in self.register]
        return found + ([f"create DynamoDB table {self.create_table!r}"] if self.create_table else [])

    def after_failure(self, settings: Settings, error: EfoError) -> EfoError:
        """``error``, of a start that failed after this plan's changes began, with what it changed and
        how to undo it (the consumers it registered are billed per shard-hour until deregistered)."""
        if not self.register:
            return error
        try:
            registered = asyncio.run(asyncio.wait_for(self._registered(settings), AFTER_FAILURE_TIMEOUT_S))
        except (EfoError, TimeoutError):
            registered = []
        if not registered:
            return error
        undo = "; ".join(
            f"this start registered consumer {r.name!r} on stream {r.stream.name!r}, which is billed per shard-hour "
            f"until 'efo consumers deregister --stream {r.stream.name} --name {r.name} --yes' (a next start uses it)"
            for r in registered
        )
        return type(error)(f"{error}; {undo}", code=error.code)

    async def _registered(self, settings: Settings) -> list[ToRegister]:
        async with Clients(_endpoints(settings)) as clients:
            kinesis = await clients.kinesis()
            found = []
            for planned in self.register:
                if await describe_consumer(kinesis, stream_arn=planned.stream.arn, name=planned.name) is not None:
                    found.append(planned)
            return found


def _endpoints(settings: Settings) -> Endpoints:
    return Endpoints(settings.region, settings.kinesis_endpoint, settings.dynamodb_endpoint)


def inspect(settings: Settings) -> Plan:
    """Check, without changing anything, what can refuse the start; the changes it will make."""
    plan = asyncio.run(_inspect(settings))
    log.info("preflight.checked", streams=settings.stream_names, changes=plan.changes())
    return plan


async def _inspect(settings: Settings) -> Plan:
    plan = Plan()
    async with Clients(_endpoints(settings)) as clients:
        kinesis = await clients.kinesis()
        dynamodb = await clients.dynamodb()
        streams = []
        for each in settings.per_stream():
            stream = await describe_stream(kinesis, each.stream_ref)
            if stream.status == "DELETING":
                raise ResourceNotFound(f"stream {stream.name!r} is being deleted; create it again, or read another")
            await _check_consumer(kinesis, each, stream, plan)
            streams.append((each, stream))
        if not await _table_exists(dynamodb, settings):
            plan.create_table = settings.table_name
            return plan
        for each, stream in streams:
            table = LeaseTable(
                dynamodb, table=each.table_name, app=each.app, stream_arn=stream.arn, worker_id=each.worker_id
            )
            # Refuses rows of an earlier stream of the same name, or of the layout before lease partitions.
            await ShardSync(settings=each, stream=stream, kinesis=kinesis, table=table).check()
    return plan


async def _check_consumer(kinesis: Any, settings: Settings, stream: StreamInfo, plan: Plan) -> None:
    """A consumer ARN must be registered; a consumer name is registered, or will be: then the stream
    must have room for one more (its ConsumerCount, from the description already made)."""
    if settings.consumer_arn:
        if await describe_consumer(kinesis, stream_arn=stream.arn, arn=settings.consumer_arn) is None:
            raise ResourceNotFound(
                f"consumer {settings.consumer_arn!r} is not registered; register one with 'efo consumers register' "
                "or set EFO_CONSUMER_NAME instead of EFO_CONSUMER_ARN to have efo register it"
            )
        return
    name = settings.consumer
    if await describe_consumer(kinesis, stream_arn=stream.arn, name=name) is not None:
        return
    if stream.consumers >= CONSUMERS_PER_STREAM:
        raise EfoError(
            f"stream {stream.name!r} has {stream.consumers} consumers, Kinesis's limit: consumer {name!r} cannot be "
            f"registered; {CONSUMER_LIMITS}"
        )
    plan.register.append(ToRegister(stream, name))


async def _table_exists(dynamodb: Any, settings: Settings) -> bool:
    """Whether the lease table exists (then keyed as efo's, and ACTIVE); False: the start creates it."""
    table = LeaseTable(dynamodb, table=settings.table_name, app=settings.app, stream_arn="", worker_id="preflight")
    try:
        await table.ensure_table(create=False)
    except ResourceNotFound:
        return False
    return True
