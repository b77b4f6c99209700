"""A micro-batch read again (efo.source.replay) against a fake Kinesis: what it does when Kinesis no
longer has what the batch's start offset names."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest

from efo.pipeline.records import MAX_SUB_SEQUENCE, Position, after
from efo.source.engine import DataLost
from efo.source.offsets import ShardOffset, SourceOffset, StreamOffset, origin_position
from efo.source.options import parse
from efo.source.replay import ShardRange, ShardReplay, ranges


def client_error(code: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"}, "ResponseMetadata": {"HTTPStatusCode": 400}},
        operation,
    )


class Kinesis:
    """A shard whose records ``first``..``last`` are left (those before ``first`` were trimmed)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.iterators: list[dict[str, Any]] = []

    async def get_shard_iterator(self, **args: Any) -> dict[str, Any]:
        self.iterators.append(args)
        seq = args.get("StartingSequenceNumber")
        if seq is not None and int(seq) < self.first:
            raise client_error("InvalidArgumentException", "GetShardIterator")  # past the retention
        begin = self.first if seq is None else int(seq) + (args["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER")
        return {"ShardIterator": str(begin)}

    async def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        at = int(ShardIterator)
        records = [
            {
                "SequenceNumber": str(seq),
                "PartitionKey": "k",
                "ApproximateArrivalTimestamp": datetime(2026, 1, 1, tzinfo=UTC),
                "Data": f"r{seq}".encode(),
            }
            for seq in range(at, self.last + 1)
        ]
        return {"Records": records, "NextShardIterator": str(self.last + 1), "MillisBehindLatest": 0}


def replay(kinesis: Kinesis, shard: ShardRange, **options: str) -> list[str]:
    async def no_sleep(seconds: float) -> None:
        pass

    source = parse({"streams": "orders", "consumerName": "c", **options})
    chunks = asyncio.run(ShardReplay(kinesis, source, shard, sleep=no_sleep).read())
    return [seq for chunk in chunks for seq in chunk.sequence_numbers]


def batch_after_an_expired_position() -> ShardRange:
    """The query resumed after record 3 when records up to 5 were gone: with failOnDataLoss=false its
    subscription read on from the oldest record left (6), and the batch held 6, 7 and 8."""
    return ShardRange(
        "orders",
        "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
        "shardId-000000000000",
        start=after("3"),
        delivered=(3, MAX_SUB_SEQUENCE),
        last=(8, MAX_SUB_SEQUENCE),
        rows=3,
    )


def test_a_batch_read_on_from_the_oldest_record_left_is_read_again_from_there_with_fail_on_data_loss_false() -> None:
    kinesis = Kinesis(first=6, last=9)
    assert replay(kinesis, batch_after_an_expired_position(), failOnDataLoss="false") == ["6", "7", "8"]
    assert [args["ShardIteratorType"] for args in kinesis.iterators] == ["AFTER_SEQUENCE_NUMBER", "TRIM_HORIZON"]


def test_with_fail_on_data_loss_a_batch_whose_start_is_past_the_retention_is_data_loss_naming_the_shard() -> None:
    with pytest.raises(DataLost, match="shard shardId-000000000000 of stream 'orders'"):
        replay(Kinesis(first=6, last=9), batch_after_an_expired_position())


def test_a_batch_holding_more_rows_than_kinesis_still_has_is_data_loss_naming_the_shard_or_read_as_is() -> None:
    """Records of a planned batch trimmed since (past the retention): the replay finds fewer rows than
    the end offset counts."""
    shard = ShardRange(
        "orders",
        "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
        "shardId-000000000000",
        start=Position("TRIM_HORIZON"),
        delivered=None,
        last=(9, MAX_SUB_SEQUENCE),
        rows=8,
    )
    with pytest.raises(
        DataLost, match=r"holds 8 rows of shard shardId-000000000000 of stream 'orders', but Kinesis gave 5"
    ):
        replay(Kinesis(first=5, last=9), shard)
    assert replay(Kinesis(first=5, last=9), shard, failOnDataLoss="false") == ["5", "6", "7", "8", "9"]


def test_a_shard_whose_origin_moved_in_the_batch_is_read_from_its_new_origin_with_its_own_rows() -> None:
    """skipOlderThan at a restart moves a shard's origin (AT_TIMESTAMP, its last record cleared): the
    batch after it holds the rows from there, counted since the query began."""
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

    def offset(shard: ShardOffset) -> SourceOffset:
        return SourceOffset({arn: StreamOffset("orders", 1, {"shardId-000000000000": shard})})

    before = ShardOffset("TRIM_HORIZON", sequence_number="40", rows=10, arrival_ms=1_000)
    after_skip = ShardOffset("AT_TIMESTAMP:90000", sequence_number="77", rows=13, arrival_ms=95_000)
    (shard,) = ranges(offset(before), offset(after_skip))
    assert str(shard.start) == str(origin_position("AT_TIMESTAMP:90000")) and shard.delivered is None
    assert shard.rows == 3 and shard.last == (77, MAX_SUB_SEQUENCE)
    (same,) = ranges(offset(replace(after_skip, sequence_number="60", rows=11)), offset(after_skip))
    assert str(same.start) == "AFTER_SEQUENCE_NUMBER:60" and same.rows == 2, "within one origin: after the start"


def test_a_batch_of_a_stream_deleted_and_created_again_since_is_never_read_from_the_new_stream() -> None:
    """After a restart Spark reads its last planned batch again before it asks the source for anything
    (no set-up, no check of the stream there): the batch's offsets name the stream as it was created
    then. The new stream of the same name holds other records under the same shard ids: reading them
    would hand Spark another batch. StreamRecreated naming the stream, or with failOnDataLoss=false
    nothing of that stream (logged)."""
    from efo.errors import StreamRecreated
    from efo.source.replay import read_with

    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

    class Recreated(Kinesis):
        async def describe_stream_summary(self, **args: Any) -> dict[str, Any]:
            return {
                "StreamDescriptionSummary": {
                    "StreamName": "orders",
                    "StreamARN": arn,
                    "StreamCreationTimestamp": datetime(2026, 3, 1, tzinfo=UTC),  # not the offsets' creation
                    "StreamStatus": "ACTIVE",
                    "OpenShardCount": 1,
                }
            }

    def offset(shard: ShardOffset) -> SourceOffset:
        return SourceOffset({arn: StreamOffset("orders", 1_000, {"shardId-000000000000": shard})})

    start = offset(ShardOffset("TRIM_HORIZON"))
    end = offset(ShardOffset("TRIM_HORIZON", sequence_number="3", rows=3, arrival_ms=1_000))

    def read(**options: str) -> list[str]:
        source = parse({"streams": "orders", "consumerName": "c", **options})
        chunks = asyncio.run(read_with(Recreated(first=1, last=5), source, start, end))
        return [seq for chunk in chunks for seq in chunk.sequence_numbers]

    with pytest.raises(
        StreamRecreated, match=r"stream 'orders', which was deleted and created again.*checkpointLocation"
    ):
        read()
    assert read(failOnDataLoss="false") == []
