"""The lease cycle's bookkeeping of its own handover requests (LeaseCycle._take_overdue), alone."""

from __future__ import annotations

import asyncio
from typing import Any

from efo.config import load_settings
from efo.leases.ledger import CheckpointLedger
from efo.leases.lifecycle import OwnedShard
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


class Claims(dict[str, Any]):
    """The claims held here (OwnedLeases), and those found lost."""

    stream = "s"

    def __init__(self) -> None:
        super().__init__()
        self.lost: list[str] = []

    def lose(self, owned: Any, reason: str) -> None:
        self.lost.append(owned.shard_id)


def test_a_read_older_than_this_worker_s_claim_does_not_make_the_claim_lost() -> None:
    """Found by the simulation (a rolling deploy of 128 shards on 8 workers, seed 23): a worker
    stopped a second after a claim; its stop's cycle read that lease partition eventually consistent
    (the strong re-read its own change asked for was consumed by the cycle the stop cancelled), found
    the row from before the claim (no owner, the counter one lower) and dropped the claim: the shard
    went unread 5.25 s (goal 5). Counters only grow: a lower one is an old answer, not a loss."""
    cycle = _cycle(ManualClock(t=5.0))
    claims = Claims()
    cycle._owned = claims  # type: ignore[assignment]
    lease = Lease("s1", (), "me", 3, Position("TRIM_HORIZON"))
    claims["s1"] = OwnedShard(lease, CheckpointLedger(lease.checkpoint), "me")
    cycle._check_owned(TableState(leases={"s1": Lease("s1", (), None, 2, Position("TRIM_HORIZON"))}))
    assert claims.lost == []
    cycle._check_owned(TableState(leases={"s1": Lease("s1", (), "w2", 4, Position("TRIM_HORIZON"))}))
    assert claims.lost == ["s1"]
