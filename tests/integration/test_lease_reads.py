"""What a worker reads of the lease table, against the local stack's DynamoDB: the version moves
with every change of a lease but its checkpoint, a claim starts from the row as it is (never from
an older read), and workers at steady state read the heartbeats and the version, not the leases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from efo.errors import LeaseLost
from efo.leases.codec import MEMBER_CHANGE_SLOTS
from efo.leases.model import MemberChange
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.records import SHARD_END, Position, after

from .memory_kinesis import MemoryKinesis
from .test_coordinator import run, running, until, world

pytestmark = pytest.mark.integration


def _reads(rows: str) -> float:
    return METRICS.lease_reads.labels(stream="memory", rows=rows)._value.get()


def test_every_change_of_a_lease_but_its_checkpoint_moves_the_version(local_stack: Any) -> None:
    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(2)) as w:
            table, other = w.table, await w.other_worker("w2")

            async def version() -> int:
                return sum((await table.read_control()).versions.values())

            before = await version()
            lease = await table.claim((await table.read()).leases["shard-000"])
            assert await version() == before + 1, "a claim"
            lease = await table.checkpoint(lease, after("5"))
            await table.heartbeat()
            assert await version() == before + 1, "a checkpoint or a heartbeat moves nothing"
            await other.want(lease)
            assert await version() == before + 2, "a handover request"
            await table.decline((await table.read()).leases["shard-000"])
            assert await version() == before + 3, "a request declined"
            await other.want(lease)
            await table.release((await table.read()).leases["shard-000"])
            assert await version() == before + 5, "a release"
            lease = await other.claim((await other.read()).leases["shard-000"])
            await other.finish(lease)
            assert await version() == before + 7, "a claim and SHARD_END"
            await table.request_reset(["shard-001"], Position("TRIM_HORIZON"))
            assert await version() == before + 8, "an operator's reset"
            await table.create_lease("shard-new", (), Position("TRIM_HORIZON"))
            assert await version() == before + 9, "a new lease"

    run(scenario())


def test_the_version_row_names_the_stopping_workers_until_their_stop_or_a_reap_strikes_them_off(
    local_stack: Any,
) -> None:
    """A stopping worker is named on the version row, which every cycle reads, so that the others
    count no share for it at once; the move of the membership counter that ends its stop (or a
    reap of it, or its own start again) strikes it off. DynamoDB keeps no empty string set."""

    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(2)) as w:
            table, other = w.table, await w.other_worker("w2")
            await table.members_changed(not_leaving=["nobody"])  # every start strikes its name: no set yet
            members = (await table.read_control()).members
            assert (await table.read_control()).leaving == frozenset()
            await table.leaving()
            await other.leaving()
            await other.leaving()  # a set: named once
            control = await table.read_control()
            assert control.leaving == {table.worker_id, "w2"} and control.members == members
            await table.members_changed(not_leaving=["w2", "never-named"])
            control = await table.read_control()
            assert control.leaving == {table.worker_id} and control.members == members + 1
            await other.members_changed(not_leaving=[table.worker_id])
            control = await table.read_control()
            assert control.leaving == frozenset() and control.members == members + 2
            assert (await table.read()).leaving == frozenset()

    run(scenario())


def test_a_move_of_the_membership_counter_names_its_workers_unless_others_moved_it_since_its_writer_read_it(
    local_stack: Any,
) -> None:
    """The version row names the workers each of the last MEMBER_CHANGE_SLOTS moves was about, so a
    reader a few moves behind reads those heartbeat rows alone. The naming write is conditional on
    the counter as its writer last read it: beaten by a move or two, it is tried again on the counter
    DynamoDB returns with the failure; by more (a mass start), the counter moves unnamed (its readers
    read every row). A stop's own move says so. The oldest name gives way to the newest."""

    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(2)) as w:
            table, other = w.table, await w.other_worker("w2")
            members = (await table.read_version()).members
            await other.read_version()
            await table.members_changed(about=["w3", "w4"])
            control = await other.read_version()
            assert control.members == members + 1 and control.member_changes[members + 1].about == {"w3", "w4"}
            await table.members_changed(about=["w5"])  # its own move since its read: named
            await other.members_changed(not_leaving=["w9"], about=["w6"])  # one move behind: named again
            control = await table.read_version()
            assert control.members == members + 3
            assert control.member_changes[members + 2].about == {"w5"}
            assert control.member_changes[members + 3].about == {"w6"}
            for name in ("w7", "w8", "w9"):
                await table.members_changed(about=[name])
            await other.members_changed(about=["w10"])  # three moves behind: unnamed
            control = await table.read_version()
            assert control.members == members + 7 and members + 7 not in control.member_changes
            await table.members_changed(not_leaving=[table.worker_id], about=[table.worker_id], stopped=True)
            control = await other.read_version()
            assert control.member_changes[members + 8] == MemberChange(
                frozenset({table.worker_id}), frozenset({table.worker_id})
            )
            for n in range(MEMBER_CHANGE_SLOTS):
                await table.members_changed(about=[f"x{n}"])
            control = await other.read_version()
            assert control.members == members + 8 + MEMBER_CHANGE_SLOTS
            assert {n: change.about for n, change in control.member_changes.items()} == {
                members + 9 + n: {f"x{n}"} for n in range(MEMBER_CHANGE_SLOTS)
            }

    run(scenario())


def test_a_declined_request_is_cleared_and_the_owner_keeps_the_lease_fenced_as_read(local_stack: Any) -> None:
    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(2)) as w:
            table, other = w.table, await w.other_worker("w2")
            lease = await table.claim((await table.read()).leases["shard-000"])
            await other.want(lease)
            asked = (await table.read()).leases["shard-000"]
            assert asked.wanted_by == "w2"
            await table.decline(asked)
            declined = (await other.read()).leases["shard-000"]
            assert (declined.owner, declined.counter, declined.wanted_by) == (table.worker_id, lease.counter, None)
            with pytest.raises(LeaseLost):  # the request read is not there any more
                await table.decline(asked)
            with pytest.raises(LeaseLost):  # nor can the asker take it as overdue from that read
                await other.claim(asked)
            await other.want(declined)
            await table.release((await table.read()).leases["shard-000"])
            with pytest.raises(LeaseLost):  # the owner as read gave it up
                await table.decline(asked)
            assert (await other.read()).leases["shard-000"].wanted_by == "w2", "a release keeps the request"

    run(scenario())


def test_changes_inside_changing_move_each_partition_s_version_once(local_stack: Any) -> None:
    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(4)) as w:
            state = await w.table.read()
            async with w.table.changing():
                for lease in state.leases.values():
                    await w.table.claim(lease)
            after = (await w.table.read_control()).versions
            assert after == {partition: version + 1 for partition, version in state.versions.items()}
            assert len(after) > 1, "4 leases in one partition: the test shows nothing"

    run(scenario())


def test_a_claim_starts_from_the_checkpoint_in_the_row_not_from_an_older_read(local_stack: Any) -> None:
    """Checkpoints move no version, so a worker's last read of the leases may hold an older one."""

    async def scenario() -> None:
        async with world(local_stack, MemoryKinesis(1)) as w:
            dead: LeaseTable = await w.other_worker("w-dead")
            held = await dead.claim((await dead.read()).leases["shard-000"])
            seen_by_w1 = (await w.table.read()).leases["shard-000"]  # the checkpoint as of now
            await dead.checkpoint(held, after("42"))  # later: moves no version
            claimed = await w.table.claim(seen_by_w1)
            assert claimed.checkpoint == after("42")
            assert claimed.owner == "w1" and claimed.counter == seen_by_w1.counter + 1

    run(scenario())


def test_two_balanced_workers_read_the_leases_only_when_something_changed(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(6)
        for i in range(6):
            kinesis.put(f"shard-{i:03d}", 3)
        lease = {"heartbeat_interval_s": 0.25, "failover_s": 6.0, "sync_interval_s": 0.1}
        async with world(local_stack, kinesis, lease=lease) as a:
            b = await a.worker("w2")
            async with running(a) as stop_a, running(b) as stop_b:
                held = lambda: sorted(len(w.coordinator.owned) for w in (a, b))  # noqa: E731
                await until(lambda: held() == [3, 3], timeout_s=15, what="3 and 3")
                await asyncio.sleep(2.0)  # handovers done, checkpoints of the first records written
                control, leases = _reads("control"), _reads("leases")
                await asyncio.sleep(3.0)  # 30 cycles each at 0.1 s
                assert _reads("control") - control >= 20  # both workers together, a busy machine
                assert _reads("leases") - leases <= 2, "lease rows read without a change"
                # A change is read at once: a split ends the parent (SHARD_END) and adds two leases.
                children = kinesis.split("shard-000")
                owned = lambda: {sid for w in (a, b) for sid in w.coordinator.owned}  # noqa: E731
                await until(lambda: set(children) <= owned(), timeout_s=15, what="both children read")
                assert _reads("leases") > leases
                await stop_b()
                await stop_a()
            assert (await a.table.read()).leases["shard-000"].checkpoint == SHARD_END

    run(scenario())
