"""A micro-batch read again (efo.source.replay) against a fake Kinesis: what it does when Kinesis no
longer has what the batch's start offset names."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest

from efo.pipeline.records import MAX_SUB_SEQUENCE, after
from efo.source.engine import DataLost
from efo.source.options import parse
from efo.source.replay import ShardRange, ShardReplay


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
