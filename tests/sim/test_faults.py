"""Each fault of efo.sim.faults alone, on a small fleet in simulated time: every invariant holds."""

from __future__ import annotations

import pytest

from efo.sim import faults
from efo.sim.dynamodb import Behaviour
from efo.sim.fleet import FleetConfig
from efo.sim.run import RunConfig
from tests.sim.running import run


@pytest.mark.parametrize("fault", faults.FAULTS)
def test_each_fault_alone_keeps_every_invariant(fault: str, record_property: pytest.RecordProperty) -> None:
    run(
        RunConfig(fleet=FleetConfig(shards=32, workers=4), seed=1, duration_s=120.0, faults=(fault,), drain_s=60.0),
        record_property,
    )


#: Seeds of ``python -m efo.sim seeds`` (64 x 8, three minutes of every fault at random) that once
#: violated an invariant, each with what it found.
FOUND = {
    39: "a death found 12.9 s after it: its two watchers around the ring had just joined",
    152: "free leases unread for 30.7 s: the newcomers watching two dead workers saw them alive",
    203: "counts 7 to 9 after 30 s: a worker far below its share asked one lease at a time, slowly",
    434: "counts 7 to 9 after 30 s: a declined request stopped a worker below its share asking anyone",
    755: "a free lease unread 30.7 s: a stopping worker's row deletion landed unannounced, shares differed",
    882: "read again 12.7 s after a death: a dead worker's watchers had both stopped; claims collided",
    398: "a dead worker's lease unread 12.8 s: its asker had reached its share and left it free",
    873: "a finished shard's lease written again: the lister's read missed its children's partition",
    260: "read again 12.6 s after a death: a stop gave up at once a claim subscribed 0.02 s before",
    365: "a split's children unread 30.6 s: their leases throttled at its end, the lister a stopped worker",
}


@pytest.mark.parametrize("seed", sorted(FOUND))
def test_seeds_that_once_violated_an_invariant_keep_every_invariant(seed: int) -> None:
    fleet = FleetConfig(
        shards=64, workers=8, records_per_shard_s=0.5, dynamodb=Behaviour(stale_read_s=1.0), idle_event_s=5.0
    )
    run(RunConfig(fleet=fleet, seed=seed, duration_s=180.0, faults=faults.parse("all"), drain_s=90.0))
