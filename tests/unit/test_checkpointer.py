"""The checkpointer alone: while checkpoints cannot be written, reading pauses once the
committed-but-unwritten backlog reaches pool.max_uncheckpointed_records, and resumes when a
checkpoint lands."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import replace

import pytest

from efo.config import load_settings
from efo.errors import Retriable
from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.model import Lease, TableState
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position, after
from efo.sim.clock import SimClock
from efo.sim.loop import run as run_virtual
from efo.worker.checkpointer import Checkpointer, SharedBacklog
from efo.worker.cycle import LeaseCycle
from efo.worker.owned import OwnedLeases
from tests.unit.trust import Trusted


class FlakyTable:
    """A lease table whose checkpoint writes fail while ``down``."""

    worker_id = "me"

    def __init__(self) -> None:
        self.down = True
        self.written: list[Position] = []

    async def checkpoint(self, lease: Lease, position: Position, *, lag_ms: int | None = None) -> Lease:
        if self.down:
            raise Retriable("ProvisionedThroughputExceededException on DynamoDB table 'app'")
        self.written.append(position)
        return replace(lease, checkpoint=position)


@pytest.fixture
def coordinator(monkeypatch: pytest.MonkeyPatch) -> tuple[Checkpointer, FlakyTable]:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="app", sink="console", pool={"max_uncheckpointed_records": 100})
    table = FlakyTable()
    pool = PendingPool(1000, 1 << 20)
    checkpointer = Checkpointer(
        table=table,  # type: ignore[arg-type]
        owned=OwnedLeases("me", pool),
        pool=pool,
        settings=settings,
        trust=Trusted(),
    )
    return checkpointer, table


def _shard(checkpointer: Checkpointer, shard_id: str, serials: int) -> OwnedShard:
    owned = checkpointer.owned.own(Lease(shard_id, (), "me", 1, Position("TRIM_HORIZON")))
    for _ in range(serials):
        serial = owned.ledger.next_serial()
        owned.ledger.enqueued(serial, after(str(serial * 10)))
    return owned


def test_reading_pauses_at_the_uncheckpointed_bound_and_resumes_once_checkpoints_land(
    coordinator: tuple[Checkpointer, FlakyTable],
) -> None:
    coord, table = coordinator
    _shard(coord, "shard-a", 3)
    _shard(coord, "shard-b", 3)
    coord.on_committed([Commit("shard-a", 1, 1, 60)])
    assert not coord.pool.paused
    coord.on_committed([Commit("shard-b", 1, 1, 40)])
    assert coord.pool.paused, "100 committed records without a checkpoint reach the bound"

    asyncio.run(coord.flush(force=True))
    assert coord.pool.paused and table.written == []

    table.down = False
    asyncio.run(coord.flush(force=True))
    assert not coord.pool.paused
    assert table.written == [after("10"), after("10")]
    assert all(owned.ledger.uncheckpointed_records == 0 for owned in coord.owned.values())


def test_commits_arriving_during_a_checkpoint_write_stay_counted(coordinator: tuple[Checkpointer, FlakyTable]) -> None:
    coord, table = coordinator
    table.down = False
    owned = _shard(coord, "shard-a", 2)
    coord.on_committed([Commit("shard-a", 1, 1, 30)])
    original = table.checkpoint

    async def slow_checkpoint(lease: Lease, position: Position, *, lag_ms: int | None = None) -> Lease:
        coord.on_committed([Commit("shard-a", 1, 2, 80)])  # lands while the write is in flight
        return await original(lease, position)

    table.checkpoint = slow_checkpoint  # type: ignore[method-assign]
    asyncio.run(coord.flush(force=True))
    assert owned.ledger.uncheckpointed_records == 80
    assert coord.pool.paused is False  # 80 < 100


def test_commits_of_an_earlier_claim_release_their_budget_but_move_nothing(
    coordinator: tuple[Checkpointer, FlakyTable],
) -> None:
    coord, _ = coordinator
    owned = _shard(coord, "shard-a", 2)  # claim 1
    grant = asyncio.run(coord.pool.acquire(5, 50, "shard-a"))
    coord.on_committed([Commit("shard-a", 0, 2, 5, grant)])  # claim 0's serial 2, late
    assert owned.ledger.due is None and owned.ledger.uncheckpointed_records == 0
    assert grant.released and coord.pool.records == 0


def test_the_backlog_bound_counts_every_stream_sharing_the_pool(coordinator: tuple[Checkpointer, FlakyTable]) -> None:
    """Two streams' checkpointers share one pool: one stream whose own backlog is small must not
    resume reading that the other's backlog paused (every coordinator hears of every commit)."""
    alone, table = coordinator
    backlog = SharedBacklog()
    orders, payments = (
        Checkpointer(
            table=table,  # type: ignore[arg-type]
            owned=OwnedLeases("me", alone.pool, stream=stream),
            pool=alone.pool,
            settings=alone._settings,
            trust=Trusted(),
            shared_backlog=backlog,
        )
        for stream in ("", "payments")
    )
    _shard(orders, "shard-a", 3)
    _shard(payments, "shard-a", 3)
    orders.on_committed([Commit("shard-a", 1, 1, 60)])
    payments.on_committed([Commit("shard-a", 1, 1, 40, stream="payments")])
    assert orders.pool.paused, "100 committed records without a checkpoint over both streams reach the bound"
    orders.on_committed([])  # a batch of payments' rows only: orders hears of it with none of its own
    assert orders.pool.paused, "orders resumed reading although the backlog over every stream is at the bound"


def test_the_periodic_flush_comes_at_its_interval_whatever_the_clock_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the fleet simulation: started at 11.284 s, ``last + 5 - now`` reached 0 while
    ``now - last`` was still under 5 (floating point), so the loop woke at once, flushed only what was
    urgent and waited 0 s again, for ever (a busy loop; in virtual time, time stood still)."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="app", sink="console")
    pool = PendingPool(1000, 1 << 20)
    clock = SimClock()
    checkpointer = Checkpointer(
        table=FlakyTable(),  # type: ignore[arg-type]
        owned=OwnedLeases("me", pool),
        pool=pool,
        settings=settings,
        trust=Trusted(),
        clock=clock,
    )
    flushes: list[tuple[float, bool]] = []

    async def flush(*, force: bool) -> None:
        flushes.append((clock.now(), force))
        assert len(flushes) < 100, f"the flush loop spins: {flushes[-3:]}"

    checkpointer.flush = flush  # type: ignore[method-assign]

    async def scenario() -> None:
        task = asyncio.ensure_future(checkpointer.run())
        await asyncio.sleep(12.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run_virtual(scenario(), start_s=11.284)
    assert [force for _, force in flushes] == [True, True]
    assert [round(at - 11.284, 6) for at, _ in flushes] == [5.0, 10.0]


def test_two_writes_of_one_claim_land_in_order_and_count_each_record_once(
    coordinator: tuple[Checkpointer, FlakyTable],
) -> None:
    """Race b of issue 37 (found by the simulation, seed 5 of 'python -m efo.sim seeds --faults all'
    at 64 x 8, 'monotonic'): the periodic flush and a handover wrote one claim's checkpoint at once;
    the older position's write, slower, landed last, and both subtracted their records from the
    ledger. A claim's writes now go one at a time, each of the position due when it starts."""
    coord, table = coordinator
    table.down = False
    owned = _shard(coord, "shard-a", 2)
    coord.on_committed([Commit("shard-a", 1, 1, 30)])
    original = table.checkpoint
    latencies = iter([1.0, 0.1])

    async def jittery(lease: Lease, position: Position, *, lag_ms: int | None = None) -> Lease:
        await asyncio.sleep(next(latencies))
        return await original(lease, position)

    table.checkpoint = jittery  # type: ignore[method-assign]

    async def scenario() -> None:
        first = asyncio.ensure_future(coord.write(owned))  # the flush: after("10"), slow
        await asyncio.sleep(0.01)
        coord.on_committed([Commit("shard-a", 1, 2, 20)])
        await asyncio.gather(first, coord.write(owned))  # the handover: after("20")

    run_virtual(scenario())
    assert table.written[-1] == after("20"), f"the older checkpoint landed last: {table.written}"
    assert owned.ledger.written == after("20")
    assert owned.ledger.uncheckpointed_records == 0


class FinishingTable:
    """A lease table whose SHARD_END write lands, then lets ``between`` run before it returns: the
    version-row write that follows a finish is where the lease cycle may read the finished row."""

    worker_id = "me"

    def __init__(self) -> None:
        self.between: list[Callable[[Lease], None]] = []

    async def finish(self, lease: Lease) -> Lease:
        landed = replace(lease, owner=None, counter=lease.counter + 1, checkpoint=SHARD_END)
        for hook in self.between:
            hook(landed)
        await asyncio.sleep(0)
        return landed


def test_the_cycle_reading_this_worker_s_own_finish_before_the_write_returns_lets_the_shard_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI saw it: the finish landed, the cycle read the row (no owner, counter moved) while the
    finish's version write was under way and took the lease as lost, so the shard never ended
    here: no ``checkpoint.shard_end``, and a bounded run's count of ended shards never heard of it."""
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(stream="s", app="app", sink="console")
    table = FinishingTable()
    pool = PendingPool(1000, 1 << 20)
    ended: list[str] = []
    owned_leases = OwnedLeases("me", pool)
    checkpointer = Checkpointer(
        table=table,  # type: ignore[arg-type]
        owned=owned_leases,
        pool=pool,
        settings=settings,
        trust=Trusted(),
        on_shard_end=lambda owned: ended.append(owned.shard_id),
    )
    cycle = LeaseCycle(
        settings=settings,
        table=table,  # type: ignore[arg-type]
        owned=owned_leases,
        runner=None,  # type: ignore[arg-type]
        shards=None,  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        trust=Trusted(),
        clock=SimClock(),
    )
    table.between.append(lambda landed: cycle._check_owned(TableState(leases={landed.shard_id: landed})))
    owned = _shard(checkpointer, "shard-a", 1)
    owned.enter(ShardPhase.DRAINING)  # its subscription saw SHARD_END
    owned.ledger.ended()
    checkpointer.on_committed([Commit("shard-a", 1, 1, 10)])
    assert owned.ledger.due == SHARD_END

    asyncio.run(checkpointer.flush(force=True))
    assert owned.phase is ShardPhase.ENDED
    assert ended == ["shard-a"]


def _cycle_over(owned_leases: OwnedLeases) -> LeaseCycle:
    return LeaseCycle(
        settings=load_settings(stream="s", app="app", sink="console"),
        table=FinishingTable(),  # type: ignore[arg-type]
        owned=owned_leases,
        runner=None,  # type: ignore[arg-type]
        shards=None,  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        trust=Trusted(),
        clock=SimClock(),
    )


def test_a_release_read_by_the_cycle_before_it_returns_is_still_a_release_not_a_lost_lease() -> None:
    """The same race for a handover (seen in the suite: a handover counted lost, not handed over):
    the release landed (no owner, the counter one on) and the cycle read it before it returned."""
    owned_leases = OwnedLeases("me", PendingPool(1000, 1 << 20))
    owned = owned_leases.own(Lease("shard-a", (), "me", 1, Position("TRIM_HORIZON")))
    owned.enter(ShardPhase.RELEASING)
    released = Lease("shard-a", (), None, 2, after("10"))
    _cycle_over(owned_leases)._check_owned(TableState(leases={"shard-a": released}))
    assert owned.phase is ShardPhase.RELEASING


def test_a_lease_another_worker_took_after_this_one_s_finish_or_release_is_still_lost() -> None:
    """The exception is this claim's own write only: a later claim (the counter moved twice) is lost."""
    for row in (Lease("shard-a", (), None, 3, SHARD_END), Lease("shard-a", (), "other", 2, after("10"))):
        owned_leases = OwnedLeases("me", PendingPool(1000, 1 << 20))
        owned = owned_leases.own(Lease("shard-a", (), "me", 1, Position("TRIM_HORIZON")))
        _cycle_over(owned_leases)._check_owned(TableState(leases={"shard-a": row}))
        assert owned.phase is ShardPhase.LOST, row


def test_a_lease_found_ownerless_one_counter_on_while_this_claim_still_reads_is_lost() -> None:
    """Only a claim that is finishing or releasing can have written that row itself: a reading claim
    that finds it (rows deleted and written again under a live worker, ``reset --delete-all --force``)
    has lost the lease."""
    owned_leases = OwnedLeases("me", PendingPool(1000, 1 << 20))
    owned = owned_leases.own(Lease("shard-a", (), "me", 1, Position("TRIM_HORIZON")))
    owned.enter(ShardPhase.READING)
    _cycle_over(owned_leases)._check_owned(TableState(leases={"shard-a": Lease("shard-a", (), None, 2, after("10"))}))
    assert owned.phase is ShardPhase.LOST
