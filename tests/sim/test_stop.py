"""A graceful stop whose version write its deadline cuts short: the stop moves the versions of the
partitions it released before it ends, so the others learn of the releases at their next cycle
rather than a cycle or two late, when a fenced claim of a lease they think still held fails."""

from __future__ import annotations

import asyncio

from efo.sim.dynamodb import Fault
from efo.sim.fleet import APP, TABLE, Fleet, FleetConfig
from efo.sim.invariants import Trace
from efo.sim.phases import POLL_S, Unread
from efo.sim.run import Capture, in_virtual_time


def _versions(fleet: Fleet) -> dict[str, int]:
    """The version row's counters: ``p<n>`` for lease partition n, ``members``."""
    row = fleet.db.tables[TABLE].partitions[f"{APP}|{fleet.stream.arn}"].rows["version"].latest()
    assert row is not None and row.item is not None
    return {name: int(value["N"]) for name, value in row.item.items() if name.startswith("p") and "N" in value}


async def _stop_with_its_version_write_held(trace: Trace, capture: Capture) -> tuple[bool, set[str], dict, dict]:
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
    unread = Unread(fleet)

    async def sample() -> None:
        while True:
            unread.sample()
            await fleet.clock.sleep(POLL_S)

    sampler = asyncio.create_task(sample())
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
