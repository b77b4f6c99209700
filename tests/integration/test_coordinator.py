"""The coordinator in-process: an in-memory Kinesis, the real lease table on the local stack's
DynamoDB, and a driver task that commits what the handoff holds. Each test is a few seconds: the
shard lifecycle, lease loss and liveness, shutdown, expired shards."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest
from aiobotocore.session import get_session

from efo.config import RunSettings, Settings, load_settings
from efo.coordinator import Coordinator
from efo.devstack.faults import FaultClient
from efo.errors import Retriable, SinkStalled
from efo.kinesis.registration import StreamInfo
from efo.leases.table import LeaseTable
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position
from tests.unit.trust import Trusted

from .memory_kinesis import MemoryDriver, MemoryKinesis
from .service import unique

pytestmark = pytest.mark.integration

STREAM_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/memory"


@dataclass
class World:
    kinesis: MemoryKinesis
    table: LeaseTable
    coordinator: Coordinator
    driver: MemoryDriver
    settings: Settings
    ddb: Any

    async def other_worker(self, worker_id: str) -> LeaseTable:
        return LeaseTable(
            self.ddb, table=self.table.table, app=self.settings.app, stream_arn=STREAM_ARN, worker_id=worker_id
        )

    async def owners(self) -> dict[str, str | None]:
        state = await self.table.read()
        return {lease.shard_id: lease.owner for lease in state.leases.values()}

    def written(self, shard_id: str) -> list[int]:
        return [seq for shard, seq in self.driver.written if shard == shard_id]

    async def worker(
        self, worker_id: str, *, bootstrap: bool = True, heartbeats: Callable[[LeaseTable], Any] | None = None
    ) -> World:
        """Another worker of the same application on the same stream (its own coordinator, pool,
        handoff and driver), as another pod would be; ``heartbeats`` wraps its heartbeat writer."""
        return await _worker(
            self.kinesis, self.ddb, self.settings, worker_id, bootstrap=bootstrap, heartbeats=heartbeats
        )


async def _worker(
    kinesis: MemoryKinesis,
    ddb: Any,
    config: Settings,
    worker_id: str,
    *,
    bootstrap: bool = True,
    heartbeats: Callable[[LeaseTable], Any] | None = None,
) -> World:
    table = LeaseTable(ddb, table=config.table_name, app=config.app, stream_arn=STREAM_ARN, worker_id=worker_id)
    handoff = Handoff()
    coordinator = Coordinator(
        settings=config,
        stream=StreamInfo("memory", STREAM_ARN, datetime(2026, 1, 1, tzinfo=UTC), "ACTIVE", len(kinesis.shards)),
        consumer_arn="arn:consumer",
        kinesis=kinesis,
        subscriber=kinesis,
        table=table,
        pool=PendingPool(10_000, 1 << 26, reserved_records=100, reserved_bytes=1 << 20),
        handoff=handoff,
        heartbeats=heartbeats(table) if heartbeats else None,
    )
    if bootstrap:
        await coordinator.bootstrap()
    return World(kinesis, table, coordinator, MemoryDriver(handoff, coordinator.on_committed), config, ddb)


def _settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "stream": "memory",
        "app": unique("app"),
        "sink": "console",
        "initial_position": "TRIM_HORIZON",
        "shards": {"sync_interval_s": 0.2},
        "checkpoint": {"interval_s": 0.2},
        "lease": {"heartbeat_interval_s": 0.25, "failover_s": 1.0, "sync_interval_s": 0.2},
        "shutdown_timeout_s": 5,
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture(autouse=True)
def _no_efo_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)


@asynccontextmanager
async def world(
    local_stack: Any, kinesis: MemoryKinesis, *, bootstrap: bool = True, **settings: Any
) -> AsyncIterator[World]:
    config = _settings(**settings)
    async with get_session().create_client(
        "dynamodb",
        endpoint_url=local_stack.dynamodb_endpoint,
        region_name=local_stack.region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as ddb:
        await LeaseTable(
            ddb, table=config.table_name, app=config.app, stream_arn=STREAM_ARN, worker_id="w1"
        ).ensure_table()
        yield await _worker(kinesis, ddb, config, "w1", bootstrap=bootstrap)


@asynccontextmanager
async def running(w: World) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Run coordinator and driver; the yielded ``stop()`` stops both as SIGTERM would."""
    stop, driver_done = asyncio.Event(), asyncio.Event()
    service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
    driver = asyncio.ensure_future(w.driver.run())

    async def stop_both() -> None:
        stop.set()
        await asyncio.sleep(0.1)
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
        driver_done.set()
        await asyncio.wait_for(service, 15)

    try:
        yield stop_both
    finally:
        for task in (service, driver):
            task.cancel()
        await asyncio.gather(service, driver, return_exceptions=True)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 60))


# ---- the happy path ----------------------------------------------------------------------------


def test_records_of_a_split_parent_come_before_its_children_and_shard_end_is_written(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        before = kinesis.put("shard-000", 30)
        async with world(local_stack, kinesis) as w:
            async with running(w) as stop:
                children = kinesis.split("shard-000")
                after = {child: kinesis.put(child, 10) for child in children}
                await until(lambda: all(len(w.written(c)) == 10 for c in children), what="the children's records")
                await until(lambda: w.coordinator.owned.keys() == set(children), what="the parent's end")
                await stop()
            assert w.written("shard-000") == before
            state = await w.table.read()
            assert state.leases["shard-000"].checkpoint == SHARD_END
            assert all(w.written(c) == after[c] for c in children)
            assert await w.owners() == {"shard-000": None, **dict.fromkeys(children)}

    run(scenario())


# ---- 3: shutdown -------------------------------------------------------------------------------


def test_a_shard_that_appears_as_the_stop_begins_is_not_claimed_and_the_stop_releases_everything(
    local_stack: Any,
) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis) as w:
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            await until(lambda: "shard-000" in w.coordinator.owned, what="the first claim")
            stop.set()
            kinesis.add_shard("shard-001")  # the sync would see it during the drain
            await asyncio.sleep(1.0)  # several sync intervals while the driver drains
            driver_done.set()
            await asyncio.wait_for(service, 10)
            owners = await w.owners()
            assert owners["shard-000"] is None and owners.get("shard-001") is None, owners
            assert not w.coordinator.owned

    run(scenario())


def test_the_stop_checkpoints_what_the_driver_committed_during_the_drain(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        written = kinesis.put("shard-000", 20)
        async with world(local_stack, kinesis, checkpoint={"interval_s": 30}) as w:
            w.driver.hold = True
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            driver = asyncio.ensure_future(w.driver.run())
            await until(lambda: len(w.driver.held) > 0 and sum(len(c) for c in w.driver.held) == 20)
            stop.set()
            await asyncio.sleep(0.2)
            driver.cancel()
            w.driver.release_held()  # the batch in the sink commits during the drain
            driver_done.set()
            await asyncio.wait_for(service, 10)
            state = await w.table.read()
            assert state.leases["shard-000"].checkpoint.sequence_number == str(written[-1])
            assert state.leases["shard-000"].owner is None

    run(scenario())


# ---- 2 and 9: leases lost, learned early; re-claims; stale commits -------------------------------


def test_a_lease_taken_by_another_worker_is_dropped_at_the_next_sync_before_any_write_fails(
    local_stack: Any,
) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis, checkpoint={"interval_s": 60}) as w:
            async with running(w) as stop:
                await until(lambda: "shard-000" in w.coordinator.owned)
                other = await w.other_worker("w2")
                await other.heartbeat()  # a worker claims only once its heartbeat row is there
                lease = (await other.read()).leases["shard-000"]
                await other.claim(lease)  # w2 took it (say w1 looked dead to it)
                await until(lambda: "shard-000" not in w.coordinator.owned, timeout_s=2, what="the loss")
                calls = len(kinesis.subscribe_calls)
                await asyncio.sleep(0.5)
                assert len(kinesis.subscribe_calls) == calls, "kept subscribing to a shard it no longer owns"
                await stop()
            assert (await w.owners())["shard-000"] == "w2"

    run(scenario())


def test_a_late_commit_of_an_earlier_claim_does_not_move_the_re_claimed_shards_checkpoint(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        first = kinesis.put("shard-000", 10)
        async with world(local_stack, kinesis) as w, running(w) as stop:
            await until(lambda: len(w.written("shard-000")) == 10)
            await until(
                lambda: (w.coordinator.owned["shard-000"].ledger.written.sequence_number or "") == str(first[-1])
            )
            w.driver.hold = True  # the sink stalls: the next chunks are handed on, not committed
            kinesis.put("shard-000", 10)
            await until(lambda: sum(len(c) for c in w.driver.held) == 10, what="chunks of claim 1 in the sink")
            old_epoch = w.coordinator.owned["shard-000"].epoch
            # A failover and back: w2 takes the lease and releases it; w1 claims it again.
            other = await w.other_worker("w2")
            await other.release(await other.claim((await other.read()).leases["shard-000"]))
            await until(
                lambda: "shard-000" in w.coordinator.owned and w.coordinator.owned["shard-000"].epoch > old_epoch + 1,
                what="the re-claim",
            )
            late = list(w.driver.held)
            w.driver.held.clear()
            third = kinesis.put("shard-000", 10)
            await until(lambda: sum(len(c) for c in w.driver.held) >= 10, what="claim 2's chunks")
            w.driver.commit(late)  # claim 1's chunks reach the sink's commit only now
            await asyncio.sleep(0.5)
            checkpoint = (await w.table.read()).leases["shard-000"].checkpoint
            assert checkpoint.sequence_number is not None
            assert int(checkpoint.sequence_number) < third[0], f"checkpoint {checkpoint} passed uncommitted records"
            w.driver.hold = False
            w.driver.release_held()
            await until(lambda: set(third) <= set(w.written("shard-000")))
            await stop()

    run(scenario())


def test_a_worker_whose_leases_went_into_doubt_before_its_first_events_is_not_ready_with_none(
    local_stack: Any,
) -> None:
    """Found by the 256-shard test on a loaded machine: the claims delayed the heartbeat past its
    validity, every shard was dropped, and the worker logged service.ready with 0 shards."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis) as w:
            real = w.table.heartbeat
            beats = 0

            async def heartbeat(*, in_doubt: bool = False, leaving: bool = False) -> bool:
                nonlocal beats
                beats += 1
                if beats > 1:  # the first lands (run() needs it); then DynamoDB is too busy
                    raise Retriable("ThrottlingException on DynamoDB table (injected)")
                return await real(in_doubt=in_doubt, leaving=leaving)

            w.table.heartbeat = heartbeat  # type: ignore[method-assign]

            async def unanswered(**kwargs: Any) -> dict[str, Any]:
                await asyncio.Event().wait()  # no shard delivers its first event before the doubt
                raise AssertionError("unreachable")

            kinesis.subscribe_to_shard = unanswered  # type: ignore[method-assign]
            async with running(w) as stop:
                await until(lambda: w.coordinator.liveness.in_doubt, timeout_s=5, what="leases in doubt")
                await asyncio.sleep(0.5)
                assert not w.coordinator.ready, "ready while holding nothing because its leases are in doubt"
                assert w.coordinator.shards_problem() is not None
                await stop()

    run(scenario())


def test_a_worker_whose_heartbeats_fail_drops_its_shards_before_others_may_take_them_and_claims_again(
    local_stack: Any,
) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis) as w, running(w) as stop:
            await until(lambda: len(w.coordinator.owned) == 2)
            real = w.table.heartbeat
            failing = True

            async def heartbeat(*, in_doubt: bool = False, leaving: bool = False) -> bool:
                if failing:
                    raise Retriable("ThrottlingException on DynamoDB table (injected)")
                return await real(in_doubt=in_doubt, leaving=leaving)

            w.table.heartbeat = heartbeat  # type: ignore[method-assign]
            started = asyncio.get_running_loop().time()
            await until(lambda: not w.coordinator.owned, timeout_s=3, what="shards dropped")
            dropped_after_s = asyncio.get_running_loop().time() - started
            assert dropped_after_s < w.settings.lease.failover_s, dropped_after_s
            calls = len(kinesis.subscribe_calls)
            await asyncio.sleep(0.5)
            assert len(kinesis.subscribe_calls) == calls, "claimed again while its heartbeat still failed"
            failing = False
            await until(lambda: len(w.coordinator.owned) == 2, timeout_s=5, what="the re-claim")
            puts = kinesis.put("shard-000", 5)
            await until(lambda: set(puts) <= set(w.written("shard-000")))
            await stop()

    run(scenario())


def test_a_batch_stuck_in_the_sink_stops_the_worker_and_releases_its_leases(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis, batch={"stall_timeout_s": 0.5}) as w:
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            await until(lambda: "shard-000" in w.coordinator.owned)
            w.coordinator.batch_started()  # and never committed
            with pytest.raises(ExceptionGroup) as failed:
                await asyncio.wait_for(service, 5)
            assert failed.group_contains(SinkStalled)
            assert await w.owners() == {"shard-000": None}

    run(scenario())


# ---- 7: expired shards -------------------------------------------------------------------------


def test_a_shard_gone_past_the_retention_is_marked_finished_and_its_children_start(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis) as w:
            children = kinesis.split("shard-000")
            kinesis.unlisted.add("shard-000")  # trimmed: ListShards no longer has it
            puts = {child: kinesis.put(child, 5) for child in children}
            async with running(w) as stop:
                await until(lambda: all(len(w.written(c)) == 5 for c in children), what="the children")
                for _ in range(100):  # confirmed gone by two listings, then marked finished
                    if (await w.table.read()).leases["shard-000"].finished:
                        break
                    await asyncio.sleep(0.05)
                await stop()
            assert w.written("shard-000") == []
            assert (await w.table.read()).leases["shard-000"].checkpoint == SHARD_END
            assert all(w.written(c) == puts[c] for c in children)
            # Its lease may be claimed before a listing shows it gone (the worker that lists is chosen
            # from the table's first read): its one subscription then finds it gone, and ends it.
            assert [call for call in kinesis.subscribe_calls if call[0] == "shard-000"] in (
                [],
                [("shard-000", {"Type": "TRIM_HORIZON"})],
            )

    run(scenario())


def test_a_consumer_deregistered_while_running_stops_the_service_naming_it(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis) as w:
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            await until(lambda: "shard-000" in w.coordinator.owned)
            kinesis.consumer_registered = False
            kinesis.stream_failures["shard-000"] = botocore.exceptions.ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "consumer not found"}}, "SubscribeToShard"
            )
            with pytest.raises(ExceptionGroup) as failed:
                await asyncio.wait_for(service, 5)
            assert "no longer registered" in str(failed.value.exceptions[0])

    run(scenario())


# ---- found in review -----------------------------------------------------------------------------


def test_a_parent_split_before_any_record_ends_and_its_children_are_read(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis) as w:
            children = kinesis.split("shard-000")  # closed with nothing in it: its first event is its end
            puts = {child: kinesis.put(child, 5) for child in children}
            async with running(w) as stop:
                await until(lambda: all(w.written(c) == puts[c] for c in children), what="the children")
                await stop()
            assert (await w.table.read()).leases["shard-000"].checkpoint == SHARD_END

    run(scenario())


def test_the_latest_pin_is_in_the_table_before_the_sink_gets_the_first_record(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis, initial_position="LATEST") as w:
            real = w.table.checkpoint

            async def slow_checkpoint(lease: Any, position: Any, **kwargs: Any) -> Any:
                await asyncio.sleep(0.5)  # DynamoDB slow: a crash in this window must not lose anything
                return await real(lease, position, **kwargs)

            w.table.checkpoint = slow_checkpoint  # type: ignore[method-assign]
            w.driver.hold = True
            async with running(w) as stop:
                await until(lambda: w.coordinator.ready, what="ready")
                kinesis.put("shard-000", 5)
                await until(lambda: bool(w.driver.held), what="the first chunk in the sink")
                pinned = (await w.table.read()).leases["shard-000"].checkpoint
                assert pinned.is_concrete, f"the table still says {pinned} while records are out"
                w.driver.hold = False
                w.driver.release_held()
                await stop()

    run(scenario())


def test_a_lease_another_worker_created_for_a_shard_not_yet_listed_here_is_not_taken_for_expired(
    local_stack: Any,
) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        rarely = {"sync_interval_s": 30}  # this worker's listing of the shards is old
        async with world(local_stack, kinesis, shards=rarely) as w, running(w) as stop:
            await until(lambda: "shard-000" in w.coordinator.owned)
            kinesis.add_shard("shard-001")  # born since this worker's listing ...
            other = await w.other_worker("w2")  # ... and seen by another, which made its lease
            await other.create_lease("shard-001", (), Position("TRIM_HORIZON"))
            puts = kinesis.put("shard-001", 5)
            await until(lambda: w.written("shard-001") == puts, what="the new shard read")
            assert not (await w.table.read()).leases["shard-001"].finished
            await stop()

    run(scenario())


def test_a_throttled_listing_after_a_shard_was_not_found_is_retried_not_fatal(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis) as w, running(w) as stop:
            await until(lambda: "shard-000" in w.coordinator.owned)
            kinesis.list_failures = 2
            kinesis.unlisted.add("shard-000")
            kinesis.stream_failures["shard-000"] = botocore.exceptions.ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "shard gone"}}, "SubscribeToShard"
            )
            await until(lambda: "shard-000" not in w.coordinator.owned, timeout_s=10, what="the shard expired")
            await stop()

    run(scenario())


def test_leases_in_doubt_while_the_stop_releases_them_do_not_crash_the_stop(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis) as w:
            stop, driver_done = asyncio.Event(), asyncio.Event()
            service = asyncio.ensure_future(w.coordinator.run(stop, driver_done))
            await until(lambda: len(w.coordinator.owned) == 2)
            real_release = w.table.release

            async def slow_release(lease: Any, **how: Any) -> None:
                await asyncio.sleep(1.0)  # longer than the lease validity (0.75 s) in these settings
                await real_release(lease, **how)

            async def failing_heartbeat(*, in_doubt: bool = False, leaving: bool = False) -> bool:
                raise Retriable("ThrottlingException on DynamoDB table (injected)")

            w.table.release = slow_release  # type: ignore[method-assign]
            w.table.heartbeat = failing_heartbeat  # type: ignore[method-assign]
            stop.set()
            driver_done.set()
            await asyncio.wait_for(service, 10)  # no IllegalTransition: LOST -> RELEASED

    run(scenario())


# ---- bounded runs (run.until) ------------------------------------------------------------------


async def _bounded_run(w: World, timeout_s: float = 30.0) -> None:
    """Run coordinator and driver until the bounded run ends on its own."""
    stop, driver_done = asyncio.Event(), asyncio.Event()
    driver = asyncio.ensure_future(w.driver.run())
    try:
        await asyncio.wait_for(w.coordinator.run(stop, driver_done), timeout_s)
    finally:
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)


def test_a_bounded_run_that_releases_everything_is_complete(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        puts = {shard: kinesis.put(shard, 5) for shard in list(kinesis.shards)}
        async with world(local_stack, kinesis, run={"until": "caught-up"}) as w:
            await _bounded_run(w)
            assert w.coordinator.completed
            assert not any((await w.owners()).values())
            assert all(w.written(shard) == seqs for shard, seqs in puts.items())

    run(scenario())


def test_a_bounded_run_whose_final_releases_fail_is_not_complete(local_stack: Any) -> None:
    """DynamoDB refuses every final write (past the SDK's retries): the run must not say it is
    complete (exit 0); the leases are left held, so a run started again must wait for them."""
    faults = FaultClient(local_stack.dynamodb_endpoint)

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        for shard in list(kinesis.shards):
            kinesis.put(shard, 5)
        async with world(local_stack, kinesis, run={"until": "caught-up"}) as w:
            drain = w.coordinator._drain

            async def drain_then_fail(stop: asyncio.Event) -> bool:
                drained = await drain(stop)
                faults.add(operation="UpdateItem", action="error", count=10_000)
                return drained

            w.coordinator._drain = drain_then_fail  # type: ignore[method-assign]
            await _bounded_run(w)
            faults.clear()
            assert not w.coordinator.completed, "exit 0 with its final checkpoints and releases failed"
            assert any((await w.owners()).values())

    try:
        run(scenario())
    finally:
        faults.clear()


def test_a_bounded_run_whose_leases_are_in_doubt_at_the_end_is_not_complete(local_stack: Any) -> None:
    """No release can be made while the leases are in doubt: the run is not complete."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        for shard in list(kinesis.shards):
            kinesis.put(shard, 5)
        async with world(local_stack, kinesis, run={"until": "caught-up"}) as w:
            drain = w.coordinator._drain

            async def drain_then_doubt(stop: asyncio.Event) -> bool:
                drained = await drain(stop)
                w.coordinator.runner._trust = Trusted(valid=False)
                return drained

            w.coordinator._drain = drain_then_doubt  # type: ignore[method-assign]
            await _bounded_run(w)
            assert not w.coordinator.completed, "exit 0 with its leases never released"

    run(scenario())


def test_until_a_time_cuts_a_shard_whose_last_event_holds_the_cut_and_its_end_and_loses_nothing(
    local_stack: Any,
) -> None:
    """The parent split after TIME: its one event holds the records before TIME, the first one at
    TIME and its end (ChildShards, no continuation), so the subscription ends in the same step as
    the cut. The parent stays at the cut (AT_SEQUENCE_NUMBER, not SHARD_END), its children are not
    read, the run is complete; a continuous run afterwards reads the parent from the cut, then the
    children: nothing lost, nothing twice."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        before = kinesis.put("shard-000", 5)
        await asyncio.sleep(0.05)
        cut_at = datetime.now(UTC)
        await asyncio.sleep(0.05)
        after = kinesis.put("shard-000", 5)
        children = kinesis.split("shard-000")
        later = {child: kinesis.put(child, 3) for child in children}
        async with world(local_stack, kinesis, run={"until": cut_at.isoformat()}) as w:
            await _bounded_run(w)
            assert w.coordinator.completed
            assert w.driver.written == [("shard-000", seq) for seq in before]
            parent = (await w.table.read()).leases["shard-000"]
            assert parent.checkpoint == Position("AT_SEQUENCE_NUMBER", str(after[0])), parent
            assert not any((await w.owners()).values())

            continuous = await _worker(kinesis, w.ddb, w.settings.model_copy(update={"run": RunSettings()}), "w2")
            async with running(continuous) as stop:
                await until(lambda: continuous.written("shard-000") == after, what="the parent from the cut")
                await until(
                    lambda: all(continuous.written(child) == seqs for child, seqs in later.items()),
                    what="the children after the parent",
                )
                await stop()
            assert not set(continuous.written("shard-000")) & set(before), "read twice"

    run(scenario())


def test_a_bounded_run_that_cannot_end_stops_at_max_duration_s_with_everything_read_checkpointed(
    local_stack: Any,
) -> None:
    """A run that never gets done (here: done() never holds) stops after run.max_duration_s: the sink
    commits what was handed on, checkpoints written, leases released, and it is not complete (75)."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        puts = {shard: kinesis.put(shard, 5) for shard in list(kinesis.shards)}
        async with world(local_stack, kinesis, run={"until": "caught-up", "max_duration_s": 2}) as w:
            assert w.coordinator.bounds is not None
            w.coordinator.bounds.done = lambda: False  # type: ignore[method-assign]
            await _bounded_run(w)
            assert not w.coordinator.completed and w.coordinator.incomplete == "max_duration"
            assert all(w.written(shard) == seqs for shard, seqs in puts.items())
            state = await w.table.read()
            assert not any(lease.owner for lease in state.leases.values()), "a lease was left held"
            for shard, seqs in puts.items():  # at or past its last record (idle events move it on)
                checkpoint = state.leases[shard].checkpoint
                assert checkpoint.kind == "AFTER_SEQUENCE_NUMBER" and int(checkpoint.sequence_number or 0) >= seqs[-1]

    run(scenario())
