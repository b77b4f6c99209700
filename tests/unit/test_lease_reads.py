"""The lease cycle alone, with a fake table and a fake clock: it reads the heartbeats and the
version every cycle, and the lease rows only when they may have changed."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from efo.config import Settings, load_settings
from efo.leases.table import Lease, TableState, WorkerRow
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position
from efo.worker.cycle import LeaseCycle
from efo.worker.owned import OwnedLeases


class FakeTable:
    worker_id = "me"

    def __init__(self) -> None:
        self.version = 0
        self.changes = 0
        self.lease_reads = 0
        self.control_reads = 0
        self.owner: str | None = None

    async def read_control(self) -> TableState:
        self.control_reads += 1
        return TableState(workers={"me": WorkerRow("me", self.control_reads, None)}, version=self.version)

    async def read_leases(self) -> TableState:
        self.lease_reads += 1
        return TableState(leases={"shard-1": Lease("shard-1", (), self.owner, 1, Position("TRIM_HORIZON"))})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    return load_settings(stream="s", app="a", sink="console", lease={"full_read_interval_s": 30})


def _cycle(settings: Settings, table: FakeTable, clock: Clock) -> LeaseCycle:
    return LeaseCycle(
        settings=settings,
        table=table,  # type: ignore[arg-type]
        owned=OwnedLeases("me", PendingPool(10, 1 << 20)),
        runner=None,  # type: ignore[arg-type]
        shards=type("Shards", (), {"leased": None})(),  # type: ignore[arg-type]
        stopping=asyncio.Event(),
        in_doubt=lambda: False,
        clock=clock,
    )


def _read(cycle: LeaseCycle) -> TableState:
    return asyncio.run(cycle.read())


def test_the_lease_rows_are_read_once_and_then_only_the_heartbeats_and_the_version(settings: Settings) -> None:
    table, clock = FakeTable(), Clock()
    cycle = _cycle(settings, table, clock)
    for _ in range(20):
        state = _read(cycle)
        clock.now += 1.0
    assert (table.control_reads, table.lease_reads) == (20, 1)
    assert set(state.leases) == {"shard-1"} and state.workers["me"].heartbeat == 20  # heartbeats are fresh


def test_a_moved_version_reads_the_lease_rows_again_and_an_older_answer_does_not(settings: Settings) -> None:
    table, clock = FakeTable(), Clock()
    cycle = _cycle(settings, table, clock)
    _read(cycle)
    table.version, table.owner = 3, "other"
    assert _read(cycle).leases["shard-1"].owner == "other"
    assert table.lease_reads == 2
    table.version = 2  # an eventually consistent answer older than one already seen
    _read(cycle)
    table.version = 3
    _read(cycle)
    assert table.lease_reads == 2


def test_a_change_of_this_worker_reads_the_lease_rows_again(settings: Settings) -> None:
    table, clock = FakeTable(), Clock()
    cycle = _cycle(settings, table, clock)
    _read(cycle)
    table.changes += 1  # a claim, a release, or a conditional write that found the lease moved on
    _read(cycle)
    _read(cycle)
    assert table.lease_reads == 2


def test_the_lease_rows_are_read_at_least_every_full_read_interval(settings: Settings) -> None:
    table, clock = FakeTable(), Clock()
    cycle = _cycle(settings, table, clock)
    _read(cycle)
    clock.now += 29.9
    _read(cycle)
    assert table.lease_reads == 1
    clock.now += 0.1
    _read(cycle)
    assert table.lease_reads == 2


def test_the_cycle_state_is_a_copy_so_a_cycle_changing_it_leaves_the_last_read_as_it_was(settings: Settings) -> None:
    table, clock = FakeTable(), Clock()
    cycle = _cycle(settings, table, clock)
    first: Any = _read(cycle)
    del first.leases["shard-1"]
    assert "shard-1" in _read(cycle).leases and table.lease_reads == 1
