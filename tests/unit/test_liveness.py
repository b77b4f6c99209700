"""Liveness alone, with a fake clock and a fake timer: when a worker trusts its leases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from efo.config import LeaseSettings
from efo.errors import Retriable
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


class Timers:
    """call_later's shape; ``advance`` moves the clock and fires what is due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, Callable[[], None], list[bool]]] = []

    def clock(self) -> float:
        return self.now

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Handle:
        cancelled = [False]
        self.due.append((self.now + delay_s, callback, cancelled))
        return Handle(cancelled)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for at, callback, cancelled in list(self.due):
            if at <= self.now and not cancelled[0]:
                self.due.remove((at, callback, cancelled))
                callback()


class Handle:
    def __init__(self, cancelled: list[bool]) -> None:
        self._cancelled = cancelled

    def cancel(self) -> None:
        self._cancelled[0] = True


@pytest.fixture
def parts() -> tuple[Liveness, Writer, Timers, list[str]]:
    writer, timers, events = Writer(), Timers(), []
    liveness = Liveness(
        writer,
        LeaseSettings(heartbeat_interval_s=2.0, failover_s=10.0),
        on_expired=lambda: events.append("expired"),
        on_recovered=lambda: events.append("recovered"),
        clock=timers.clock,
        call_later=timers.call_later,
    )
    return liveness, writer, timers, events


def test_no_lease_is_trusted_before_the_first_heartbeat_lands_and_landing_is_no_recovery(
    parts: tuple[Liveness, Writer, Timers, list[str]],
) -> None:
    liveness, writer, _timers, events = parts
    writer.failing = True
    assert not asyncio.run(liveness.beat())
    assert liveness.trust is Trust.UNPROVEN and liveness.in_doubt and not liveness.valid
    writer.failing = False
    assert asyncio.run(liveness.beat())
    assert liveness.trust is Trust.TRUSTED and not liveness.in_doubt and liveness.valid
    assert events == []


def test_trust_lasts_failover_minus_one_interval_after_the_last_landing_then_recovers_at_the_next(
    parts: tuple[Liveness, Writer, Timers, list[str]],
) -> None:
    liveness, writer, timers, events = parts
    asyncio.run(liveness.beat())
    writer.failing = True
    timers.advance(7.9)
    assert liveness.valid and events == []
    timers.advance(0.1)  # 8 s = failover 10 s - heartbeat 2 s
    assert liveness.trust is Trust.IN_DOUBT and not liveness.valid and events == ["expired"]
    writer.failing = False
    asyncio.run(liveness.beat())
    assert liveness.trust is Trust.TRUSTED and events == ["expired", "recovered"]


def test_each_landing_moves_the_deadline(parts: tuple[Liveness, Writer, Timers, list[str]]) -> None:
    liveness, writer, timers, events = parts
    for _ in range(10):
        asyncio.run(liveness.beat())
        timers.advance(2.0)
    assert liveness.trust is Trust.TRUSTED and events == [] and writer.beats == 10
