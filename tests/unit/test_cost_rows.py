"""The row sizes efo.leases.cost's formula assumes are those the lease table writes in production:
a lease read for its safety net and its changes, a heartbeat row read by every worker, a lease
partition's mark (its version row, read with every Query of the partition)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from efo.leases import cost
from efo.leases.codec import MARK_KEY, WORKER_PREFIX
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.loop import run

NOW = datetime(2026, 11, 30, tzinfo=UTC)
#: As a production worker names them: a stream in an account, a pod's name with a pid, a Kinesis
#: sequence number (56 digits), a consumer registered for the application.
STREAM_ARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders-events"
WORKER_ID = "efo-orders-events-7d9f8c6b5-x2k4z-1"
SEQUENCE = "49590338271490256608559692538361571095921575989136588898"
CONSUMER_ARN = f"{STREAM_ARN}/consumer/orders-events-app:1764460800"


def test_a_lease_a_heartbeat_and_a_mark_are_the_sizes_the_formula_counts() -> None:
    db = SimDynamoDB(random.Random(1), Behaviour())
    db.create_table("efo-leases")

    async def scenario() -> dict[str, int]:
        clock = SimClock()
        table = LeaseTable(
            db.client(WORKER_ID, clock),
            table="efo-leases",
            app="orders-events-app",
            stream_arn=STREAM_ARN,
            worker_id=WORKER_ID,
            clock=clock,
        )
        table.consumer_arn = CONSUMER_ARN
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=8)
        shard_id = "shardId-000000001234"
        await table.create_lease(shard_id, ("shardId-000000000617",), Position("TRIM_HORIZON"))
        assert await table.heartbeat()
        lease = await table.claim((await table.read()).leases[shard_id])
        await table.checkpoint(lease, Position("AFTER_SEQUENCE_NUMBER", SEQUENCE), lag_ms=1234)
        partition = table.lease_partition_key(table.partition_of(shard_id))
        rows = {
            "lease": db.tables["efo-leases"].partitions[partition].rows[f"shard|{shard_id}"],
            "mark": db.tables["efo-leases"].partitions[partition].rows[MARK_KEY],
            "heartbeat": db.tables["efo-leases"].partitions[table.partition].rows[WORKER_PREFIX + WORKER_ID],
        }
        return {name: row.latest().size for name, row in rows.items()}  # type: ignore[union-attr]

    sizes = run(scenario())
    assert sizes["lease"] == pytest.approx(cost.LEASE_ROW_B, rel=0.05), sizes
    assert sizes["heartbeat"] == pytest.approx(cost.HEARTBEAT_ROW_B, rel=0.05), sizes
    assert sizes["mark"] <= cost.MARK_ROW_B, sizes
