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
from efo.sim.fleet import SharedParses
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


def test_the_simulated_fleet_parses_each_stored_lease_row_once_for_every_worker() -> None:
    """The simulated DynamoDB answers every reader with the item it stored: with the fleet's shared
    parser, two workers' reads of a changed row give one Lease object."""
    db = SimDynamoDB(random.Random(1), Behaviour(stale_read_s=0.0))
    db.create_table("t")
    parses = SharedParses(parse_lease)

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
                parse_lease=parses,
            )
            for name in ("w", "o")
        ]
        await tables[0].create_meta(NOW, "TRIM_HORIZON", NOW, lease_partitions=1)
        await tables[0].complete_meta()
        await tables[0].create_lease("s0", (), BEGUN)
        for table in tables:
            await table.read_leases()
        claimed = await tables[1].claim((await tables[1].read_leases()).leases["s0"])
        first, second = [(await table.read_leases()).leases["s0"] for table in tables]
        assert first is second
        assert (first.owner, first.counter) == ("o", claimed.counter)

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
