"""The lease cycle's bookkeeping of its own handover requests (LeaseCycle._take_overdue), alone."""

from __future__ import annotations

import asyncio
from typing import Any

from efo.config import load_settings
from efo.leases.model import Lease, TableState
from efo.pipeline.records import Position
from efo.sim.clock import ManualClock
from efo.worker.cycle import LeaseCycle
from tests.unit.trust import Trusted


class Table:
    worker_id = "me"


class Owned(dict[str, Any]):
    stream = "s"


def _cycle(clock: ManualClock) -> LeaseCycle:
    return LeaseCycle(
        settings=load_settings(stream="s", app="a", sink="console"),
        table=Table(),  # type: ignore[arg-type]
        owned=Owned(),  # type: ignore[arg-type]
        runner=None,  # type: ignore[arg-type]
        shards=None,  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        trust=Trusted(),
        clock=clock,
    )


def _state(owner: str) -> TableState:
    return TableState(leases={"s1": Lease("s1", (), owner, 2, Position("TRIM_HORIZON"))})


def test_a_request_cleared_by_its_owner_bars_asking_that_owner_and_one_taken_by_a_third_worker_bars_nobody() -> None:
    """Found in review: a request cleared because a third worker claimed the lease was counted as a
    decline by that worker, which was then not asked for failover_s."""
    clock = ManualClock(t=5.0)
    cycle = _cycle(clock)
    cycle.asked = {"s1": (1.0, "w1")}
    asyncio.run(cycle._take_overdue(_state("w1"), asked_now=set()))  # w1 kept it and cleared the request
    assert dict(cycle._memory.declined_by) == {"w1": 5.0 + cycle._settings.lease.failover_s}
    cycle = _cycle(clock)
    cycle.asked = {"s1": (1.0, "w1")}
    asyncio.run(cycle._take_overdue(_state("w3"), asked_now=set()))  # taken by w3 meanwhile
    assert dict(cycle._memory.declined_by) == {} and cycle.asked == {}
