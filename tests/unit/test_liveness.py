"""Liveness alone, in virtual time (the shared fake clock): when a worker trusts its leases."""

from __future__ import annotations

import asyncio

import pytest

from efo.config import LeaseSettings
from efo.errors import Retriable
from efo.sim.clock import SimClock
from efo.sim.loop import run
from efo.worker.liveness import Liveness, Trust


class Writer:
    worker_id = "me"

    def __init__(self) -> None:
        self.failing = False
        self.beats = 0

    async def heartbeat(self) -> None:
        if self.failing:
            raise Retriable("ProvisionedThroughputExceededException")
        self.beats += 1


@pytest.fixture
def parts() -> tuple[Liveness, Writer, list[str]]:
    writer, events = Writer(), []
    liveness = Liveness(
        writer,
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=10.0),
        on_expired=lambda: events.append("expired"),
        on_recovered=lambda: events.append("recovered"),
        clock=SimClock(),
    )
    return liveness, writer, events


def test_no_lease_is_trusted_before_the_first_heartbeat_lands_and_landing_is_no_recovery(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        writer.failing = True
        assert not await liveness.beat()
        assert liveness.trust is Trust.UNPROVEN and liveness.in_doubt and not liveness.valid
        writer.failing = False
        assert await liveness.beat()
        assert liveness.trust is Trust.TRUSTED and not liveness.in_doubt and liveness.valid
        assert events == []
        liveness.close()

    run(scenario())


def test_trust_lasts_failover_minus_one_interval_after_the_last_landing_then_recovers_at_the_next(
    parts: tuple[Liveness, Writer, list[str]],
) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        await liveness.beat()
        writer.failing = True
        await asyncio.sleep(7.9)
        assert liveness.valid and events == []
        await asyncio.sleep(0.2)  # past 8 s = failover 10 s - heartbeat 2 s
        assert liveness.trust is Trust.IN_DOUBT and not liveness.valid and events == ["expired"]
        writer.failing = False
        await liveness.beat()
        assert liveness.trust is Trust.TRUSTED and events == ["expired", "recovered"]
        liveness.close()

    run(scenario())


def test_each_landing_moves_the_deadline(parts: tuple[Liveness, Writer, list[str]]) -> None:
    liveness, writer, events = parts

    async def scenario() -> None:
        for _ in range(10):
            await liveness.beat()
            await asyncio.sleep(2.0)
        assert liveness.trust is Trust.TRUSTED and events == [] and writer.beats == 10
        liveness.close()

    run(scenario())


def test_a_heartbeat_that_lands_late_counts_from_when_it_was_sent(parts: tuple[Liveness, Writer, list[str]]) -> None:
    """Trust runs from the send, not the answer: a write answered 3 s late leaves 5 s of trust."""
    liveness, writer, events = parts

    async def late() -> None:
        await asyncio.sleep(3.0)
        writer.beats += 1

    async def scenario() -> None:
        writer.heartbeat = late  # type: ignore[method-assign]
        await liveness.beat()
        assert liveness.landed_at == 0.0
        await asyncio.sleep(4.9)  # 7.9 s after the send
        assert liveness.valid and events == []
        await asyncio.sleep(0.2)
        assert liveness.trust is Trust.IN_DOUBT and events == ["expired"]
        liveness.close()

    run(scenario())
