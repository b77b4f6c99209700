"""The lease table's faults at start-up, against the local stack's DynamoDB: a fleet starting while
every kind of request is throttled past the SDK's retries waits it out and loses nothing; a table
keyed as something else's is refused, naming the table and what to do."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from efo.devstack.faults import FaultClient
from efo.errors import ConfigError, Retriable
from efo.leases.table import LeaseTable

from .memory_kinesis import MemoryKinesis
from .service import unique
from .test_coordinator import run, running, until, world
from .test_workers import PATIENT

pytestmark = pytest.mark.integration

OPERATIONS = ("PutItem", "UpdateItem", "Query", "GetItem")


def test_two_workers_starting_while_dynamodb_throttles_every_request_kind_wait_it_out_and_lose_nothing(
    local_stack: Any,
) -> None:
    faults = FaultClient(local_stack.dynamodb_endpoint)

    async def scenario() -> None:
        kinesis = MemoryKinesis(4)
        puts = sorted(seq for i in range(4) for seq in kinesis.put(f"shard-{i:03d}", 5))
        async with world(local_stack, kinesis, bootstrap=False, lease=PATIENT) as a:
            b = await a.worker("w2", bootstrap=False)
            for operation in OPERATIONS:  # more than the SDK's own retries of one call
                faults.add(operation=operation, action="error", count=12)
            async with running(a) as stop_a, running(b) as stop_b:
                await until(lambda: not faults.pending(), timeout_s=60, what="every throttle answered")
                await until(lambda: a.coordinator.ready and b.coordinator.ready, timeout_s=60, what="both ready")
                written = lambda: sorted(seq for w in (a, b) for _, seq in w.driver.written)  # noqa: E731
                await until(lambda: written() == puts, timeout_s=30, what="every record, once")
                assert not a.coordinator.liveness.in_doubt and not b.coordinator.liveness.in_doubt
                await stop_b()
                await stop_a()

    try:
        run(scenario())
    finally:
        faults.clear()


def test_a_table_keyed_as_something_else_s_is_refused_naming_it_and_what_to_do(local_stack: Any) -> None:
    async def scenario() -> None:
        name = unique("kcl-like")
        async with world(local_stack, MemoryKinesis(1)) as w:
            await w.ddb.create_table(
                TableName=name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
            )
            table = LeaseTable(w.ddb, table=name, app="app", stream_arn="arn:stream", worker_id="w1")
            with pytest.raises(ConfigError) as refused:
                await table.ensure_table()
            message = str(refused.value)
            assert repr(name) in message and "leaseKey (HASH, S)" in message and "EFO_TABLE" in message

    asyncio.run(scenario())


def test_a_stop_during_a_bootstrap_that_waits_for_another_worker_ends_the_run_at_once(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, bootstrap=False, lease=PATIENT) as a:
            other = await a.other_worker("w-other")  # started the bootstrap, alive, never finishing it
            await other.create_meta(datetime(2026, 1, 1, tzinfo=UTC), "TRIM_HORIZON", datetime.now(UTC))

            async def beating() -> None:
                while True:
                    await other.heartbeat()
                    await asyncio.sleep(0.1)

            beats = asyncio.ensure_future(beating())
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(a.coordinator.run(stop, driver_done))
            await until(lambda: bool(a.coordinator.liveness.landed_at), what="w1's first heartbeat")
            await asyncio.sleep(1.0)  # waiting for w-other's bootstrap
            assert not a.coordinator.cycle.cycles
            stop.set()
            driver_done.set()
            started = time.monotonic()
            await asyncio.wait_for(service, timeout=10)
            assert time.monotonic() - started < 6, "the stop waited for the bootstrap"
            beats.cancel()
            assert (await a.table.read_meta()) is not None and not (await a.table.read_meta()).complete  # type: ignore[union-attr]

    run(scenario())


class FlakyHeartbeats:
    """A heartbeat writer that fails (throttled past the SDK's retries) until ``ok``."""

    def __init__(self, table: LeaseTable) -> None:
        self.worker_id = table.worker_id
        self._table = table
        self.ok = False

    async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
        if not self.ok:
            raise Retriable("ProvisionedThroughputExceededException on DynamoDB table 'app'")
        return await self._table.heartbeat(in_doubt=in_doubt, leaving=leaving)


def test_a_worker_claims_nothing_and_is_not_ready_until_its_first_heartbeat_lands(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=PATIENT) as a:
            flaky: list[FlakyHeartbeats] = []
            b = await a.worker("w2", heartbeats=lambda table: flaky.append(FlakyHeartbeats(table)) or flaky[-1])
            async with running(b) as stop:
                await asyncio.sleep(10 * b.settings.lease.sync_interval_s)
                assert not b.coordinator.owned, "claimed leases with no heartbeat row behind them"
                assert not b.coordinator.ready
                assert "no heartbeat has landed yet" in (b.coordinator.shards_problem() or "")
                flaky[0].ok = True
                await until(lambda: b.coordinator.ready and len(b.coordinator.owned) == 2, what="ready with both")
                await stop()

    run(scenario())
