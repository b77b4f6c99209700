"""An in-memory Kinesis for in-process tests of the coordinator: shards with records, splits,
ListShards, and SubscribeToShard streams shaped as botocore parses them (what efo's decoder
accepts from a non-HTTP stream). With the real lease table on the local stack's DynamoDB and a
driver task that commits what the handoff holds, the whole service runs in one event loop, in
seconds, without a JVM.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from efo.leases.lifecycle import Commit
from efo.pipeline.handoff import Handoff
from efo.pipeline.records import RecordChunk

EVENT_INTERVAL_S = 0.02


@dataclass
class MemoryShard:
    shard_id: str
    parents: tuple[str, ...] = ()
    records: list[tuple[int, str, bytes, float]] = field(default_factory=list)  # (sequence, key, data, arrival)
    closed: bool = False
    children: tuple[str, ...] = ()


class MemoryStream:
    """One subscription: events every EVENT_INTERVAL_S from the position on; the end of a closed
    shard is an event with ChildShards and no continuation."""

    def __init__(self, kinesis: MemoryKinesis, shard: MemoryShard, after: int) -> None:
        self._kinesis = kinesis
        self._shard = shard
        self._after = after  # deliver records with sequence > after
        self._ended = False
        self.closed = False

    def __aiter__(self) -> MemoryStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._ended or self.closed:
            raise StopAsyncIteration
        await asyncio.sleep(EVENT_INTERVAL_S)
        failure = self._kinesis.stream_failures.pop(self._shard.shard_id, None)
        if failure is not None:
            raise failure
        fresh = [r for r in self._shard.records if r[0] > self._after][: self._kinesis.max_records_per_event]
        payload: dict[str, Any] = {
            "Records": [
                {"SequenceNumber": str(seq), "PartitionKey": key, "Data": data, "ApproximateArrivalTimestamp": arrival}
                for seq, key, data, arrival in fresh
            ],
            "MillisBehindLatest": 0,
        }
        if fresh:
            self._after = fresh[-1][0]
        caught_up = not [r for r in self._shard.records if r[0] > self._after]
        if self._shard.closed and caught_up:
            self._ended = True
            payload["ChildShards"] = [
                {"ShardId": child, "ParentShards": [self._shard.shard_id], "HashKeyRange": {}}
                for child in self._shard.children
            ]
        else:
            payload["ContinuationSequenceNumber"] = str(max(self._after, self._kinesis.last_sequence))
        return {"SubscribeToShardEvent": payload}

    def close(self) -> None:
        self.closed = True


class MemoryKinesis:
    def __init__(self, shards: int = 1) -> None:
        self._sequence = itertools.count(1000)
        self.last_sequence = 999
        self.shards: dict[str, MemoryShard] = {}
        self.unlisted: set[str] = set()  # shards gone from ListShards (past the retention)
        self.subscribe_calls: list[tuple[str, dict[str, Any]]] = []
        self.stream_failures: dict[str, BaseException] = {}
        self.streams: list[MemoryStream] = []
        self.max_records_per_event = 100
        self.consumer_registered = True
        self.list_failures = 0  # the next ListShards calls that are throttled
        self.room: list[int] = []
        for i in range(shards):
            self.add_shard(f"shard-{i:03d}")

    # ---- the producer's side -----------------------------------------------------------------

    def add_shard(self, shard_id: str, parents: tuple[str, ...] = ()) -> MemoryShard:
        shard = MemoryShard(shard_id, parents)
        self.shards[shard_id] = shard
        return shard

    def put(self, shard_id: str, count: int, key: str = "k") -> list[int]:
        shard = self.shards[shard_id]
        assert not shard.closed, f"{shard_id} is closed"
        written = []
        for i in range(count):
            seq = next(self._sequence)
            self.last_sequence = seq
            shard.records.append((seq, key, f"{shard_id}-{seq}-{i}".encode(), time.time()))
            written.append(seq)
        return written

    def split(self, shard_id: str) -> tuple[str, str]:
        parent = self.shards[shard_id]
        children = (f"{shard_id}a", f"{shard_id}b")
        parent.closed, parent.children = True, children
        for child in children:
            self.add_shard(child, (shard_id,))
        return children

    # ---- the control plane -----------------------------------------------------------------------

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        if self.list_failures:
            self.list_failures -= 1
            import botocore.exceptions

            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "LimitExceededException", "Message": "Rate exceeded"}}, "ListShards"
            )
        return {
            "Shards": [
                {
                    "ShardId": s.shard_id,
                    **({"ParentShardId": s.parents[0]} if s.parents else {}),
                    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
                }
                for s in self.shards.values()
                if s.shard_id not in self.unlisted
            ]
        }

    async def describe_stream_consumer(self, **kwargs: Any) -> dict[str, Any]:
        if not self.consumer_registered:
            import botocore.exceptions

            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "consumer gone"}}, "DescribeStreamConsumer"
            )
        return {"ConsumerDescription": {"ConsumerARN": "arn:consumer", "ConsumerStatus": "ACTIVE"}}

    # ---- the data plane (efo.aws.SubscriberClient's interface) -----------------------------------

    async def ensure_room(self, shards: int) -> None:
        self.room.append(shards)

    async def subscribe_to_shard(self, **kwargs: Any) -> dict[str, Any]:
        shard_id = kwargs["ShardId"]
        self.subscribe_calls.append((shard_id, dict(kwargs["StartingPosition"])))
        shard = self.shards[shard_id]
        start = kwargs["StartingPosition"]
        kind = start["Type"]
        if kind == "LATEST":
            after = self.last_sequence
        elif kind == "AFTER_SEQUENCE_NUMBER":
            after = int(start["SequenceNumber"])
        elif kind == "AT_SEQUENCE_NUMBER":
            after = int(start["SequenceNumber"]) - 1
        elif kind == "AT_TIMESTAMP":
            moment = start["Timestamp"].timestamp()
            older = [seq for seq, _, _, arrival in shard.records if arrival < moment]
            after = max(older, default=0)
        else:  # TRIM_HORIZON
            after = 0
        stream = MemoryStream(self, shard, after)
        self.streams.append(stream)
        return {"EventStream": stream}


class MemoryDriver:
    """The Spark driver's part: takes batches from the handoff, 'writes' them, acknowledges them.
    ``hold`` keeps batches (a slow or stuck sink); ``written`` is what the sink committed;
    ``max_wait_s`` is the batch's ``batch.max_wait_s``."""

    def __init__(self, handoff: Handoff, on_committed: Callable[[list[Commit]], None]) -> None:
        self.handoff = handoff
        self.on_committed = on_committed
        self.written: list[tuple[str, int]] = []  # (shard, sequence) in commit order
        self.held: list[RecordChunk] = []
        self.hold = False
        self.max_wait_s = 0.05

    async def run(self) -> None:
        while True:
            chunks = await asyncio.to_thread(self.handoff.take_batch, 10_000, 1 << 30, self.max_wait_s, 0.05)
            if not chunks:
                await asyncio.sleep(0.01)
                continue
            if self.hold:
                self.held.extend(chunks)
                continue
            self.commit(chunks)

    def commit(self, chunks: list[RecordChunk]) -> None:
        for chunk in chunks:
            self.written.extend((chunk.shard_id, int(seq)) for seq in chunk.sequence_numbers)
        self.on_committed([Commit.of(chunk) for chunk in chunks])

    def release_held(self) -> None:
        held, self.held = self.held, []
        self.commit(held)
