"""A graceful stop whose version write its deadline cuts short: the stop moves the versions of the
partitions it released before it ends, so the others learn of the releases at their next cycle
rather than a cycle or two late, when a fenced claim of a lease they think still held fails."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from efo.coordinator import FINAL_WRITES_TIMEOUT_S
from efo.leases.lifecycle import MIN_RENEW_INTERVAL_S
from efo.sim.dynamodb import Fault
from efo.sim.fleet import APP, TABLE, Fleet, FleetConfig, SimWorker
from efo.sim.invariants import Trace
from efo.sim.kinesis import SUBSCRIPTION_LIFETIME_S
from efo.sim.run import Capture, in_virtual_time

from .running import refuse_subscriptions, sample_unread


def _versions(fleet: Fleet) -> dict[str, int]:
    """The version row's counters: ``p<n>`` for lease partition n, ``members``."""
    row = fleet.db.tables[TABLE].partitions[f"{APP}|{fleet.stream.arn}"].rows["version"].latest()
    assert row is not None and row.item is not None
    return {name: int(value["N"]) for name, value in row.item.items() if name.startswith("p") and "N" in value}


async def _stop_with_its_version_write_held(
    trace: Trace, capture: Capture
) -> tuple[bool, set[str], dict[str, int], dict[str, int]]:
    fleet = Fleet(FleetConfig(shards=8, workers=2, records_per_shard_s=0.5), 11, trace)
    capture.clock = fleet.clock
    try:
        stopping, _ = await fleet.add(2)
        await fleet.clock.sleep(40.0)  # both read their share
        table = stopping.coordinator.table
        released = {f"p{table.partition_of(shard_id)}" for shard_id in stopping.reading()}
        before = _versions(fleet)
        now = fleet.clock.now()
        # Its version writes of the next 5 s (its leave's, cut at LEAVE_TIMEOUT_S, then the releases'
        # move: the stop waits about 1 s for the batch in the sink first) take longer than the stop
        # allows for its final writes; later ones do not.
        control = f"{APP}|{fleet.stream.arn}"
        held = Fault("latency", now, now + 5.0, operation="UpdateItem", key=control, client=stopping.name, extra_s=10.0)
        fleet.db.faults.add(held)
        await fleet.terminate(stopping)
        cut_short = any(f" {stopping.name} " in event and "leases.release_failed" in event for event in trace.events)
        return cut_short, released, before, _versions(fleet)
    finally:
        await fleet.close()


def test_a_stop_whose_version_write_is_cut_short_moves_the_versions_before_it_ends() -> None:
    cut_short, released, before, after = in_virtual_time(_stop_with_its_version_write_held)
    assert cut_short, "the stop's releases ended within its deadline: the test no longer holds their version write"
    assert released, "the stopping worker read some shards"
    assert all(after[name] > before[name] for name in released), (released, before, after)


async def _stop_just_after_a_takeover(trace: Trace, capture: Capture) -> tuple[float, int]:
    """Three workers; one is killed, and a survivor is stopped 1 s after it began reading one of
    the dead worker's shards: the longest any shard then goes unread, and how many times the stop
    read on for its young subscriptions."""
    fleet = Fleet(FleetConfig(shards=6, workers=3, records_per_shard_s=1.0), 3, trace)
    capture.clock = fleet.clock
    unread, sampler = sample_unread(fleet)
    try:
        victim, stopping, _ = await fleet.add(3)
        await fleet.clock.sleep(40.0)  # each reads its share
        held = stopping.reading()
        await fleet.kill(victim)
        for _ in range(200):  # until it reads one of the dead worker's shards
            owned = stopping.coordinator.owned
            if any(owned[shard_id].first_event for shard_id in stopping.reading() - held):
                break
            await fleet.clock.sleep(0.1)
        else:
            raise AssertionError("the survivor took none of the dead worker's shards")
        await fleet.clock.sleep(1.0)
        unread.restart()
        await fleet.terminate(stopping)
        await fleet.clock.sleep(15.0)
        read_on = sum(1 for event in trace.events if f" {stopping.name} " in event and "service.reading_on" in event)
        return unread.longest_until_now(), read_on
    finally:
        sampler.cancel()
        await fleet.close()


def test_a_stop_reads_on_until_kinesis_takes_the_next_owner_s_call() -> None:
    """Kinesis refuses the next owner's SubscribeToShard until 5 s after this worker's last one. A
    worker stopped 1 s after subscribing used to stop reading at once, and the shard went unread
    while the next owner waited out the other 4 s. It reads on (the driver commits what it reads)
    until then, so the next owner's call is taken at once."""
    longest_unread_s, read_on = in_virtual_time(_stop_just_after_a_takeover)
    assert read_on == 1
    assert longest_unread_s < 3.0, longest_unread_s


async def _stop_holding(shards: int, trace: Trace, capture: Capture) -> tuple[int, list[str], dict[str, int]]:
    """One worker reads ``shards`` shards, then stops: how many it read, its warnings about its final
    writes, and its writes during the stop by kind."""
    fleet = Fleet(FleetConfig(shards=shards, workers=1, records_per_shard_s=0.2), 1, trace)
    capture.clock = fleet.clock
    writes: Counter[str] = Counter()
    execute = fleet.db.execute

    def tap(operation: str, request: dict[str, Any], client: str, rng: Any) -> dict[str, Any]:
        if operation == "UpdateItem":
            writes["version" if request["Key"]["sk"]["S"] == "version" else "lease"] += 1  # a mark's key too
        return execute(operation, request, client, rng)

    try:
        (worker,) = await fleet.add(1)
        for _ in range(60):
            await fleet.clock.sleep(1.0)
            if len(worker.reading()) == shards:
                break
        read = len(worker.reading())
        fleet.db.execute = tap  # type: ignore[method-assign]
        await fleet.terminate(worker)
        failed = [event for event in trace.events if "release_failed" in event or "release_incomplete" in event]
        return read, failed, dict(writes)
    finally:
        await fleet.close()


def test_a_worker_holding_two_thousand_leases_releases_every_one_within_the_stop_s_deadline() -> None:
    """Found at the end of a ten-minute run of 4,096 x 64 (the last worker held 2,048 leases): each
    release waited for a move of its partition's version (and its mark) while holding one of the 16
    slots of the final writes, so a stop released about 300 leases a second, the version row and the
    marks written about once for each, and 2,048 did not fit in FINAL_WRITES_TIMEOUT_S. The final
    releases now move each partition's version once, at the end."""
    read, failed, writes = in_virtual_time(lambda trace, capture: _stop_holding(2048, trace, capture))
    assert read == 2048
    assert failed == []
    assert writes["version"] < 100, writes  # the versions and marks: a few writes, not one per lease


async def _finish_with_slow_writes(
    version_extra_s: float, trace: Trace, capture: Capture
) -> tuple[float, bool, set[str]]:
    """One worker with 64 leases stops; from the start of its final writes, its lease writes take
    3 s more and its writes to the control rows ``version_extra_s`` more: how long the final writes
    take (simulated s), whether its heartbeat row is gone, and the versions that did not move."""
    fleet = Fleet(FleetConfig(shards=64, workers=1, records_per_shard_s=0.2), 1, trace)
    capture.clock = fleet.clock
    took: list[float] = []
    try:
        (worker,) = await fleet.add(1)
        await fleet.clock.sleep(20.0)
        coordinator = worker.coordinator
        finish = coordinator._finish
        control = f"{APP}|{fleet.stream.arn}"
        before = _versions(fleet)

        async def slow_finish() -> bool:
            now = fleet.clock.now()
            lease_writes = Fault("latency", now, now + 300, operation="UpdateItem", client=worker.name, extra_s=3.0)
            control_writes = Fault(
                "latency",
                now,
                now + 300,
                operation="UpdateItem",
                key=control,
                client=worker.name,
                extra_s=version_extra_s,
            )
            fleet.db.faults.add(lease_writes)
            fleet.db.faults.add(control_writes)
            try:
                return await finish()
            finally:
                took.append(fleet.clock.now() - now)

        coordinator._finish = slow_finish  # type: ignore[method-assign]
        await fleet.terminate(worker)
        row = fleet.db.tables[TABLE].partitions[control].rows.get(f"worker|{worker.name}")
        gone = row is None or (latest := row.latest()) is None or latest.item is None
        after = _versions(fleet)
        return took[0], gone, {name for name in before if after[name] == before[name]}
    finally:
        await fleet.close()


@pytest.mark.parametrize("version_extra_s", [1.0, 6.0])
def test_a_stop_s_final_writes_end_within_their_deadlines_when_the_table_is_slow(version_extra_s: float) -> None:
    """Found in review: the releases' version write, deferred to the end of table.changing(), was
    awaited after the deadline had cancelled the releases, with no deadline of its own: 22 s of final
    writes where two blocks of FINAL_WRITES_TIMEOUT_S allow 10. Cut short, the versions move with
    the stop's bump_again in the second block, after its heartbeat row is removed (one write to
    another row: with the version moves first, the row stayed when the control rows were slow)."""
    took_s, row_gone, unmoved = in_virtual_time(
        lambda trace, capture: _finish_with_slow_writes(version_extra_s, trace, capture)
    )
    assert took_s <= 2 * FINAL_WRITES_TIMEOUT_S + 0.5, took_s
    assert row_gone
    assert not unmoved, unmoved


async def _stop_as_its_subscriptions_renew(
    trace: Trace, capture: Capture, end_one_before_the_read_on_ends_s: float | None = None
) -> tuple[float, int, int]:
    """Three workers start together; one is killed 9 s before the others' first renewals (Kinesis
    ends a subscription after 5 minutes), and a survivor that took some of its shards is stopped 0.5 s
    before its own renewals: its read-on for those young subscriptions spans them. The
    longest any shard then goes unread, how many subscriptions Kinesis ended while it read on, and
    how many it renewed. With ``end_one_before_the_read_on_ends_s``, Kinesis also ends one more
    subscription that long before the read-on would end after the renewals."""
    random.seed(3)  # the jitter production code draws itself, as efo.sim's runs seed it
    fleet = Fleet(FleetConfig(shards=12, workers=3, records_per_shard_s=1.0), 3, trace)
    capture.clock = fleet.clock
    unread, sampler = sample_unread(fleet)
    try:
        victim, stopping, _ = await fleet.add(3)
        await fleet.clock.sleep(SUBSCRIPTION_LIFETIME_S - 9.0)
        held = stopping.reading()
        owned = stopping.coordinator.owned
        first_at = min(at for at in (owned[shard_id].subscribed_at for shard_id in held) if at is not None)
        renewals = first_at + timedelta(seconds=SUBSCRIPTION_LIFETIME_S)
        await fleet.kill(victim)
        while not any(owned[shard_id].first_event for shard_id in stopping.reading() - held):
            await fleet.clock.sleep(0.1)
        await fleet.clock.sleep((renewals - fleet.clock.wall()).total_seconds() - 0.5)
        young = max(at for at in (owned[shard_id].subscribed_at for shard_id in stopping.reading()) if at is not None)
        read_on_until = young + timedelta(seconds=MIN_RENEW_INTERVAL_S)
        assert read_on_until > renewals + timedelta(seconds=3.0), "no read-on spans its renewals"
        unread.restart()
        stopped = fleet.clock.now()
        late = None
        if end_one_before_the_read_on_ends_s is not None:
            late = asyncio.create_task(
                _end_one_late(fleet, stopping, held, renewals, end_one_before_the_read_on_ends_s)
            )
        await fleet.terminate(stopping)
        await fleet.clock.sleep(15.0)
        assert late is None or late.result() == 1, "no subscription was ended late"
        during = [e for e in trace.events if f" {stopping.name} " in e and float(e.split()[0]) >= stopped]
        ended = sum(1 for e in during if "subscription.renewing" in e)
        renewed = sum(1 for e in during if "subscription.started" in e)
        return unread.longest_until_now(), ended, renewed
    finally:
        sampler.cancel()
        await fleet.close()


async def _end_one_late(fleet: Fleet, worker: SimWorker, held: set[str], renewals: datetime, lead_s: float) -> int:
    """Once ``worker`` renewed the subscriptions of ``held`` (after ``renewals``), Kinesis ends the
    first of them again ``lead_s`` before the youngest is 5 s old."""
    owned = worker.coordinator.owned
    while any((at := owned[shard_id].subscribed_at) is None or at <= renewals for shard_id in held):
        await fleet.clock.sleep(0.01)
    youngest = max(owned[shard_id].subscribed_at or renewals for shard_id in held)
    ends = youngest + timedelta(seconds=MIN_RENEW_INTERVAL_S - lead_s)
    await fleet.clock.sleep((ends - fleet.clock.wall()).total_seconds())
    return fleet.stream.expire_subscriptions(min(held))


def test_a_stop_renews_what_kinesis_ends_while_it_reads_on() -> None:
    """Found in the rolling deploy at 16,384 x 256 (6.75 s unread): every worker of a mass start
    renews its subscriptions together every 5 minutes, and a stop began in the middle of one
    worker's renewals. The ones renewed just before made it read on for 5 s, and the ones Kinesis
    ended meanwhile were not renewed (a stop made no new call): those shards went unread until
    the stop's end and the next owner's call. A subscription that ends while the stop reads on is
    renewed now, and the read-on lasts until that one is 5 s old too."""
    longest_unread_s, ended, renewed = in_virtual_time(_stop_as_its_subscriptions_renew)
    assert ended > 0, "Kinesis ended none of its subscriptions while it read on: the test no longer shows it"
    assert renewed >= ended
    assert longest_unread_s < 3.0, longest_unread_s  # 5.25 s before


def test_a_renewal_under_way_as_the_read_on_would_end_is_read_on_for() -> None:
    """Found in review: a renewal whose call was under way when the read-on ended was cancelled,
    though Kinesis may have taken it, and the release told the next owner of the call before it:
    Kinesis refused the next owner for 3 s (5.25 s unread). A call under way counts as a
    subscription made now: the read-on waits for it and then until it is 5 s old."""
    longest_unread_s, ended, renewed = in_virtual_time(
        lambda trace, capture: _stop_as_its_subscriptions_renew(trace, capture, 0.016)
    )
    assert ended == 5 and renewed == 5, (ended, renewed)
    assert longest_unread_s < 3.0, longest_unread_s  # 5.25 s before


async def _stop_with_one_claim_failing_to_call(trace: Trace, capture: Capture) -> float:
    """One worker on 16 shards: Kinesis ends two of its subscriptions, renews one (young) and keeps
    refusing the other's calls (throttled: it backs off and calls again); it is stopped 1 s later:
    how long it read on."""
    random.seed(2)  # the jitter production code draws itself, as efo.sim's runs seed it
    fleet = Fleet(FleetConfig(shards=16, workers=1, records_per_shard_s=1.0), 2, trace)
    capture.clock = fleet.clock
    try:
        (worker,) = await fleet.add(1)
        await fleet.clock.sleep(60.0)
        failing, renewed = sorted(worker.coordinator.owned)[:2]
        THROTTLED.add(failing)
        fleet.stream.expire_subscriptions(failing)
        fleet.stream.expire_subscriptions(renewed)
        await fleet.clock.sleep(1.0)
        started = fleet.clock.now()
        stop = asyncio.create_task(fleet.terminate(worker))
        while not worker.coordinator.intake_stopped.is_set():
            await fleet.clock.sleep(0.01)
        read_on_s = fleet.clock.now() - started
        await stop
        return read_on_s
    finally:
        THROTTLED.clear()
        await fleet.close()


THROTTLED: set[str] = set()


def test_a_claim_that_keeps_failing_to_call_does_not_hold_the_read_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: a claim backing off after failed calls counted as a call under way, so it
    held every read-on to READ_ON_MAX_S (10 s, against 4 s for the young subscription) while it
    kept calling. Only a call actually under way counts now."""
    refuse_subscriptions(monkeypatch, lambda worker, shard_id: shard_id in THROTTLED)
    assert in_virtual_time(_stop_with_one_claim_failing_to_call) < 6.0


async def _stop_during_a_call_that_fails(trace: Trace, capture: Capture) -> tuple[float, int]:
    """One worker on 16 shards; Kinesis ends one subscription, and its renewal's calls take 0.3 s
    to be refused (throttled); the worker is stopped while the first is under way, nothing else
    young: how long it read on, and how many calls it made for that shard meanwhile."""
    random.seed(2)  # the jitter production code draws itself, as efo.sim's runs seed it
    fleet = Fleet(FleetConfig(shards=16, workers=1, records_per_shard_s=1.0), 2, trace)
    capture.clock = fleet.clock
    try:
        (worker,) = await fleet.add(1)
        await fleet.clock.sleep(60.0)
        failing = min(worker.coordinator.owned)
        claim = worker.coordinator.owned[failing]
        THROTTLED.add(failing)
        fleet.stream.expire_subscriptions(failing)
        while not claim.calling:
            await fleet.clock.sleep(0.01)
        calls = fleet.stream.subscribe_calls
        started = fleet.clock.now()
        stop = asyncio.create_task(fleet.terminate(worker))
        while not worker.coordinator.intake_stopped.is_set():
            await fleet.clock.sleep(0.01)
        read_on_s = fleet.clock.now() - started
        await stop
        return read_on_s, fleet.stream.subscribe_calls - calls
    finally:
        THROTTLED.clear()
        await fleet.close()


def test_a_call_that_fails_during_the_read_on_holds_it_no_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review of 056d9ed: a call under way counted as a subscription made now, and the
    read-on did not look again when that call failed: it waited 5 s for it, while the claim backed
    off and called again. The read-on looks again while a call is under way, and a claim that is
    only waiting to call again is stopped there."""
    refuse_subscriptions(monkeypatch, lambda worker, shard_id: shard_id in THROTTLED, after_s=0.3)
    read_on_s, calls = in_virtual_time(_stop_during_a_call_that_fails)
    assert read_on_s < 1.5, read_on_s  # 5.0 s before
    assert calls == 0, calls  # no call of the stopped claim after the stop began (3 before)
