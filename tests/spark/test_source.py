"""``spark.readStream.format("efo")`` in a real Spark session on the local stack: found by name with
no registration, into the memory sink and Parquet, two queries on one stream, read limits, a split
and a merge mid-query, Trigger.AvailableNow, and the errors a user meets (bad options at load(), a
stream that does not exist, a consumer deleted mid-query)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints
from tests.integration.service import create_stream, put_records, split_first_shard, unique
from tests.integration.source import WITHIN_S, Row, source_options, verdict

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def queries() -> Iterator[list[StreamingQuery]]:
    started: list[StreamingQuery] = []
    yield started
    for query in started:
        if query.isActive:
            query.stop()


def read(spark: SparkSession, stack: StackEndpoints, stream: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("efo")
    for name, value in source_options(stack, stream, **options).items():
        reader = reader.option(name, value)
    return reader.load()


def wait_until(
    check: Callable[[], bool], what: str, query: StreamingQuery | None = None, within_s: float = WITHIN_S
) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        assert time.monotonic() < deadline, f"no {what} within {within_s} s"
        time.sleep(0.5)


def rows_in(spark: SparkSession, table: str) -> list[Row]:
    return [
        Row(r.stream, r.shardId, r.sequenceNumber, r.subSequenceNumber, r.partitionKey, bytes(r.data), 0)
        for r in spark.sql(f"SELECT * FROM {table}").collect()
    ]


def test_two_queries_on_one_stream_with_their_own_consumers_read_every_record_into_memory_and_parquet(
    spark: SparkSession, local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path, queries: list[StreamingQuery]
) -> None:
    stream = unique("spark-src")
    create_stream(kinesis_client, stream, 2)
    puts = put_records(kinesis_client, stream, 60, tag="a", keys=8)
    table = stream.replace("-", "_")
    memory = (
        read(spark, local_stack, stream, consumerName="to-memory", maxRecordsPerTrigger="25")
        .writeStream.format("memory")
        .queryName(table)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    queries.append(memory)
    parquet = (
        read(spark, local_stack, stream, consumerName="to-parquet")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    queries.append(parquet)
    wait_until(lambda: len(rows_in(spark, table)) >= 60, "60 rows in memory", memory)
    puts += put_records(kinesis_client, stream, 40, tag="b", keys=8)
    wait_until(lambda: len(rows_in(spark, table)) >= 100, "100 rows in memory", memory)

    def parquet_rows() -> list[Row]:
        if not (tmp_path / "out" / "_spark_metadata").exists():
            return []
        return [
            Row(r.stream, r.shardId, r.sequenceNumber, r.subSequenceNumber, r.partitionKey, bytes(r.data), 0)
            for r in spark.read.parquet(str(tmp_path / "out")).collect()
        ]

    wait_until(lambda: len(parquet_rows()) >= 100, "100 rows in Parquet", parquet)
    for rows in (rows_in(spark, table), parquet_rows()):
        result = verdict(puts, rows)
        assert result.ok, result
    progress = [p for p in memory.recentProgress if p["numInputRows"]]
    assert progress and all(p["numInputRows"] <= 25 for p in progress), "a batch over maxRecordsPerTrigger"
    assert sum(p["numInputRows"] for p in memory.recentProgress) >= 100, "Spark's progress lacks the input rows"
    consumers = {
        c["ConsumerName"]
        for c in kinesis_client.list_stream_consumers(StreamARN=arn(kinesis_client, stream))["Consumers"]
    }
    assert {"to-memory", "to-parquet"} <= consumers
    memory.stop()
    parquet.stop()
    consumers = {
        c["ConsumerName"]
        for c in kinesis_client.list_stream_consumers(StreamARN=arn(kinesis_client, stream))["Consumers"]
    }
    assert {"to-memory", "to-parquet"} <= consumers, "a consumer was deregistered when its query stopped"


def arn(kinesis: Any, stream: str) -> str:
    return str(kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"])


def test_a_split_and_a_merge_mid_query_lose_nothing_and_keep_each_keys_order(
    spark: SparkSession, local_stack: StackEndpoints, kinesis_client: Any, queries: list[StreamingQuery]
) -> None:
    from tests.integration.source import merge_children

    stream = unique("spark-reshard")
    create_stream(kinesis_client, stream, 1)
    seen: list[Row] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        for r in df.collect():
            seen.append(
                Row(r.stream, r.shardId, r.sequenceNumber, r.subSequenceNumber, r.partitionKey, bytes(r.data), batch_id)
            )

    query = (
        read(spark, local_stack, stream, maxRecordsPerTrigger="30")
        .writeStream.foreachBatch(collect)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    queries.append(query)
    puts = put_records(kinesis_client, stream, 40, tag="a", keys=8)
    wait_until(lambda: len(seen) >= 40, "the first records", query)
    parent = split_first_shard(kinesis_client, stream)
    puts += put_records(kinesis_client, stream, 40, tag="b", keys=8)
    merged = merge_children(kinesis_client, stream, parent)
    puts += put_records(kinesis_client, stream, 40, tag="c", keys=8)
    wait_until(lambda: len(seen) >= 120, "every record", query)
    result = verdict(puts, seen)
    assert result.ok, result
    merged_batches = [r.batch for r in seen if r.shard_id == merged]
    parent_batches = [r.batch for r in seen if r.shard_id == parent]
    assert merged_batches and max(parent_batches) < min(merged_batches)


def test_available_now_reads_a_backlog_across_a_split_then_the_query_stops(
    spark: SparkSession, local_stack: StackEndpoints, kinesis_client: Any, queries: list[StreamingQuery]
) -> None:
    stream = unique("spark-now")
    create_stream(kinesis_client, stream, 2)
    backlog = put_records(kinesis_client, stream, 50, tag="before", keys=8)
    split_first_shard(kinesis_client, stream)
    backlog += put_records(kinesis_client, stream, 50, tag="child", keys=8)
    table = stream.replace("-", "_")
    query = (
        read(spark, local_stack, stream, maxRecordsPerTrigger="40")
        .writeStream.format("memory")
        .queryName(table)
        .trigger(availableNow=True)
        .start()
    )
    queries.append(query)
    wait_until(lambda: bool(query.recentProgress), "the first batch", query)
    later = put_records(kinesis_client, stream, 20, tag="after", keys=8)  # after the query's start: not read
    assert query.awaitTermination(WITHIN_S), "Trigger.AvailableNow did not stop"
    assert query.exception() is None, query.exception()
    rows = rows_in(spark, table)
    result = verdict(backlog, rows)
    assert result.ok, result
    assert not {p.sequence_number for p in later} & {r.sequence_number for r in rows}
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3, "read limits were not kept"


def test_bad_options_fail_at_load_naming_the_option(spark: SparkSession) -> None:
    with pytest.raises(PySparkException, match=r"option maxRecordsPerTrigger = '-1': allowed: a whole number above 0"):
        spark.readStream.format("efo").option("streams", "s").option("consumerName", "c").option(
            "maxRecordsPerTrigger", "-1"
        ).load()
    with pytest.raises(PySparkException, match=r"'startingoffsets' is not an option of the efo source"):
        spark.readStream.format("efo").option("streams", "s").option("consumerName", "c").option(
            "startingOffsets", "earliest"
        ).load()


def test_a_stream_that_does_not_exist_fails_the_query_naming_it(
    spark: SparkSession, local_stack: StackEndpoints, queries: list[StreamingQuery]
) -> None:
    stream = unique("spark-missing")
    query = read(spark, local_stack, stream).writeStream.format("memory").queryName(stream.replace("-", "_")).start()
    queries.append(query)
    with pytest.raises(PySparkException, match=rf"stream '{stream}' not found in region"):
        query.awaitTermination(WITHIN_S)


def test_a_consumer_deleted_mid_query_fails_the_query_naming_it(
    spark: SparkSession, local_stack: StackEndpoints, kinesis_client: Any, queries: list[StreamingQuery]
) -> None:
    stream = unique("spark-deregistered")
    create_stream(kinesis_client, stream, 1)
    table = stream.replace("-", "_")
    faults = FaultClient(local_stack.kinesis_endpoint)
    # kinesis-local keeps feeding open subscriptions of a deregistered consumer (AWS ends them): every
    # subscription is cut after a few events, so that its renewal meets the deregistration.
    faults.add(
        operation="SubscribeToShard",
        action="exception_frame",
        error_code="InternalFailureException",
        after_events=2,
        count=10_000,
    )
    try:
        query = read(spark, local_stack, stream).writeStream.format("memory").queryName(table).start()
        queries.append(query)
        put_records(kinesis_client, stream, 10, tag="a", keys=8)
        wait_until(lambda: len(rows_in(spark, table)) >= 10, "the first records", query)
        (consumer,) = kinesis_client.list_stream_consumers(StreamARN=arn(kinesis_client, stream))["Consumers"]
        kinesis_client.deregister_stream_consumer(ConsumerARN=consumer["ConsumerARN"])
        with pytest.raises(PySparkException, match=r"consumer .*test-source.* is gone"):
            query.awaitTermination(WITHIN_S)
    finally:
        faults.clear()
