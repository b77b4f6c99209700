"""Running a simulation in a test: it fails with the violation and the command that replays it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from efo.sim.dynamodb import client_error
from efo.sim.fleet import Fleet
from efo.sim.kinesis import SimKinesisClient
from efo.sim.phases import Unread
from efo.sim.run import Report, RunConfig, simulate


def replay(config: RunConfig) -> str:
    fleet = config.fleet
    return (
        f"python -m efo.sim run --shards {fleet.shards} --workers {fleet.workers} --seed {config.seed} "
        f"--minutes {config.duration_s / 60:g} --faults {','.join(config.faults) or 'none'} "
        f"--records-per-shard-s {fleet.records_per_shard_s:g} --drain-s {config.drain_s:g}"
    )


def run(config: RunConfig, record_property: pytest.RecordProperty | None = None) -> Report:
    """``config`` simulated; no invariant violated, and every record put committed."""
    report = simulate(config)
    if record_property is not None:
        record_property(
            f"{config.fleet.shards}x{config.fleet.workers}_{'+'.join(config.faults) or 'none'}_seed{config.seed}",
            f"{report.simulated_s:.0f} s in {report.wall_s:.1f} s, "
            f"takeover {max(report.takeovers_s, default=0):.2f} s, duplicates {report.duplicates}",
        )
    assert report.violation is None, f"{report.violation}\nreplay: {replay(config)}"
    assert report.records_committed == report.records_put > 0
    return report


def sample_unread(fleet: Fleet) -> tuple[Unread, asyncio.Task[None]]:
    """How long the fleet's readable shards go unread, sampled as efo.sim.phases samples it, and
    the task that samples it (the caller cancels it)."""
    unread = Unread(fleet)
    return unread, asyncio.create_task(unread.sample_every())


def refuse_subscriptions(
    monkeypatch: pytest.MonkeyPatch, refused: Callable[[str, str], bool], after_s: float = 0.02
) -> None:
    """The simulated Kinesis refuses (throttled) every SubscribeToShard for which ``refused(worker,
    shard_id)`` holds, ``after_s`` after the call."""
    subscribe = SimKinesisClient.subscribe_to_shard

    async def refusing(self: SimKinesisClient, **request: Any) -> dict[str, Any]:
        if refused(self.name, request["ShardId"]):
            await self._clock.sleep(after_s)
            raise client_error("SubscribeToShard", "LimitExceededException", "Rate exceeded")
        return await subscribe(self, **request)

    monkeypatch.setattr(SimKinesisClient, "subscribe_to_shard", refusing)
