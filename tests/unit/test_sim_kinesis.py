"""The simulated Kinesis alone: records by key, resharding, ListShards and SubscribeToShard."""

from __future__ import annotations

import asyncio
from typing import Any

import botocore.exceptions
import pytest

from efo.kinesis.shards import list_shards
from efo.sim.clock import SimClock
from efo.sim.kinesis import SimKinesisClient, SimStream
from efo.sim.loop import run


def _stream(shards: int = 2) -> tuple[SimStream, SimKinesisClient]:
    clock = SimClock()
    stream = SimStream("s", shards, clock=clock)
    return stream, SimKinesisClient(stream, clock, lambda: 0.01, "w1")


async def _events(stream: Any, count: int) -> list[dict[str, Any]]:
    return [(await anext(stream))["SubscribeToShardEvent"] for _ in range(count)]


def test_a_split_closes_the_parent_and_its_subscription_ends_with_the_children() -> None:
    async def scenario() -> None:
        stream, client = _stream(1)
        before = [stream.put(f"k{i}", b"x")[1] for i in range(3)]
        low, high = stream.split("shardId-000000000000")
        after = [stream.put(f"k{i}", b"y") for i in range(20)]
        assert {shard for shard, _ in after} == {low, high}
        graph = await list_shards(client, stream.arn)
        assert graph.shards[low].parents == ("shardId-000000000000",) and graph.is_closed("shardId-000000000000")
        subscription = (
            await client.subscribe_to_shard(
                ConsumerARN="c", ShardId="shardId-000000000000", StartingPosition={"Type": "TRIM_HORIZON"}
            )
        )["EventStream"]
        (event,) = await _events(subscription, 1)
        assert [int(r["SequenceNumber"]) for r in event["Records"]] == before
        assert {child["ShardId"] for child in event["ChildShards"]} == {low, high}
        assert "ContinuationSequenceNumber" not in event

    run(scenario())


def test_a_second_subscription_within_five_seconds_is_refused_then_takes_over() -> None:
    async def scenario() -> None:
        stream, client = _stream(1)
        request = {"ConsumerARN": "c", "ShardId": "shardId-000000000000", "StartingPosition": {"Type": "LATEST"}}
        first = (await client.subscribe_to_shard(**request))["EventStream"]
        await _events(first, 1)
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.subscribe_to_shard(**request)
        assert refused.value.response["Error"]["Code"] == "ResourceInUseException"
        await asyncio.sleep(5.0)
        second = (await client.subscribe_to_shard(**request))["EventStream"]
        with pytest.raises(botocore.exceptions.EventStreamError):
            await _events(first, 1)
        stream.put("k", b"z")
        (event,) = await _events(second, 1)
        assert [record["Data"] for record in event["Records"]] == [b"z"]  # LATEST: from the subscription on

    run(scenario())


def test_an_idle_shard_sends_an_empty_event_every_idle_interval_with_its_continuation() -> None:
    async def scenario() -> None:
        stream, client = _stream(1)
        sequence = stream.put("k", b"x")[1]
        subscription = (
            await client.subscribe_to_shard(
                ConsumerARN="c",
                ShardId="shardId-000000000000",
                StartingPosition={"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": str(sequence)},
            )
        )["EventStream"]
        started = asyncio.get_running_loop().time()
        events = await _events(subscription, 3)
        assert all(event["Records"] == [] and event["ContinuationSequenceNumber"] == str(sequence) for event in events)
        assert asyncio.get_running_loop().time() - started == pytest.approx(2 * stream.idle_event_s, abs=0.1)

    run(scenario())


def test_list_shards_pages_and_is_limited_per_stream() -> None:
    async def scenario() -> None:
        stream, client = _stream(5)
        stream.list_limit_per_s = 3
        first = await client.list_shards(StreamARN=stream.arn, MaxResults=2)
        assert len(first["Shards"]) == 2 and first["NextToken"]
        await client.list_shards(NextToken=first["NextToken"], MaxResults=2)
        await client.list_shards(StreamARN=stream.arn)
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await client.list_shards(StreamARN=stream.arn)
        assert refused.value.response["Error"]["Code"] == "LimitExceededException"

    run(scenario())
