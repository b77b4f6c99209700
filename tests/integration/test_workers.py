"""Several workers on one stream, in-process: two or three coordinators share the in-memory Kinesis
and the real lease table on the local stack's DynamoDB. Balancing, graceful handovers, steal
requests, live resets, only-live-data starts and a concurrent LATEST bootstrap, in seconds each.
(The same, as real ``efo run`` processes on kinesis-local, is in test_workers_processes.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from efo.leases import balance
from efo.leases.lifecycle import MIN_RENEW_INTERVAL_S
from efo.leases.model import TableState
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.records import Position, after
from efo.worker.decision import ASK_AFTER_CYCLES, SETTLE_CYCLES

from .memory_kinesis import MemoryKinesis
from .test_coordinator import World, run, running, until, world

pytestmark = pytest.mark.integration

PATIENT = {"heartbeat_interval_s": 0.25, "failover_s": 6.0, "sync_interval_s": 0.2}
#: A lease handed over counts as given lately for failover_s, and a worker the test plays is live
#: that long after its one heartbeat: both for the whole of a test, however slow the machine.
GIVING = {**PATIENT, "failover_s": 30.0}


def holdings(*workers: World) -> dict[str, int]:
    return {w.table.worker_id: len([o for o in w.coordinator.owned.values() if o.phase.reading]) for w in workers}


def all_written(*workers: World) -> Counter[tuple[str, int]]:
    return Counter(record for w in workers for record in w.driver.written)


async def lease_counters(w: World) -> dict[str, int]:
    """Each lease's counter as the table has it now (it moves once per claim and once per release)."""
    return {lease.shard_id: lease.counter for lease in (await w.table.read()).leases.values()}


def calls_of(table: Any, method: str) -> list[tuple[float, str]]:
    """Record each call of ``table.<method>(lease)`` (its loop time and shard) as it goes on."""
    original, calls = getattr(table, method), []

    async def counting(lease: Any) -> None:
        calls.append((asyncio.get_running_loop().time(), lease.shard_id))
        await original(lease)

    setattr(table, method, counting)
    return calls


def answers_of(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], list[str]]]:
    """Record what :func:`balance.answer_requests` decides (honour, decline) whenever there are requests."""
    original, answers = balance.answer_requests, []

    def recording(requested: Sequence[str], **kwargs: Any) -> tuple[list[str], list[str]]:
        answer = original(requested, **kwargs)
        if requested:
            answers.append(answer)
        return answer

    monkeypatch.setattr(balance, "answer_requests", recording)
    return answers


async def read_until(w: World, condition: Callable[[TableState], bool], what: str) -> TableState:
    """Read the lease table until ``condition`` holds of what was read; that read."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while not condition(state := await w.table.read()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return state


async def shed_one_to(a: World, other: LeaseTable) -> str:
    """``a`` (w1) holds both shards of two; ``other`` (w2, its cycle played by the test) comes alive,
    ``a`` sheds a lease to it once its claims settled, and ``other`` claims it. Returns the shard
    ``a`` keeps: ``a`` now holds its share, and it handed a lease over lately."""
    await until(lambda: holdings(a) == {"w1": 2}, what="w1 alone holds both")
    await other.heartbeat()
    await other.read_version()  # and says so, as a worker's start does: the others read its row
    await other.members_changed(about=[other.worker_id])
    await until(lambda: len(a.coordinator.owned) == 1, what="w1 handing one over to w2")  # released
    (kept,) = a.coordinator.owned
    shed = next(lease for lease in (await other.read()).leases.values() if lease.shard_id != kept)
    assert shed.owner is None, shed
    await other.claim(shed)
    return kept


def free_to_shed_s(worker: Any) -> float:
    """From its claims, until a worker may shed them: they changed hands SETTLE_CYCLES cycles ago,
    and their subscriptions are MIN_RENEW_INTERVAL_S old (a younger one is not shed)."""
    return max((SETTLE_CYCLES + 2) * worker.settings.lease.sync_interval_s, MIN_RENEW_INTERVAL_S + 0.5)


def test_a_second_worker_gets_half_the_shards_within_a_few_cycles_and_then_nothing_moves(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(8)
        puts = [seq for i in range(8) for seq in kinesis.put(f"shard-{i:03d}", 5)]
        async with world(local_stack, kinesis, lease=PATIENT) as a:  # a busy machine must not look like a death
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 alone holds everything")
                alone = await lease_counters(a)
                async with running(b) as stop_b:
                    joined = asyncio.get_running_loop().time()
                    await until(lambda: holdings(a, b) == {"w1": 4, "w2": 4}, timeout_s=10, what="4 and 4")
                    settled_after_s = asyncio.get_running_loop().time() - joined
                    # w1's leases, claimed just now, are not moved for SETTLE_CYCLES (no ping-pong): w2 asks
                    # for one at a time after ASK_AFTER_CYCLES, and w1 sheds the rest once they settled.
                    # Counted in w2's lease cycles, not in wall time: both thresholds are times, but on a
                    # busy machine the cycles run late, and each ask and each shed takes a cycle.
                    cycles = b.coordinator.cycle.cycles
                    assert cycles < SETTLE_CYCLES + ASK_AFTER_CYCLES + 2, (cycles, settled_after_s)
                    counters = await lease_counters(a)
                    moved = Counter(counters[shard_id] - alone[shard_id] for shard_id in alone)
                    assert moved == {0: 4, 2: 4}, f"{moved}: not 4 leases released and claimed once each"
                    more = [seq for i in range(8) for seq in kinesis.put(f"shard-{i:03d}", 5)]
                    await asyncio.sleep(20 * a.settings.lease.sync_interval_s)  # twenty cycles
                    after = await lease_counters(a)
                    assert after == counters, "a lease moved although the shards were balanced"
                    await until(lambda: set(puts + more) <= {seq for _, seq in all_written(a, b)})
                    await stop_b()
                await stop_a()
            written = all_written(a, b)
            assert not [record for record, count in written.items() if count > 1], "a handover duplicated records"

    run(scenario())


def test_a_worker_asked_for_a_lease_in_the_cycle_it_sheds_gives_away_only_its_surplus(local_stack: Any) -> None:
    """The lease handed over on request counts as the asker's when the same cycle decides what
    else to shed: 8 shards, 2 workers, exactly 4 move (not 5, one of them then moving back)."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(8)
        async with world(local_stack, kinesis, lease=PATIENT) as a:  # no lease is overdue here
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 alone holds everything")
                alone = await lease_counters(a)
                await asyncio.sleep(free_to_shed_s(a))
                asked = asyncio.Event()
                cycle = a.coordinator.cycle.cycle

                async def after_the_ask(state: Any) -> None:
                    await asked.wait()  # w1 decides only once w2's request is in the table
                    await cycle(await a.table.read())

                a.coordinator.cycle.cycle = after_the_ask  # type: ignore[method-assign]
                async with running(b) as stop_b:
                    await until(lambda: bool(b.coordinator.cycle.asked), what="w2 asks for a lease")
                    asked.set()
                    await until(lambda: holdings(a, b) == {"w1": 4, "w2": 4}, timeout_s=10, what="4 and 4")
                    await asyncio.sleep(5 * a.settings.lease.sync_interval_s)
                    counters = await lease_counters(a)
                    moved = Counter(counters[shard_id] - alone[shard_id] for shard_id in alone)
                    assert moved == {0: 4, 2: 4}, f"{moved}: not 4 leases released and claimed once each"
                    await stop_b()
                await stop_a()

    run(scenario())


def test_a_worker_that_shed_down_to_its_share_declines_a_request_it_had_not_seen(local_stack: Any) -> None:
    """w1 sheds its surplus in a cycle that read the table just before w2's request landed; the
    next cycle sees the request, but w1 now holds its share and declines it (the request is
    cleared, so w2 does not take the lease either once it is overdue): exactly 4 of 8 move, once."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(8)
        async with world(local_stack, kinesis, lease=PATIENT) as a:
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 alone holds everything")
                alone = await lease_counters(a)
                await asyncio.sleep(free_to_shed_s(a))
                asked = asyncio.Event()
                cycle = a.coordinator.cycle.cycle
                held_back = True

                async def before_the_ask(state: Any) -> None:
                    nonlocal held_back
                    if held_back and "w2" in state.heartbeats:  # w1's first cycle to see w2: it will shed
                        held_back = False
                        await asked.wait()  # ... acting on this read, older than w2's request
                    await cycle(state)

                a.coordinator.cycle.cycle = before_the_ask  # type: ignore[method-assign]
                wanted, declined = calls_of(b.table, "want"), calls_of(a.table, "decline")
                async with running(b) as stop_b:
                    await until(lambda: bool(b.coordinator.cycle.asked), what="w2 asks for a lease")
                    asked.set()
                    await until(lambda: holdings(a, b) == {"w1": 4, "w2": 4}, timeout_s=10, what="4 and 4")
                    # Past failover_s: a request left standing would now be taken by force.
                    await asyncio.sleep(a.settings.lease.failover_s + 5 * a.settings.lease.sync_interval_s)
                    assert holdings(a, b) == {"w1": 4, "w2": 4}
                    counters = await lease_counters(a)
                    moved = Counter(counters[shard_id] - alone[shard_id] for shard_id in alone)
                    assert moved == {0: 4, 2: 4}, f"{moved}: not 4 leases released and claimed once each"
                    assert not b.coordinator.cycle.asked
                    assert len(wanted) == 1 and [shard for _, shard in declined] == [wanted[0][1]]
                    await stop_b()
                await stop_a()

    run(scenario())


def test_a_worker_whose_request_was_declined_asks_nothing_more_for_failover_s(local_stack: Any) -> None:
    """w1 sheds 4 of 8 to w2, but its sink holds their records, so the handovers wait (up to
    failover/2) and w2, seeing w1 still hold 8, asks for another lease; w1 declines it (it just
    shed to its share, and declines for failover_s). w2 then asks nothing more for failover_s: a
    request and its refusal are two writes and a re-read of the partition by every worker."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(8)
        lease = {**PATIENT, "failover_s": 12.0}  # the handovers wait up to 6 s for the sink
        async with world(local_stack, kinesis, lease=lease) as a:
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 alone holds everything")
                await asyncio.sleep(free_to_shed_s(a))
                a.driver.hold = True
                puts = [seq for i in range(8) for seq in kinesis.put(f"shard-{i:03d}", 5)]
                await until(lambda: sum(len(c) for c in a.driver.held) == 40, what="40 records in the sink")
                wanted, declined = calls_of(b.table, "want"), calls_of(a.table, "decline")
                async with running(b) as stop_b:
                    await until(lambda: bool(declined), what="w1 declines w2's request")
                    cycles = b.coordinator.cycle.cycles
                    await until(lambda: b.coordinator.cycle.cycles >= cycles + 4 * ASK_AFTER_CYCLES, what="cycles")
                    assert len(wanted) == 1, f"w2 asked again after the decline: {wanted}"
                    a.driver.hold = False
                    a.driver.release_held()
                    await until(lambda: holdings(a, b) == {"w1": 4, "w2": 4}, timeout_s=15, what="4 and 4")
                    await until(lambda: set(puts) <= {seq for _, seq in all_written(a, b)})
                    await stop_b()
                await stop_a()

    run(scenario())


def test_an_owner_that_gave_nothing_lately_honours_a_request_even_at_its_share(local_stack: Any) -> None:
    """Workers that disagree on the shares (lists of streams differing during a rolling restart)
    move a lease only by asking: w1 holds its share (w2 is not live, so all 8) and handed nothing
    over lately, so it honours the request, and then takes the lease back (free, the asker not live)."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(8)
        async with world(local_stack, kinesis, lease=PATIENT) as a:
            other = await a.other_worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 alone holds everything")
                lease = (await a.table.read()).leases["shard-000"]
                await other.want(lease)
                a.coordinator.cycle.run_now()
                # Released and claimed again: the counter moves twice (too quickly, on an idle
                # machine, for the gap between the two to be seen in the worker's own state).
                for _ in range(500):
                    if (await a.table.read()).leases["shard-000"].counter >= lease.counter + 2:
                        break
                    await asyncio.sleep(0.02)
                back = (await a.table.read()).leases["shard-000"]
                assert (back.owner, back.counter, back.wanted_by) == ("w1", lease.counter + 2, None)
                await until(lambda: holdings(a) == {"w1": 8}, what="w1 reads it again")
                await stop_a()

    run(scenario())


def test_a_worker_that_released_a_stranded_lease_declines_a_request_at_its_share(local_stack: Any) -> None:
    """w1 restarts under the same id and finds both leases of two still its own in the table, as its
    last run left them; w2 (played by the test) is alive, so w1 takes one back and releases the
    other, which counts as handing a lease over, as a shed does. w2 claims it, then asks for the
    other one: w1, at its share and having given lately, declines the request (it is cleared and
    w1 keeps the lease)."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=GIVING) as a:
            last_run = await a.other_worker("w1")
            for lease in (await last_run.read()).leases.values():
                await last_run.claim(lease)  # w1's last run did not release them
            w2 = await a.other_worker("w2")
            await w2.heartbeat()  # alive from w1's first cycle on
            declined = calls_of(a.table, "decline")
            async with running(a) as stop_a:
                state = await read_until(
                    a,
                    lambda state: {lease.owner for lease in state.leases.values()} == {"w1", None},
                    what="w1 taking one lease back and releasing the other",
                )
                (kept,) = (lease.shard_id for lease in state.leases.values() if lease.owner == "w1")
                (released,) = (lease for lease in state.leases.values() if lease.owner is None)
                await until(lambda: holdings(a) == {"w1": 1}, what="w1 reading the lease it took back")
                await w2.claim(released)
                await w2.want((await w2.read()).leases[kept])
                await until(lambda: bool(declined) or holdings(a) != {"w1": 1}, what="w1 answering w2's request")
                assert [shard for _, shard in declined] == [kept], "w1 handed a lease over below its share"
                row = (await a.table.read()).leases[kept]
                assert (row.owner, row.wanted_by) == ("w1", None)
                assert holdings(a) == {"w1": 1}
                await stop_a()

    run(scenario())


def test_a_stopping_worker_declines_no_request_so_its_release_leaves_the_lease_to_the_asker(
    local_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 shed one of its two leases to w2 (played by the test) and holds its share; w2's request
    for the other, written from an older read, is in the read of the cycle w1 is in as its stop
    begins. w1 would decline it (at its share, having given lately), but a stopping worker answers
    no request (the cycle under way is cancelled; the one that watches the ring while the stop reads
    on answers nothing): the request stays through the release, so the asker takes the lease first."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=GIVING) as a:
            w2 = await a.other_worker("w2")
            async with running(a) as stop_a:
                kept = await shed_one_to(a, w2)
                answers, declined = answers_of(monkeypatch), calls_of(a.table, "decline")
                cycle, read = a.coordinator.cycle.cycle, asyncio.Event()

                async def as_the_stop_begins(state: Any) -> None:
                    if state.leases[kept].wanted_by == "w2" and not read.is_set():
                        read.set()
                        await a.coordinator.stopping.wait()  # the stop begins between the read and the answers
                        await cycle(state)
                    else:
                        await cycle(state)

                a.coordinator.cycle.cycle = as_the_stop_begins  # type: ignore[method-assign]
                await w2.want((await w2.read()).leases[kept])
                await until(read.is_set, what="w1's cycle reading the request")
                await stop_a()
                assert not declined, "a stopping worker declined a request"
                assert answers == [], "a stopping worker answered a request"
            row = (await w2.read()).leases[kept]
            assert (row.owner, row.wanted_by) == (None, "w2"), "the release did not keep the request"
            assert (await w2.claim(row)).owner == "w2"

    run(scenario())


def test_a_worker_whose_leases_are_in_doubt_declines_no_request(
    local_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but w1's leases go into doubt (no heartbeat landed for the lease validity) between
    its cycle's read and its answers: it may not write to them, declines nothing, and the request
    stands. (The coordinator also drops every lease as it goes into doubt, so its cycle would find
    nothing to answer; the cycle does not count on that: here only the cycle is told.)"""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=GIVING) as a:
            w2 = await a.other_worker("w2")
            async with running(a) as stop_a:
                kept = await shed_one_to(a, w2)
                answers, declined = answers_of(monkeypatch), calls_of(a.table, "decline")
                cycle, answered, doubt = a.coordinator.cycle.cycle, asyncio.Event(), False
                sure = a.coordinator.cycle._trust

                class DoubtingNow:
                    valid = property(lambda self: sure.valid and not doubt)
                    in_doubt = property(lambda self: doubt or sure.in_doubt)

                a.coordinator.cycle._trust = DoubtingNow()

                async def in_doubt_as_it_answers(state: Any) -> None:
                    nonlocal doubt
                    if state.leases[kept].wanted_by == "w2" and not answered.is_set():
                        doubt = True  # for this cycle's answers, and no cycle runs after it
                        await cycle(state)
                        answered.set()
                    else:
                        await cycle(state)

                a.coordinator.cycle.cycle = in_doubt_as_it_answers  # type: ignore[method-assign]
                wanted = (await w2.read()).leases[kept]
                await w2.want(wanted)
                await until(answered.is_set, what="w1's cycle answering the request")
                assert not declined, "a worker in doubt declined a request"
                assert answers == [([], [kept])], "w1 would not have declined the request"
                row = (await w2.read()).leases[kept]
                assert (row.owner, row.counter, row.wanted_by) == ("w1", wanted.counter, "w2")
                await stop_a()

    run(scenario())


def test_a_handover_waits_for_the_sink_so_the_next_owner_neither_loses_nor_repeats_anything(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=PATIENT) as a:  # a handover waits up to 3 s
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 2})
                a.driver.hold = True  # records of both shards are in the sink when w2 arrives
                puts = [seq for i in range(2) for seq in kinesis.put(f"shard-{i:03d}", 20)]
                await until(lambda: sum(len(c) for c in a.driver.held) == 40, what="40 records in the sink")
                async with running(b) as stop_b:
                    await asyncio.sleep(1.0)  # w1 hands one shard over; it must wait for the sink
                    assert holdings(b) == {"w2": 0}, "taken over before the sink committed what was handed on"
                    a.driver.hold = False
                    a.driver.release_held()
                    await until(lambda: holdings(a, b) == {"w1": 1, "w2": 1}, what="one shard each")
                    more = [seq for i in range(2) for seq in kinesis.put(f"shard-{i:03d}", 10)]
                    await until(lambda: set(puts + more) <= {seq for _, seq in all_written(a, b)})
                    await stop_b()
                await stop_a()
            assert not [r for r, count in all_written(a, b).items() if count > 1], "records read twice"

    run(scenario())


def test_a_handover_sends_the_batch_being_filled_to_the_sink_at_once_instead_of_after_max_wait(
    local_stack: Any,
) -> None:
    """The batch holding the shard's last records would close only a minute after its first one,
    long after the handover's wait (failover/2) ends: the handover closes it at once, so the next
    owner starts after those records and reads none of them twice."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=PATIENT) as a:  # a handover waits up to 3 s
            a.driver.max_wait_s = 60.0
            b = await a.worker("w2")
            async with running(a) as stop_a:
                await until(lambda: holdings(a) == {"w1": 2})
                puts = {shard_id: kinesis.put(shard_id, 20) for shard_id in ("shard-000", "shard-001")}
                handoff, pool = a.driver.handoff, a.coordinator.pool
                await until(
                    lambda: pool.records == 40 and handoff.filling, what="the records in the batch being filled"
                )
                assert not a.driver.written, "the batch closed before max_wait_s"
                async with running(b) as stop_b:
                    await until(lambda: holdings(a, b) == {"w1": 1, "w2": 1}, timeout_s=15, what="one shard each")
                    (handed,) = b.coordinator.owned
                    assert set(puts[handed]) <= set(a.written(handed)), "handed over before its records were committed"
                    await stop_b()
                await stop_a()
            assert not [r for r, count in all_written(a, b).items() if count > 1], "records read twice"

    run(scenario())


def test_a_steal_is_a_request_the_owner_honours_by_handing_the_lease_over(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(2)
        async with world(local_stack, kinesis, lease=PATIENT) as a, running(a) as stop_a:
            await until(lambda: holdings(a) == {"w1": 2})
            b = await a.worker("w2")
            await b.table.heartbeat()  # w2 is alive (its cycle is not running: the test plays it)
            lease = (await b.table.read()).leases["shard-000"]
            await b.table.want(lease)  # what w2's cycle does when w1 will not shed
            await until(lambda: "shard-000" not in a.coordinator.owned, timeout_s=3, what="the handover")
            released = (await a.table.read()).leases["shard-000"]
            assert released.owner is None and released.wanted_by == "w2"
            assert released.counter == lease.counter + 1
            await b.table.heartbeat()
            await asyncio.sleep(0.5)  # nobody but w2 may claim it while w2 lives and its request is fresh
            assert (await a.table.read()).leases["shard-000"].owner is None
            claimed = await b.table.claim((await b.table.read()).leases["shard-000"])
            assert claimed.owner == "w2" and claimed.wanted_by is None
            await stop_a()


def test_a_reset_is_applied_by_the_owner_within_a_cycle_without_a_restart(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        first = kinesis.put("shard-000", 10)
        async with world(local_stack, kinesis) as a:
            async with running(a) as stop:
                await until(lambda: len(a.written("shard-000")) == 10)
                await until(lambda: a.coordinator.owned["shard-000"].ledger.written == after(str(first[-1])))
                epoch = a.coordinator.owned["shard-000"].epoch
                reset_id = await a.table.request_reset(["shard-000"], after(str(first[4])))
                await until(
                    lambda: "shard-000" in a.coordinator.owned and a.coordinator.owned["shard-000"].epoch > epoch,
                    timeout_s=3,
                    what="the reset applied",
                )
                await until(lambda: len(a.written("shard-000")) == 15, what="records 6-10 read again")
                lease = (await a.table.read()).leases["shard-000"]
                assert lease.reset is None and reset_id
                await stop()
            assert a.written("shard-000") == first + first[5:]

    run(scenario())


def test_a_reset_of_every_shard_to_trim_horizon_reads_parents_before_children_again(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        parent = kinesis.put("shard-000", 5)
        async with world(local_stack, kinesis) as a, running(a) as stop:
            children = kinesis.split("shard-000")
            kids = {child: kinesis.put(child, 3) for child in children}
            await until(lambda: all(len(a.written(c)) == 3 for c in children), what="the children")
            state = await a.table.read()
            mark = len(a.driver.written)
            await a.table.request_reset(sorted(state.leases), Position("TRIM_HORIZON"))
            await until(lambda: len(a.driver.written) - mark == 11, timeout_s=10, what="everything read again")
            again = a.driver.written[mark:]
            assert [seq for shard, seq in again if shard == "shard-000"] == parent
            last_parent = max(i for i, (shard, _) in enumerate(again) if shard == "shard-000")
            first_child = min(i for i, (shard, _) in enumerate(again) if shard != "shard-000")
            assert last_parent < first_child, "a child was read before its parent ended"
            assert all([seq for shard, seq in again if shard == c] == kids[c] for c in children)
            await stop()

    run(scenario())


def test_skip_older_than_starts_a_stale_checkpoint_at_now_minus_the_age(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        async with world(local_stack, kinesis, skip_older_than="60") as a:
            lease = (await a.table.read()).leases["shard-000"]
            stale = replace(lease, updated_at=datetime.now(UTC) - timedelta(hours=2))
            start = a.coordinator.runner.start_position(stale)
            assert start.kind == "AT_TIMESTAMP" and start.timestamp is not None
            assert abs((datetime.now(UTC) - start.timestamp).total_seconds() - 60) < 5
            fresh = replace(lease, updated_at=datetime.now(UTC) - timedelta(seconds=10))
            assert a.coordinator.runner.start_position(fresh) == lease.checkpoint
            latest = replace(stale, checkpoint=Position("LATEST"))
            assert a.coordinator.runner.start_position(latest) == Position("LATEST")

    run(scenario())


def test_workers_bootstrapping_at_once_under_latest_agree_on_one_bootstrap(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(6)
        async with world(local_stack, kinesis, initial_position="LATEST", bootstrap=False) as a:
            workers = [a] + [await a.worker(f"w{i}", bootstrap=False) for i in (2, 3)]
            await asyncio.gather(*(w.coordinator.bootstrap() for w in workers))  # at the same moment
            state = await a.table.read()
            assert state.meta is not None and state.meta.initial_position == "LATEST" and state.meta.complete
            assert len(state.leases) == 6
            # LATEST is the moment of the first start, one moment for every shard
            assert {lease.checkpoint for lease in state.leases.values()} == {
                Position("AT_TIMESTAMP", timestamp=state.meta.started_at)
            }
            assert {lease.counter for lease in state.leases.values()} == {0}

    run(scenario())


def _requests(local_stack: Any) -> Counter[str]:
    with urllib.request.urlopen(f"{local_stack.dynamodb_endpoint}/_efo/requests", timeout=5) as response:
        return Counter(json.loads(response.read()))


def test_workers_starting_together_write_the_first_start_s_leases_once_not_once_each(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(40)
        async with world(local_stack, kinesis, bootstrap=False, lease=PATIENT) as a:
            workers = [a] + [await a.worker(f"w{i}", bootstrap=False) for i in (2, 3)]
            before = _requests(local_stack)
            await asyncio.gather(*(w.coordinator.bootstrap() for w in workers))  # at the same moment
            puts = _requests(local_stack)["PutItem"] - before["PutItem"]
            state = await a.table.read()
            assert state.meta is not None and state.meta.complete and len(state.leases) == 40
            # 40 leases, and per worker its registry row and its try at the meta row: not 3 x 40 leases
            assert puts <= 40 + 2 * len(workers), f"{puts} PutItem requests"

    run(scenario())


def test_a_bootstrap_cut_short_is_completed_by_the_next_worker(local_stack: Any) -> None:
    async def scenario() -> None:
        kinesis = MemoryKinesis(4)
        async with world(local_stack, kinesis, initial_position="LATEST", bootstrap=False) as a:
            # A worker died after the meta row and two of four leases (the meta row is marked complete last).
            started = datetime.now(UTC) - timedelta(seconds=30)
            await a.table.create_meta(datetime(2026, 1, 1, tzinfo=UTC), "LATEST", started)
            first_start = Position("AT_TIMESTAMP", timestamp=started)
            await a.table.create_lease("shard-000", (), first_start)
            await a.table.create_lease("shard-001", (), first_start)
            b = await a.worker("w2")  # bootstraps: the meta row is incomplete, so it completes it
            state = await b.table.read()
            assert state.meta is not None and state.meta.complete
            assert sorted(state.leases) == ["shard-000", "shard-001", "shard-002", "shard-003"]
            assert {lease.checkpoint for lease in state.leases.values()} == {first_start}

    run(scenario())


def test_a_latest_lease_handed_over_before_its_first_event_loses_nothing_written_since_the_start(
    local_stack: Any,
) -> None:
    # Under LATEST a lease moved before its first event (start-up rebalancing) must not start from
    # "now" again at its next owner: what was written in between would be skipped.
    async def scenario() -> None:
        kinesis = MemoryKinesis(1)
        kinesis.put("shard-000", 5)  # before the first start: not expected under LATEST
        async with world(local_stack, kinesis, initial_position="LATEST", lease=PATIENT) as a:
            b = await a.worker("w2")
            lease = (await b.table.read()).leases["shard-000"]
            await b.table.claim(lease)  # w2 took it at once ...
            written = kinesis.put("shard-000", 5)  # ... records arrive ...
            claimed = (await b.table.read()).leases["shard-000"]
            await b.table.release(claimed)  # ... and w2 handed it over before any event
            async with running(a) as stop:
                await until(lambda: a.written("shard-000") == written, what="what was written since the start")
                await stop()

    run(scenario())


def test_shards_nobody_may_take_are_reported_unowned(local_stack: Any) -> None:
    """One worker capped at 1 lease, 3 shards: 2 readable shards have no owner (free, not dead)."""

    async def scenario() -> None:
        kinesis = MemoryKinesis(3)
        async with world(local_stack, kinesis, lease={"max_leases_per_worker": 1}) as a, running(a) as stop:
            await until(lambda: holdings(a) == {"w1": 1}, what="w1 at its cap")
            await until(
                lambda: METRICS.registry.get_sample_value("efo_shards_unowned", {"stream": "memory"}) == 2,
                what="2 unowned",
            )
            await stop()

    run(scenario())
