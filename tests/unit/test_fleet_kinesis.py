"""The fleet benchmark's fake Kinesis: ListShards paged as AWS pages it, streams efo's decoder reads."""

from __future__ import annotations

import asyncio

from efo.devstack.fleet_kinesis import FleetKinesis
from efo.kinesis.decoder import iter_events
from efo.kinesis.shards import list_shards


def test_list_shards_pages_a_thousand_at_a_time_and_counts_every_call() -> None:
    kinesis = FleetKinesis(2_500)
    graph = asyncio.run(list_shards(kinesis, "arn:aws:kinesis:us-east-1:000000000000:stream/fleet"))
    assert len(graph.shards) == 2_500
    assert "shardId-000000002499" in graph.shards
    assert (kinesis.list_calls, kinesis.listings) == (3, 1)


def test_an_idle_stream_moves_its_continuation_and_a_busy_one_carries_a_record() -> None:
    async def scenario() -> list[tuple[int, str | None]]:
        kinesis = FleetKinesis(1, interval_s=0.01)
        stream = (await kinesis.subscribe_to_shard(ShardId="shardId-000000000000"))["EventStream"]
        seen = []
        async for event in iter_events(stream):
            seen.append((len(event.sequence_numbers), event.continuation_sequence_number))
            kinesis.busy = True
            if len(seen) == 2:
                stream.close()
        assert kinesis.open_streams == 0
        return seen

    (idle, idle_next), (busy, busy_next) = asyncio.run(scenario())
    assert (idle, busy) == (0, 1)
    assert idle_next is not None and busy_next is not None and int(busy_next) > int(idle_next)
