"""Two workers dying a few seconds apart: every shard of each is read again within failover_s + 2 s.

Found by a review of issue 37's oracle: when the first death is found, the second dead worker still
counts as a member (its heartbeat is not old enough yet), so its part of the first death's leases
stays free while every survivor is at the ceiling, until the second death is found.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from efo.sim.fleet import Fleet, FleetConfig
from efo.sim.invariants import Trace, Violation
from efo.sim.run import Capture, in_virtual_time, monitor, produce

SHARDS, WORKERS = 56, 8  # an even share: every survivor of one death is at the ceiling


def _two_deaths(apart_s: float, seed: int = 1) -> list[float]:
    """Kill the first live worker after a minute of traffic, then the fourth ``apart_s`` later; the
    takeovers (s from each death to its last shard read again), or the oracle's violation."""

    async def main(trace: Trace, capture: Capture) -> list[float]:
        random.seed(seed)
        fleet = Fleet(FleetConfig(shards=SHARDS, workers=WORKERS), seed, trace)
        capture.clock = fleet.clock
        tasks: list[asyncio.Task[None]] = []
        try:
            await fleet.add(WORKERS)
            tasks += [asyncio.create_task(produce(fleet)), asyncio.create_task(monitor(fleet, fleet.oracle))]
            await fleet.clock.sleep(60.0)
            live = fleet.live()
            await fleet.kill(live[0])
            await fleet.clock.sleep(apart_s)
            await fleet.kill(live[3])
            for _ in range(40):
                await fleet.clock.sleep(1.0)
                if fleet.oracle.violation is not None:
                    raise fleet.oracle.violation
            return list(fleet.oracle.takeovers)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await fleet.close()

    return in_virtual_time(main)


@pytest.mark.parametrize("apart_s", [1.0, 3.0, 5.0, 7.0, 9.0])
def test_two_deaths_a_few_seconds_apart_are_both_taken_over_within_failover_plus_two_seconds(apart_s: float) -> None:
    try:
        takeovers = _two_deaths(apart_s)
    except Violation as violation:
        raise AssertionError(violation.report()) from None
    assert len(takeovers) == 2 and max(takeovers) <= 12.0, takeovers
