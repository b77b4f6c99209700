"""The lease table's reads of lease partitions: a row read again unchanged is the same Lease object
(and the simulated fleet's shared parses of lease rows and listed shards)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from efo.kinesis.graph import Shard
from efo.kinesis.shards import list_shards
from efo.leases.codec import parse_lease
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.fleet import SharedLeaseRows, SharedParses
from efo.sim.kinesis import SimKinesisClient, SimStream
from efo.sim.loop import run

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BEGUN = Position("AFTER_SEQUENCE_NUMBER", "100")


def test_a_lease_row_read_again_unchanged_is_the_same_object_and_a_changed_one_is_parsed_again() -> None:
    """A change re-reads its whole partition at every worker; only the rows that changed are parsed
    again, and the rest are the very objects the last read gave (the lease cycle looks only at
    leases that are not). What a read gives equals parsing every row afresh, whatever came before."""
    db = SimDynamoDB(random.Random(1), Behaviour(stale_read_s=0.0))
    db.create_table("t")

    async def scenario() -> None:
        clock = SimClock()
        table = LeaseTable(
            db.client("w", clock, random.Random(2)), table="t", app="a", stream_arn="s", worker_id="w", clock=clock
        )
        other = LeaseTable(
            db.client("o", clock, random.Random(3)), table="t", app="a", stream_arn="s", worker_id="o", clock=clock
        )
        await table.create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=1)
        await table.complete_meta()
        for shard_id in ("s0", "s1", "s2"):
            await table.create_lease(shard_id, (), BEGUN)
        first = (await table.read_leases()).leases
        again = (await table.read_leases()).leases
        assert all(again[shard_id] is first[shard_id] for shard_id in first)
        await other.claim(first["s1"])
        await other.checkpoint(await other.claim(first["s2"]), Position("AFTER_SEQUENCE_NUMBER", "200"))
        after = (await table.read_leases()).leases
        assert after["s0"] is first["s0"]
        assert after["s1"] is not first["s1"] and after["s1"].owner == "o"
        assert after["s2"].checkpoint == Position("AFTER_SEQUENCE_NUMBER", "200")
        items = await _items(table)
        assert after == {shard_id: parse_lease(item) for shard_id, item in items.items()}

    async def _items(table: LeaseTable) -> dict[str, dict]:  # type: ignore[type-arg]
        response = await table._ddb.query(
            TableName="t",
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": table.lease_partition_key(0)}},
            ConsistentRead=True,
        )
        rows = [item for item in response["Items"] if item["sk"]["S"].startswith("shard|")]  # not the mark
        return {item["sk"]["S"].removeprefix("shard|"): item for item in rows}

    run(scenario())


def test_the_simulated_fleet_makes_each_state_of_a_lease_partition_into_leases_once_for_every_worker() -> None:
    """The simulated DynamoDB answers every reader of one state of a partition with the same list of
    the items it stored: with the fleet's shared rows, two workers' reads of it give one map of
    leases, a row unchanged since an earlier state is the same Lease object in both, and what a read
    gives equals parsing every row afresh."""
    db = SimDynamoDB(random.Random(1), Behaviour(stale_read_s=0.0))
    db.create_table("t")
    shared = SharedLeaseRows()

    async def scenario() -> None:
        clock = SimClock()
        tables = [
            LeaseTable(
                db.client(name, clock, random.Random(2)),
                table="t",
                app="a",
                stream_arn="s",
                worker_id=name,
                clock=clock,
                rows=shared,
            )
            for name in ("w", "o")
        ]
        await tables[0].create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=1)
        await tables[0].complete_meta()
        for shard_id in ("s0", "s1"):
            await tables[0].create_lease(shard_id, (), BEGUN)
        before = [(await table.read_leases()).parts[0] for table in tables]
        assert before[0] is before[1]
        claimed = await tables[1].claim(before[1]["s0"])
        first, second = [(await table.read_leases()).parts[0] for table in tables]
        assert first is second and first is not before[0]
        assert (first["s0"].owner, first["s0"].counter) == ("o", claimed.counter)
        assert first["s1"] is before[0]["s1"], "unchanged: the same lease"
        alone = LeaseTable(
            db.client("x", clock, random.Random(3)), table="t", app="a", stream_arn="s", worker_id="x", clock=clock
        )
        assert (await alone.read_leases()).leases == first

    run(scenario())


def test_the_simulated_fleet_parses_each_listed_shard_once_for_every_worker() -> None:
    """ListShards describes a shard with one object until it opens or closes: with the fleet's shared
    parser, two workers' listings give one Shard object each, equal to a parse of its own."""
    stream = SimStream("x", 4, clock=SimClock())
    parses = SharedParses(Shard.from_api)

    async def scenario() -> None:
        clock = SimClock()
        clients = [SimKinesisClient(stream, clock, lambda: 0.0, name) for name in ("w", "o")]
        first, second = [await list_shards(client, stream.arn, parses) for client in clients]
        plain = await list_shards(clients[0], stream.arn)
        assert first.shards == plain.shards and len(first.shards) == 4
        assert all(first.shards[shard_id] is second.shards[shard_id] for shard_id in first.shards)

    run(scenario())
