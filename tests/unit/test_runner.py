"""The shard runner's handover alone, with a fake table and a fake clock: the lease goes to the next
owner once the sink committed what was handed on (checkpoint first), or after ``failover_s / 2``
with what was committed by then; never while the leases are in doubt."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any

import pytest

from efo.config import Settings, load_settings
from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.table import Lease
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, after
from efo.worker.checkpointer import Checkpointer
from efo.worker.owned import OwnedLeases
from efo.worker.runner import ShardRunner


class Table:
    worker_id = "me"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def checkpoint(self, lease: Lease, position: Position, *, lag_ms: int | None = None) -> Lease:
        self.calls.append(("checkpoint", position))
        return replace(lease, checkpoint=position)

    async def release(self, lease: Lease) -> None:
        self.calls.append(("release", lease.shard_id))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in list(os.environ):
        if name.startswith("EFO_"):
            monkeypatch.delenv(name)
    return load_settings(stream="s", app="a", sink="console", lease={"failover_s": 10.0})


class Parts:
    def __init__(self, settings: Settings, *, valid: bool = True) -> None:
        self.table, self.clock, pool = Table(), Clock(), PendingPool(1000, 1 << 20)
        self.owned = OwnedLeases("me", pool)
        self.checkpointer = Checkpointer(
            table=self.table,  # type: ignore[arg-type]
            owned=self.owned,
            pool=pool,
            settings=settings,
            lease_valid=lambda: valid,
            clock=self.clock,
        )
        self.runner = ShardRunner(
            settings=settings,
            stream=None,  # type: ignore[arg-type]
            consumer_arn="arn:consumer",
            kinesis=None,
            subscriber=None,
            table=self.table,  # type: ignore[arg-type]
            pool=pool,
            handoff=Handoff(),
            owned=self.owned,
            checkpointer=self.checkpointer,
            stopping=asyncio.Event(),
            lease_valid=lambda: valid,
            clock=self.clock,
        )
        self.tasks: list[asyncio.Task[None]] = []
        self.runner.spawn = lambda coroutine, name: self._spawn(coroutine)

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        self.tasks.append(task)
        return task

    def reading(self, chunks: int) -> OwnedShard:
        owned = self.owned.own(Lease("shard-a", (), "me", 1, Position("TRIM_HORIZON")))
        owned.enter(ShardPhase.READING)
        for _ in range(chunks):
            serial = owned.ledger.next_serial()
            owned.ledger.enqueued(serial, after(str(serial * 10)))
        return owned


def test_a_handover_waits_for_the_sink_then_checkpoints_then_releases(settings: Settings) -> None:
    async def scenario() -> None:
        parts = Parts(settings)
        owned = parts.reading(chunks=2)
        parts.runner.hand_over(owned, "a test")
        await asyncio.sleep(0.2)
        assert parts.table.calls == [], "released with chunks still in the sink"
        parts.checkpointer.on_committed([Commit("shard-a", 1, 1, 5), Commit("shard-a", 1, 2, 5)])
        await asyncio.gather(*parts.tasks)
        assert parts.table.calls == [("checkpoint", after("20")), ("release", "shard-a")]
        assert owned.phase is ShardPhase.RELEASED and "shard-a" not in parts.owned

    asyncio.run(scenario())


def test_a_handover_gives_up_waiting_after_half_the_failover_and_releases_what_was_committed(
    settings: Settings,
) -> None:
    async def scenario() -> None:
        parts = Parts(settings)
        owned = parts.reading(chunks=2)
        parts.checkpointer.on_committed([Commit("shard-a", 1, 1, 5)])  # the second never commits
        parts.runner.hand_over(owned, "a test")
        await asyncio.sleep(0.2)
        assert parts.table.calls == []
        parts.clock.now += 5.0  # failover_s / 2
        await asyncio.gather(*parts.tasks)
        assert parts.table.calls == [("checkpoint", after("10")), ("release", "shard-a")]

    asyncio.run(scenario())


def test_a_claim_in_doubt_is_neither_checkpointed_nor_released(settings: Settings) -> None:
    async def scenario() -> None:
        parts = Parts(settings, valid=False)
        owned = parts.reading(chunks=1)
        parts.checkpointer.on_committed([Commit("shard-a", 1, 1, 5)])
        assert not await parts.runner.release(owned)
        assert parts.table.calls == []

    asyncio.run(scenario())
