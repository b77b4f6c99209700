"""The lease cycle's bookkeeping of its own handover requests (LeaseCycle._take_overdue), alone."""

from __future__ import annotations

import asyncio
from typing import Any

from efo.config import load_settings
from efo.leases.ledger import CheckpointLedger
from efo.leases.lifecycle import OwnedShard
from efo.leases.model import Lease, TableState, WorkerRow
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


class Requests:
    """What the cycle does with the requests it answers: handed over, or declined in the table."""

    worker_id = "me"

    def __init__(self) -> None:
        self.handed: list[str] = []
        self.declined: list[tuple[str, str | None]] = []

    def hand_over(self, owned: OwnedShard, reason: str) -> None:
        self.handed.append(owned.shard_id)

    async def decline(self, lease: Lease) -> None:
        self.declined.append((lease.shard_id, lease.wanted_by))


def test_a_request_of_a_worker_that_is_stopping_is_declined_and_any_other_honoured() -> None:
    """Found in review: a request written by a worker before its stop began was honoured (the lease
    moved towards a worker that claims nothing, then on to another: twice). One of a worker this
    one has no row of is answered as any other (it may not have read that row yet)."""
    cycle = _cycle(ManualClock(t=5.0))
    requests = Requests()
    claims = Claims()
    cycle._owned, cycle._runner, cycle._table = claims, requests, requests  # type: ignore[assignment]
    cycle.view.saw_workers(
        {name: WorkerRow(name, 1, None, leaving=name == "stopping") for name in ("me", "asker", "stopping")},
        issued_at=5.0,
        answered_at=5.0,
        complete=True,
    )
    asked = {"s1": "asker", "s2": "stopping", "s3": "stopped"}
    readable = []
    for shard_id, asker in asked.items():
        lease = Lease(shard_id, (), "me", 2, Position("TRIM_HORIZON"), wanted_by=asker)
        claims[shard_id] = OwnedShard(lease, CheckpointLedger(lease.checkpoint), "me")
        readable.append(lease)
    asyncio.run(cycle._apply_requests(readable, target=0))
    assert requests.handed == ["s1", "s3"]
    assert requests.declined == [("s2", "stopping")]
