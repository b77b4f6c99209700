"""The lease cycle's decision to start a lease whose parent its view does not show, against the
simulated DynamoDB: the lister writes a parent's lease, then its child's, in other lease partitions;
this cycle's read may show the child's partition current and the parent's as it was before (an
eventually consistent answer found behind is not used). A parent without a lease counts as finished,
so the child would be read first. A parent the view does not show is read strongly before the claim;
one that really has no lease (gone from the stream, or its finished lease deleted) lets the child start."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

from efo.config import load_settings
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import Lease, TableState
from efo.leases.table import LeaseTable
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run
from efo.worker.cycle import LeaseCycle
from efo.worker.owned import OwnedLeases
from tests.unit.trust import Trusted

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
START = Position("TRIM_HORIZON")


class Runner:
    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, lease: Lease) -> None:
        self.started.append(lease.shard_id)


class Owned(dict[str, Any]):
    stream = "s"


class Shards:
    graph = None


def _apart(table: LeaseTable, prefix: str) -> tuple[str, str]:
    """A parent and a child shard id whose leases are in different lease partitions."""
    names = [f"{prefix}-{n}" for n in range(20)]
    parent = names[0]
    child = next(name for name in names if table.partition_of(name) != table.partition_of(parent))
    return parent, child


async def _cycle_with(db: SimDynamoDB, clock: SimClock) -> tuple[LeaseCycle, LeaseTable, Runner]:
    client = db.client("reader", clock, random.Random(2))
    table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="reader", clock=clock)
    await table.lease_layout()
    runner = Runner()
    cycle = LeaseCycle(
        settings=load_settings(stream="s", app="a", sink="console"),
        table=table,
        owned=Owned(),  # type: ignore[arg-type]
        runner=runner,  # type: ignore[arg-type]
        shards=Shards(),  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        trust=Trusted(),
        clock=clock,
    )
    return cycle, table, runner


def _lister(db: SimDynamoDB, clock: SimClock) -> LeaseTable:
    return LeaseTable(
        db.client("lister", clock, random.Random(3)),
        table="t",
        app="a",
        stream_arn="s",
        worker_id="lister",
        clock=clock,
    )


def _db() -> SimDynamoDB:
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")
    return db


def test_a_child_whose_parent_the_view_does_not_show_waits_for_a_parent_with_an_unfinished_lease() -> None:
    db = _db()

    async def scenario() -> tuple[list[str], set[int], int]:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        cycle, table, runner = await _cycle_with(db, clock)
        parent, child = _apart(table, "shard")
        await lister.create_lease(parent, (), START)
        await lister.create_lease(child, (parent,), START)
        child_lease = await table.read_lease(child)
        assert child_lease is not None
        # the parent's partition answered from before the parent's lease; the child's is current
        cycle.state = TableState(leases={child: child_lease})
        await cycle._claim(child_lease)
        return runner.started, cycle._cache._stale, table.partition_of(parent)

    started, stale, parents_partition = run(scenario())
    assert started == [], "the child started before its parent's lease finished"
    assert parents_partition in stale, "the parent's partition is read again (strongly) at the next cycle"


def test_a_child_whose_parent_has_no_lease_at_all_starts() -> None:
    db = _db()

    async def scenario() -> tuple[list[str], str]:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        cycle, table, runner = await _cycle_with(db, clock)
        parent, child = _apart(table, "gone")
        await lister.create_lease(child, (parent,), START)  # the parent's finished lease was deleted
        child_lease = await table.read_lease(child)
        assert child_lease is not None
        cycle.state = TableState(leases={child: child_lease})
        await cycle._claim(child_lease)
        return runner.started, child

    started, child = run(scenario())
    assert started == [child], "a parent without a lease is finished"


async def _row(table: LeaseTable, shard_id: str) -> Lease:
    lease = await table.read_lease(shard_id)
    assert lease is not None, shard_id
    return lease


class Stopping(Runner):
    async def stop_reading(self, owned: Any) -> None:
        owned.enter(ShardPhase.RELEASING)


async def _reader(db: SimDynamoDB, clock: SimClock, name: str, runner: Any, seed: int) -> tuple[LeaseTable, LeaseCycle]:
    """A worker's table and lease cycle (its claims in an OwnedLeases), once the meta row is written."""
    table = LeaseTable(
        db.client(name, clock, random.Random(seed)), table="t", app="a", stream_arn="s", worker_id=name, clock=clock
    )
    await table.lease_layout()
    cycle = LeaseCycle(
        settings=load_settings(stream="s", app="a", sink="console"),
        table=table,
        owned=OwnedLeases(name, PendingPool(1000, 1 << 20)),
        runner=runner,
        shards=Shards(),  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        trust=Trusted(),
        clock=clock,
    )
    return table, cycle


async def _finished_parent_and_child(lister: LeaseTable, table: LeaseTable, prefix: str) -> tuple[str, str, Lease]:
    """A parent and a child in different lease partitions, the parent finished: its lease returned."""
    parent, child = _apart(table, prefix)
    await lister.create_lease(parent, (), START)
    await lister.create_lease(child, (parent,), START)
    return parent, child, await table.finish(await table.claim(await _row(table, parent)))


async def _held_then_reset(
    cycle: LeaseCycle, table: LeaseTable, lister: LeaseTable, parent: str, child: str
) -> tuple[OwnedShard, Lease]:
    """``cycle``'s worker reads the child; the operator then resets both: the claim, and the child's row."""
    held = cycle._owned.own(await table.claim(await _row(table, child)))
    held.enter(ShardPhase.READING)
    await lister.request_reset([parent, child], START)
    return held, await _row(table, child)


def test_a_reset_child_waits_for_its_parent_s_reset_that_this_cycle_did_not_see() -> None:
    """Seen in the suite: a reset of every shard, and a child read again before its parent. The
    operator writes the parent's reset before the child's, but in another partition: this cycle saw
    the child's and not yet the parent's. The child's reset is applied; the parent still looks
    finished here, so it must be read (strongly) before the child starts again."""
    db = _db()

    async def scenario() -> tuple[list[str], Lease | None]:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        runner = Stopping()
        table, cycle = await _reader(db, clock, "reader", runner, 2)
        parent, child, finished = await _finished_parent_and_child(lister, table, "reset")
        held, child_reset = await _held_then_reset(cycle, table, lister, parent, child)
        assert child_reset.reset is not None
        seen = TableState(leases={parent: finished, child: child_reset})  # the parent as before its reset
        await cycle._apply_reset(held, child_reset, seen)
        return runner.started, await table.read_lease(child)

    started, child_row = run(scenario())
    assert started == [], "the child was read again before its parent"
    assert child_row is not None and child_row.owner is None, "released, for whoever claims it once the parent ends"


def test_a_reset_child_released_for_its_parent_is_not_started_by_a_worker_that_has_not_seen_the_parent_s_reset() -> (
    None
):
    """Review of 4c0b70c: the worker holding the child sees its reset, reads the parent strongly (its
    reset pending) and releases the child, with the reset applied: the row has no reset left. Another
    worker whose view of the parent's partition is from before the operator's version write (the
    operator moves every version once, after every row: a reset of a large stream takes a while, or
    the CLI died before it) sees a free child of a finished parent, and ``_claim`` reads the parents of
    a lease without a reset only when the view lacks them: it starts the child before its parent."""
    db = _db()

    async def scenario() -> list[str]:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        table, cycle = await _reader(db, clock, "reader", Stopping(), 2)
        other_runner = Runner()
        other_table, other = await _reader(db, clock, "other", other_runner, 4)
        parent, child, finished = await _finished_parent_and_child(lister, table, "reset")
        held, child_reset = await _held_then_reset(cycle, table, lister, parent, child)
        await cycle._apply_reset(held, child_reset, TableState(leases={parent: finished, child: child_reset}))
        released = await _row(other_table, child)
        assert released.owner is None, "released by the reader, as 4c0b70c's test says"
        # the other worker: the child's partition moved (the release), the parent's read as before
        other.state = TableState(leases={parent: finished, child: released})
        await other._claim(released)
        return other_runner.started

    started = run(scenario())
    assert started == [], "another worker started the reset child before its parent was reset and read again"


def test_a_reset_child_taken_by_another_worker_while_its_parents_are_read_does_not_end_the_lease_cycle() -> None:
    """``_apply_reset`` releases the child (its parent not finished now) without catching LeaseLost:
    a worker that took it meanwhile (an overdue request, or this one thought dead) makes the release
    fail, and LeaseLost is not retriable: ``periodically`` re-raises it, the lease cycle task fails
    and with it the worker's task group."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        table, cycle = await _reader(db, clock, "reader", Stopping(), 2)
        other_table, _ = await _reader(db, clock, "other", Runner(), 4)
        parent, child, finished = await _finished_parent_and_child(lister, table, "taken")
        held, child_reset = await _held_then_reset(cycle, table, lister, parent, child)
        read_lease = table.read_lease

        async def taken_meanwhile(shard_id: str) -> Lease | None:
            if shard_id == parent:
                await other_table.claim(await _row(other_table, child))
            return await read_lease(shard_id)

        table.read_lease = taken_meanwhile  # type: ignore[method-assign]
        await cycle._apply_reset(held, child_reset, TableState(leases={parent: finished, child: child_reset}))
        assert child not in cycle._owned

    run(scenario())


def test_a_finished_child_reset_by_a_worker_that_has_not_seen_its_parent_s_reset_is_not_started() -> None:
    """The same hole without an owner: a finished child and its finished parent are both reset; a
    worker whose view still shows the parent finished (its partition's version not moved yet) applies
    the child's reset itself (an unowned, finished lease) and then claims it, the lease now without a
    reset: its parents must still be read strongly before it is read again."""
    db = _db()

    async def scenario() -> tuple[list[str], bool]:
        clock = SimClock()
        lister = _lister(db, clock)
        await lister.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        runner = Runner()
        table, cycle = await _reader(db, clock, "reader", runner, 2)
        parent, child, finished_parent = await _finished_parent_and_child(lister, table, "finished")
        await table.finish(await table.claim(await _row(table, child)))
        await lister.request_reset([parent, child], START)
        state = TableState(leases={parent: finished_parent, child: await _row(table, child)})
        cycle.view.saw_leases(state.leases, answered_at=clock.now())  # as the cycle's read
        await cycle._apply_resets(state)  # the child's reset, applied here; the parent's unseen
        cycle.state = state
        await cycle._claim(state.leases[child])
        row = await _row(table, child)
        return runner.started, row.parents_unchecked

    started, unchecked = run(scenario())
    assert started == [], "the reset child was started before its parent was read again"
    assert unchecked, "the reset child keeps its parents to be checked by whoever claims it"
