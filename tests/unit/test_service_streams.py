"""The service's bookkeeping of several streams, alone (no AWS): what a stream that ended leaves
behind in the shared pool's backlog bound and in the other streams' dealing."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest

from efo.config import load_settings
from efo.errors import EfoError
from efo.leases.lifecycle import Commit
from efo.leases.model import Lease
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, after
from efo.service import Service
from efo.worker.checkpointer import Checkpointer, SharedBacklog
from efo.worker.owned import OwnedLeases
from tests.unit.trust import Trusted


class Table:
    worker_id = "me"


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Service:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    settings = load_settings(
        streams="orders,payments", app="app", sink="console", pool={"max_uncheckpointed_records": 100}
    )
    return Service(settings)


def _stream(service: Service, name: str, pool: PendingPool, backlog: SharedBacklog) -> Any:
    """A stream's coordinator, as the service builds it when it reads several: the backlog shared."""
    owned = OwnedLeases("me", pool, stream=name)
    checkpointer = Checkpointer(
        table=Table(),  # type: ignore[arg-type]
        owned=owned,
        pool=pool,
        settings=service.settings,
        trust=Trusted(),
        shared_backlog=backlog,
    )
    return SimpleNamespace(stream=SimpleNamespace(name=name, arn=f"arn:{name}"), checkpointer=checkpointer)


def test_a_stream_that_ended_leaves_the_backlog_bound_and_the_pool_resumes_at_once(service: Service) -> None:
    """A stream whose final checkpoints did not land keeps its ledgers; once it ended they must
    not hold the shared pool paused for the streams still read (nothing else would resume it)."""
    pool = PendingPool(1000, 1 << 20)
    backlog = service._backlog = SharedBacklog()
    orders, payments = _stream(service, "orders", pool, backlog), _stream(service, "payments", pool, backlog)
    coordinators = [orders, payments]
    owned = orders.checkpointer.owned.own(Lease("shard-a", (), "me", 1, Position("TRIM_HORIZON")))
    serial = owned.ledger.next_serial()
    owned.ledger.enqueued(serial, after("10"))
    orders.checkpointer.on_committed([Commit("shard-a", 1, serial, 100, stream="orders")])
    assert pool.paused, "100 committed records without a checkpoint reach the bound"
    service._shares.publish("arn:orders", readable=4, held=2)
    service._ended_stream(orders, coordinators)  # type: ignore[arg-type]
    assert not pool.paused, "the pool stayed paused by a stream that is read no more"
    assert "arn:orders" not in service._shares.held, "an ended stream still counts in the others' room"


class FailsAtItsFirstHeartbeat:
    """A coordinator whose run raises before it reads anything (its first heartbeat refused)."""

    def __init__(self) -> None:
        self.stream = SimpleNamespace(name="s", arn="arn:s")
        self.intake_stopped = asyncio.Event()
        self.checkpointer = SimpleNamespace(apply_backlog_bound=lambda: None)

    async def run(self, stop: asyncio.Event, driver_done: asyncio.Event) -> None:
        raise EfoError("AccessDenied on the heartbeat write")


def test_a_stream_failing_before_it_reads_ends_the_service_and_its_intake() -> None:
    """The driver takes batches until every stream's intake has ended: a coordinator that failed
    before its own stop path must count as ended, or the service waits for it forever."""
    service = Service(load_settings(stream="s", app="a", sink="console"))

    async def main() -> None:
        service._stop, service._driver_done = asyncio.Event(), asyncio.Event()
        async with asyncio.timeout(5):
            await service._run_all([FailsAtItsFirstHeartbeat()], kinesis=None)  # type: ignore[list-item]

    with pytest.raises(EfoError, match="AccessDenied"):
        asyncio.run(main())
    assert service.intake_ended.is_set()


def test_a_stop_asked_for_before_the_service_s_loop_runs_stops_it_once_it_does() -> None:
    """A SIGTERM during start-up comes before the service has a loop to tell. The driver now takes
    batches until the service's intake ends, so a stop lost there would leave both running until
    the watchdog ends the process, no lease released."""
    service = Service(load_settings(stream="s", app="a", sink="console"))
    service.request_stop()

    async def serve() -> None:
        assert service._stop is not None
        async with asyncio.timeout(5):
            await service._stop.wait()

    service._serve = serve  # type: ignore[method-assign]
    asyncio.run(service._main())
