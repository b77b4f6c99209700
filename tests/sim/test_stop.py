"""A graceful stop whose version write its deadline cuts short: the stop moves the versions of the
partitions it released before it ends, so the others learn of the releases at their next cycle
rather than a cycle or two late, when a fenced claim of a lease they think still held fails."""

from __future__ import annotations

from efo.sim.dynamodb import Fault
from efo.sim.fleet import APP, TABLE, Fleet, FleetConfig
from efo.sim.invariants import Trace
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
        # Its version writes of the next 3 s (the releases' move: the stop waits about 1 s for the
        # batch in the sink first) take longer than the stop allows for its final writes; later ones do not.
        control = f"{APP}|{fleet.stream.arn}"
        held = Fault("latency", now, now + 3.0, operation="UpdateItem", key=control, client=stopping.name, extra_s=10.0)
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
