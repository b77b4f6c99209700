"""The lease partitions' layout, against the simulated DynamoDB: each lease partition's mark (which
tells an eventually consistent answer from before a change, efo.leases.cache)."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

from efo.leases import admin
from efo.leases.codec import MARK_KEY, VERSION_KEY
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


class Recording:
    """A DynamoDB client that notes the row of every UpdateItem."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.updates: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **request: Any) -> Any:
        self.updates.append((request["Key"]["pk"]["S"], request["Key"]["sk"]["S"]))
        return await self._client.update_item(**request)


def _db() -> SimDynamoDB:
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")
    return db


def test_a_change_moves_its_version_then_sets_its_partition_s_mark_to_it_and_a_read_returns_the_marks() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = Recording(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("s0", (), Position("TRIM_HORIZON"))
        home = table.partition_of("s0")
        mark = (table.lease_partition_key(home), MARK_KEY)
        version = (table.partition, VERSION_KEY)
        assert client.updates == [version, mark]
        client.updates.clear()
        await table.claim((await table.read()).leases["s0"])
        assert client.updates == [(table.lease_partition_key(home), "shard|s0"), version, mark]
        read = await table.read_leases()
        assert read.versions == {p: (2 if p == home else 0) for p in range(8)}
        assert set(read.leases) == {"s0"}, "the mark is no lease"
        assert (await table.read_version()).versions == {home: 2}

    run(scenario())


class FailingVersion(Recording):
    """Its next ``fail`` writes of the version row are throttled (before they reach the table)."""

    fail = 0

    async def update_item(self, **request: Any) -> Any:
        if request["Key"]["sk"]["S"] == VERSION_KEY and "#" not in request["Key"]["pk"]["S"] and self.fail:
            self.fail -= 1
            error = {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}
            raise botocore.exceptions.ClientError(error, "UpdateItem")  # type: ignore[arg-type]
        return await super().update_item(**request)


async def _mark_and_version(table: LeaseTable, partition: int) -> tuple[int, int]:
    mark = (await table.read_leases([partition])).versions[partition]
    return mark, (await table.read_version()).versions.get(partition, 0)


def test_a_version_write_tried_again_leaves_the_mark_no_further_than_the_version() -> None:
    """A mark ahead of its version vouches for changes an answer does not hold: one ahead, an
    eventually consistent answer that misses the next change shows a mark equal to that change's
    version and is used, so the change (a release, a handover request) goes unseen until the safety
    net. A throttled version write, moved again at the next cycle, must not move the mark twice."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = FailingVersion(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("s0", (), Position("TRIM_HORIZON"))
        home = table.partition_of("s0")
        client.fail = 1
        await table.claim((await table.read()).leases["s0"])  # its version write throttled
        await table.bump_again()
        mark, version = await _mark_and_version(table, home)
        assert version == 2
        assert mark <= version, "the mark ran ahead of the version"

    run(scenario())


def test_a_version_moved_without_its_mark_is_caught_up_by_the_next_change() -> None:
    """A worker of the release before marks (a rolling deploy), or a table that predates them, moves
    the version alone: its answers then look behind and are read strongly. The next change by a
    worker that writes marks brings the mark level again, so that this costs a while, not forever."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = db.client("w", clock, random.Random(2))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("s0", (), Position("TRIM_HORIZON"))
        home = table.partition_of("s0")
        await client.update_item(  # what a worker before marks wrote after its change
            TableName="t",
            Key={"pk": {"S": table.partition}, "sk": {"S": VERSION_KEY}},
            UpdateExpression=f"ADD p{home} :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
        mark, version = await _mark_and_version(table, home)
        assert mark < version
        await table.claim((await table.read()).leases["s0"])
        assert await _mark_and_version(table, home) == (3, 3)

    run(scenario())


class FailingDelete(Recording):
    """Its ``fail_at``-th DeleteItem fails (an outage), once."""

    fail_at = 0
    deletes = 0

    async def delete_item(self, **request: Any) -> Any:
        self.deletes += 1
        if self.deletes == self.fail_at:
            error = {"Error": {"Code": "InternalServerError", "Message": "try again"}}
            raise botocore.exceptions.ClientError(error, "DeleteItem")  # type: ignore[arg-type]
        return await self._client.delete_item(**request)


def test_a_removal_cut_short_and_run_again_leaves_no_lease_and_no_mark() -> None:
    """A mark left from before a removal would stand ahead of the versions that start again from
    nothing (vouching for changes its answers do not hold), and a lease left would come back: run
    again after an outage, the removal finds every lease partition still."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = FailingDelete(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        for n in range(4):
            await table.create_lease(f"s{n}", (), Position("TRIM_HORIZON"))
        client.fail_at = 4  # of 4 leases, their marks, and the meta and version rows
        try:
            await admin.delete_all(table)
        except Exception:
            pass
        else:
            raise AssertionError("the removal did not fail")
        await admin.delete_all(table)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        left = await table.read_leases()
        assert left.leases == {}
        assert set(left.versions.values()) == {0}

    run(scenario())


def test_releases_under_way_together_move_the_version_once_together_not_once_each() -> None:
    """A stop releases every lease at once, and each release moved the version row on its own: one
    write of the control key a lease (317 to 390 write units in a second in a rolling deploy at
    1,024 shards). A version write carries every change that landed before it starts, so the
    releases that land while one is under way move it together in the next; and still each release
    returns only once its partition's version (and mark) moved past it."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = Recording(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        shards = [f"s{n}" for n in range(16)]
        async with table.changing():
            for shard_id in shards:
                await table.create_lease(shard_id, (), Position("TRIM_HORIZON"))
        async with table.changing():
            held = [await table.claim(lease) for lease in (await table.read()).leases.values()]
        before = (await table.read_version()).versions
        client.updates.clear()

        async def release(lease: Any) -> None:
            await table.release(lease)
            home = table.partition_of(lease.shard_id)
            mark, version = await _mark_and_version(table, home)
            assert version > before[home], f"{lease.shard_id}'s release returned before its version moved"
            assert mark > before[home], f"{lease.shard_id}'s release returned before its mark moved"

        await asyncio.gather(*(release(lease) for lease in held))
        version_writes = client.updates.count((table.partition, VERSION_KEY))
        assert version_writes <= 16 // 4, f"{version_writes} version writes for 16 releases under way together"
        touched = {table.partition_of(shard_id) for shard_id in shards}
        after = (await table.read_version()).versions
        assert all(after[p] > before[p] for p in touched)

    run(scenario())


def test_changes_cut_short_by_a_cancellation_still_move_their_versions_unless_left_to_bump_again() -> None:
    """An operator's Ctrl-C cancels the CLI's task inside table.changing(): its resets and new leases
    must still be announced (nothing calls bump_again after it). Only a stop's final releases leave
    a cut-short move to bump_again, so that no write outlives their deadline."""

    async def scenario(cut_short_to_bump_again: bool) -> tuple[bool, bool]:
        db, clock = _db(), SimClock()
        table = LeaseTable(
            db.client("w", clock, random.Random(2)), table="t", app="a", stream_arn="s", worker_id="w", clock=clock
        )
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        before = (await table.read_version()).versions
        written = asyncio.Event()

        async def change() -> None:
            async with table.changing(cut_short_to_bump_again=cut_short_to_bump_again):
                await table.create_lease("c0", (), Position("TRIM_HORIZON"))
                written.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.create_task(change())
        await written.wait()
        home = table.partition_of("c0")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        moved = (await table.read_version()).versions.get(home, 0) > before.get(home, 0)
        await table.bump_again()
        return moved, (await table.read_version()).versions.get(home, 0) > before.get(home, 0)

    assert run(scenario(False)) == (True, True)
    assert run(scenario(True)) == (False, True)


def test_a_release_tells_the_next_owner_when_its_shard_was_last_subscribed_to() -> None:
    """Kinesis takes the next owner's SubscribeToShard 5 s after the last one that succeeded: the
    released lease says when that was, so the next owner calls then, neither sooner nor later."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        table = LeaseTable(db.client("w", clock, random.Random(2)), table="t", app="a", stream_arn="s", worker_id="w")
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("s0", (), Position("TRIM_HORIZON"))
        held = await table.claim((await table.read()).leases["s0"])
        assert held.subscribed_at is None
        await table.release(held, subscribed_at=NOW)
        other = LeaseTable(db.client("v", clock, random.Random(3)), table="t", app="a", stream_arn="s", worker_id="v")
        taken = await other.claim((await other.read()).leases["s0"])
        assert taken.owner == "v" and taken.subscribed_at == NOW

    run(scenario())


class HangingVersion(Recording):
    """Once ``passing`` is set, that many more writes of the version row pass and the next hangs (a
    slow DynamoDB); ``hung`` is the task that made it."""

    def __init__(self, client: Any, clock: SimClock) -> None:
        super().__init__(client)
        self._clock = clock
        self.passing: int | None = None
        self.hung: asyncio.Task[Any] | None = None

    async def update_item(self, **request: Any) -> Any:
        version_row = request["Key"]["sk"]["S"] == VERSION_KEY and "#" not in request["Key"]["pk"]["S"]
        if version_row and self.passing is not None:
            if self.passing == 0:
                self.hung = asyncio.current_task()
                await self._clock.sleep(3600)
            self.passing -= 1
        return await super().update_item(**request)


def test_a_version_write_cancelled_under_way_leaves_the_changes_it_carried_to_be_moved_again() -> None:
    """A version write carries the changes of other releases waiting for it; a stop's deadline may
    cancel the task making it. Those changes must not be dropped with it: the next cycle moves them."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = HangingVersion(db.client("w", clock, random.Random(2)), clock)
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        shards = [f"s{n}" for n in range(16)]
        async with table.changing():
            for shard_id in shards:
                await table.create_lease(shard_id, (), Position("TRIM_HORIZON"))
        async with table.changing():
            held = [await table.claim(lease) for lease in (await table.read()).leases.values()]
        before = (await table.read_version()).versions
        client.passing = 1  # the releases' first version write passes, the second (carrying the rest) hangs
        releases = [asyncio.ensure_future(table.release(lease)) for lease in held]
        await clock.sleep(1)
        assert client.hung is not None, "no version write hung"
        client.hung.cancel()
        await asyncio.gather(*releases, return_exceptions=True)
        await table.bump_again()  # the next lease cycle
        after = (await table.read_version()).versions
        unmoved = sorted(p for p in {table.partition_of(s) for s in shards} if after[p] <= before[p])
        assert not unmoved, f"the releases in partitions {unmoved} were never told to the other workers"

    run(scenario())


class GatedVersion(Recording):
    """Once ``gate`` is set, the next write of the version row waits for it to open."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.gate: asyncio.Event | None = None
        self.held = asyncio.Event()

    async def update_item(self, **request: Any) -> Any:
        version_row = request["Key"]["sk"]["S"] == VERSION_KEY and "#" not in request["Key"]["pk"]["S"]
        if version_row and self.gate is not None:
            gate, self.gate = self.gate, None
            self.held.set()
            await gate.wait()
        return await super().update_item(**request)


def test_a_release_cancelled_while_it_waits_for_the_version_write_under_way_is_still_moved_at_the_next_cycle() -> None:
    """Review of 59ec8aa: a cancelled version write puts its partitions back, but a caller cancelled
    while it waits for that write (a stop's deadline cancels every release at once; a claim lost while
    its subscription writes its children's leases) leaves its partition in _bumps_waiting, which
    bump_again does not look at (it moves only _bumps_failed): the change is told to nobody until some
    other change happens to carry it, or the safety net's full read."""
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = GatedVersion(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        shards = [f"s{n}" for n in range(40)]
        async with table.changing():
            for shard_id in shards:
                await table.create_lease(shard_id, (), Position("TRIM_HORIZON"))
        first, second = shards[0], next(s for s in shards if table.partition_of(s) != table.partition_of(shards[0]))
        async with table.changing():
            held = {lease.shard_id: await table.claim(lease) for lease in (await table.read()).leases.values()}
        before = (await table.read_version()).versions
        gate = client.gate = asyncio.Event()
        writing = asyncio.ensure_future(table.release(held[first]))
        await client.held.wait()  # the first release's version write is under way
        waiting = asyncio.ensure_future(table.release(held[second]))
        await asyncio.sleep(0.01)  # its row written, it waits for the version write
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        gate.set()
        await writing
        await table.bump_again()  # the next lease cycle
        after = (await table.read_version()).versions
        p = table.partition_of(second)
        assert (await table.read_lease(second)).owner is None  # type: ignore[union-attr]
        assert after[p] > before[p], "the cancelled release's partition was never moved"

    run(scenario())
