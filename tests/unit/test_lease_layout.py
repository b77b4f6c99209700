"""The lease partitions' layout, against the simulated DynamoDB: each lease partition's mark (which
tells an eventually consistent answer from before a change, efo.leases.cache)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from efo.leases.table import MARK_KEY, VERSION_KEY, LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


class Recording:
    """A DynamoDB client that notes the row of every UpdateItem."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.updates: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **request: Any) -> Any:
        self.updates.append((request["Key"]["pk"]["S"], request["Key"]["sk"]["S"]))
        return await self._client.update_item(**request)


def _db() -> SimDynamoDB:
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("t")
    return db


def test_a_change_moves_its_partition_s_mark_before_its_version_and_a_read_returns_the_marks() -> None:
    db = _db()

    async def scenario() -> None:
        clock = SimClock()
        client = Recording(db.client("w", clock, random.Random(2)))
        table = LeaseTable(client, table="t", app="a", stream_arn="s", worker_id="w", clock=clock)
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        await table.create_lease("s0", (), Position("TRIM_HORIZON"))
        home = table.partition_of("s0")
        mark = (table.lease_partition_key(home), MARK_KEY)
        version = (table.partition, VERSION_KEY)
        assert client.updates == [mark, version]
        client.updates.clear()
        await table.claim((await table.read()).leases["s0"])
        assert client.updates == [(table.lease_partition_key(home), "shard|s0"), mark, version]
        read = await table.read_leases()
        assert read.versions == {p: (2 if p == home else 0) for p in range(8)}
        assert set(read.leases) == {"s0"}, "the mark is no lease"
        assert (await table.read_version()).versions == {home: 2}

    run(scenario())
