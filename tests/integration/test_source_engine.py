"""The Spark source's engine (efo.source) on the local stack, without Spark: micro-batches planned as
Spark plans them through splits and merges, KPL aggregates and a LATEST start, restarts from an
offset; every batch read again between its offsets (as after a restart, by GetRecords) gives the
same rows in the same order. What needs no Kinesis (how batches are cut, skipOlderThan, the
shardTimeout of AvailableNow, a replay short of rows) is in tests/unit/test_source_*.py; the Spark
side, on one SparkSession, in tests/spark/test_source.py."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from efo.aws import Clients, Endpoints
from efo.devstack.stack import StackEndpoints
from efo.errors import StreamRecreated
from efo.source.engine import DataLost, Engine, initial_offset
from efo.source.offsets import SourceOffset
from efo.source.replay import read_with

from .service import create_stream, put_records, split_first_shard, unique
from .source import (
    Batch,
    engine_of,
    merge_children,
    options_of,
    parents_first,
    parents_of,
    plan_until,
    rows_of,
    split,
    verdict,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.close()


def keys(chunks: Any) -> list[tuple[str, str, int | None]]:
    return [
        (c.shard_id, s, sub) for c in chunks for s, sub in zip(c.sequence_numbers, c.sub_sequence_numbers, strict=True)
    ]


def replayed(stack: StackEndpoints, stream: str, batches: list[Batch]) -> list[list[tuple[str, str, int | None]]]:
    """Each batch read again between its offsets, as after a restart (read_between, on one client)."""
    options = options_of(stack, stream)

    async def read_all() -> list[list[tuple[str, str, int | None]]]:
        async with Clients(Endpoints(options.region, options.endpoint, None)) as clients:
            kinesis = await clients.kinesis()
            offsets = [(SourceOffset.from_json(b.start), SourceOffset.from_json(b.end)) for b in batches]
            return [keys(await read_with(kinesis, options, start, end)) for start, end in offsets]

    return asyncio.run(read_all())


def test_splits_a_merge_and_a_kpl_aggregate_lose_nothing_parents_come_first_and_every_batch_replays_the_same(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    """A backlog across a split and a merge of the children (each generation has records waiting when
    the query starts, so nothing but the lineage keeps a child from the batch of its parent), a KPL
    aggregate of 30 sub-records (batches of 25 split it) and a corrupt one (passed through, marked),
    then one more split while the query reads."""
    from aws_kinesis_agg.aggregator import RecordAggregator

    from efo.kinesis.kpl import CORRUPT_AGGREGATE, MAGIC, CorruptAggregate

    stream = unique("src-reshard")
    create_stream(kinesis_client, stream, 2)
    corrupt = MAGIC + b"\x0a\xff not a protobuf" + bytes(16)
    kinesis_client.put_record(StreamName=stream, Data=corrupt, PartitionKey="k")
    aggregator = RecordAggregator()
    for i in range(30):
        aggregator.add_user_record(f"k{i % 3}", f"sub-{i}".encode())
    record = aggregator.clear_and_get()
    assert record is not None
    partition_key, _, data = record.get_contents()
    kinesis_client.put_record(StreamName=stream, Data=data, PartitionKey=partition_key)
    puts = put_records(kinesis_client, stream, 60, tag="a")
    parent = split_first_shard(kinesis_client, stream)
    puts += put_records(kinesis_client, stream, 60, tag="b")
    merged = merge_children(kinesis_client, stream, parent)
    puts += put_records(kinesis_client, stream, 60, tag="c")
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    batches = plan_until(engine, 211, max_rows=25)
    split(kinesis_client, stream, "shardId-000000000001")  # the other original shard, mid-query
    puts += put_records(kinesis_client, stream, 40, tag="d")
    batches += plan_until(engine, 40, start=batches[-1].end, max_rows=25)

    rows = rows_of(batches)
    wanted = {(p.shard_id, p.sequence_number) for p in puts}
    result = verdict(puts, [r for r in rows if (r.shard_id, r.sequence_number) in wanted])
    assert result.ok, result
    assert all(b.planned.rows <= 25 for b in batches), "a batch over the read limit"
    subs = [r.sub_sequence_number for r in rows if r.sub_sequence_number is not None]
    assert subs == list(range(30)), "sub-records lost, repeated or out of order across batches"
    marked = [
        (bytes(d), e) for b in batches for c in b.planned.chunks for d, e in zip(c.data, c.errors, strict=True) if e
    ]
    assert marked == [(corrupt, CORRUPT_AGGREGATE)], "the corrupt aggregate is one row, marked"
    lineage = parents_of(kinesis_client, stream)
    assert lineage[merged], "the merged shard has no parents: the test proves nothing"
    assert not parents_first(rows, lineage)
    (shards,) = [s.shards for s in SourceOffset.from_json(batches[-1].end).streams.values()]
    assert shards[parent].ended and all(shards[c].ended for c in lineage[merged]), "an ended shard not in the offset"
    # Every batch read again between its offsets: the same rows, in the same order.
    assert replayed(local_stack, stream, batches) == [keys(batch.planned.chunks) for batch in batches]
    engine.close()

    strict = engine_of(local_stack, stream, consumerName="test-strict", onCorruptAggregate="fail")
    engines.append(strict)
    start, deadline = initial_offset(), time.monotonic() + 30
    with pytest.raises(CorruptAggregate, match=rf"in shard shardId-0000000000\d\d of stream '{stream}'"):
        while time.monotonic() < deadline:
            start = strict.plan(start).end
            time.sleep(0.2)


def test_a_query_started_at_latest_reads_a_new_child_from_its_start_and_restarts_from_its_offset(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    """LATEST is pinned by the first batch, as a moment: a child born later is read from its start,
    and a restart from the checkpoint reads what was written while the query was down. The same
    checkpoint naming a shard the stream no longer has fails, naming it (or is read on without it
    with failOnDataLoss=false); a restart with skipOlderThan skips what is older; once the stream is
    deleted and created again, the checkpoint is refused."""
    stream = unique("src-latest")
    create_stream(kinesis_client, stream, 1)
    before = put_records(kinesis_client, stream, 10, tag="old")
    engine = engine_of(local_stack, stream, startingPosition="LATEST")
    engines.append(engine)
    pin = engine.plan(initial_offset())
    assert pin.advanced and pin.rows == 0, "the first batch pins LATEST in the offsets"
    puts = put_records(kinesis_client, stream, 20, tag="new")
    split_first_shard(kinesis_client, stream)
    puts += put_records(kinesis_client, stream, 30, tag="child")
    batches = [Batch(initial_offset(), pin.end, pin), *plan_until(engine, 50, start=pin.end, max_rows=20)]
    result = verdict(puts, rows_of(batches))
    assert result.ok, result
    assert not {(p.shard_id, p.sequence_number) for p in before} & {
        (r.shard_id, r.sequence_number) for r in rows_of(batches)
    }
    # Read again: the parent from the pinned moment (AT_TIMESTAMP), the children from their start.
    assert replayed(local_stack, stream, batches) == [keys(batch.planned.chunks) for batch in batches]
    engine.close()

    down = put_records(kinesis_client, stream, 20, tag="down")  # while the query is down
    checkpoint = batches[-1].end
    gone = copy.deepcopy(checkpoint)
    (entry,) = gone["streams"].values()
    entry["shards"]["shardId-000000000077"] = {"from": "TRIM_HORIZON", "rows": 0}
    # A new consumer for the restarted query: the first one's subscriptions may linger a few seconds.
    strict = engine_of(local_stack, stream, consumerName="test-restarted")
    engines.append(strict)
    with pytest.raises(DataLost, match=r"shard shardId-000000000077 of stream .*failOnDataLoss=false"):
        strict.plan(gone)
    lenient = engine_of(local_stack, stream, consumerName="test-restarted", failOnDataLoss="false")
    engines.append(lenient)
    after = plan_until(lenient, 20, start=gone)
    assert verdict(down, rows_of(after)).ok, "what was written while the query was down"
    lenient.close()

    # Restarted with skipOlderThan: a shard whose next record is older starts at AT_TIMESTAMP(now - it),
    # and the batch that moved its origin reads again the same rows.
    stale = put_records(kinesis_client, stream, 10, tag="stale")
    time.sleep(2.5)
    fresh = put_records(kinesis_client, stream, 10, tag="fresh")  # within 2 s of the restart
    live = engine_of(local_stack, stream, consumerName="test-live", skipOlderThan="2s")
    engines.append(live)
    skipped = plan_until(live, 10, start=after[-1].end)
    assert verdict(fresh, rows_of(skipped)).ok, "read what is older, or not what is within skipOlderThan"
    assert stale and replayed(local_stack, stream, skipped) == [keys(batch.planned.chunks) for batch in skipped]
    live.close()

    kinesis_client.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    deadline = time.monotonic() + 30
    while stream in kinesis_client.list_streams()["StreamNames"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.1)  # kinesis-local's creation times are whole seconds: another second
    create_stream(kinesis_client, stream, 1)
    again = engine_of(local_stack, stream)
    engines.append(again)
    with pytest.raises(StreamRecreated, match="deleted and created again"):
        again.plan(checkpoint)


def test_several_streams_through_throttling_with_their_offsets_lag_and_metrics_then_access_denied_names_the_shard(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    import urllib.request

    from efo.devstack.faults import FaultClient
    from efo.devstack.stack import free_port
    from efo.errors import AccessDenied

    orders, clicks = unique("src-orders"), unique("src-clicks")
    create_stream(kinesis_client, orders, 1)
    create_stream(kinesis_client, clicks, 2)
    puts = {
        orders: put_records(kinesis_client, orders, 20, tag="o"),
        clicks: put_records(kinesis_client, clicks, 30, tag="c"),
    }
    faults = FaultClient(local_stack.kinesis_endpoint)
    faults.clear()
    try:
        throttled = {"action": "error", "status": 400, "error_code": "LimitExceededException"}
        faults.add(operation="SubscribeToShard", count=3, **throttled)
        port = free_port()
        engine = engine_of(local_stack, f"{orders},{clicks}", metricsPort=str(port))
        engines.append(engine)
        batches = plan_until(engine, 50, max_rows=20)
        assert not faults.pending(), "the throttling was never met"
        rows = rows_of(batches)
        for name, put in puts.items():  # shard ids, and sequence numbers too, repeat across streams
            result = verdict(put, [r for r in rows if r.stream == name])
            assert result.ok, (name, result)
        streams = batches[-1].end["streams"]
        assert sorted(s["stream"] for s in streams.values()) == sorted([orders, clicks])
        assert all(isinstance(s.get("behindMs"), int) for s in streams.values()), "no MillisBehindLatest reported"
        assert sum(len(s["shards"]) for s in streams.values()) == 3
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert f'efo_records_received_total{{shard_id="shardId-000000000000",stream="{orders}"}} 20.0' in text
        assert f'efo_shard_lag_seconds{{shard_id="shardId-000000000000",stream="{clicks}"}}' in text
        engine.close()

        denied_rule = {"action": "error", "status": 400, "error_code": "AccessDeniedException"}
        faults.add(operation="SubscribeToShard", count=100, **denied_rule)
        denied = engine_of(local_stack, orders, consumerName="test-denied")
        engines.append(denied)
        start, deadline = initial_offset(), time.monotonic() + 30
        with pytest.raises(AccessDenied, match=rf"access to shard shardId-000000000000 of stream '{orders}'.* denied"):
            while time.monotonic() < deadline:
                start = denied.plan(start).end
                time.sleep(0.2)
    finally:
        faults.clear()
