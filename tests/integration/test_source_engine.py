"""The Spark source's engine (efo.source) on the local stack, without Spark: micro-batches planned as
Spark plans them, through splits and merges, read limits, AvailableNow and restarts from an offset;
every batch read again between its offsets (as after a restart) gives the same rows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints
from efo.errors import ResourceNotFound, StreamRecreated
from efo.source.engine import DataLost, Engine, initial_offset
from efo.source.offsets import SourceOffset
from efo.source.replay import read_between

from .service import create_stream, split_first_shard, unique
from .source import Batch, engine_of, options_of, plan_until, put_keyed, rows_of, verdict

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


def replayed(stack: StackEndpoints, stream: str, batch: Batch) -> list[tuple[str, str, int | None]]:
    chunks = read_between(
        options_of(stack, stream), SourceOffset.from_json(batch.start), SourceOffset.from_json(batch.end)
    )
    return [
        (c.shard_id, s, sub) for c in chunks for s, sub in zip(c.sequence_numbers, c.sub_sequence_numbers, strict=True)
    ]


def planned_keys(batch: Batch) -> list[tuple[str, str, int | None]]:
    return [
        (c.shard_id, s, sub)
        for c in batch.planned.chunks
        for s, sub in zip(c.sequence_numbers, c.sub_sequence_numbers, strict=True)
    ]


def split(kinesis: Any, stream: str, shard_id: str) -> None:
    from efo.devstack.producer import wait_active

    (shard,) = [s for s in kinesis.list_shards(StreamName=stream)["Shards"] if s["ShardId"] == shard_id]
    low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((low + high) // 2))
    wait_active(kinesis, stream)


def merge_children(kinesis: Any, stream: str, parent: str) -> str:
    """Merge the two children of ``parent`` (adjacent by construction); returns the merged shard's id."""
    from efo.devstack.producer import wait_active

    children = sorted(
        s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"] if s.get("ParentShardId") == parent
    )
    kinesis.merge_shards(StreamName=stream, ShardToMerge=children[0], AdjacentShardToMerge=children[1])
    wait_active(kinesis, stream)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    return str(
        next(s["ShardId"] for s in shards if s.get("ParentShardId") in children and s.get("AdjacentParentShardId"))
    )


def test_a_split_and_a_merge_lose_nothing_and_parents_come_in_earlier_batches_than_children(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    """A backlog across a split and a merge of the children (each generation has records waiting when
    the query starts, so nothing but the lineage keeps a child from the batch of its parent), then
    one more split while the query reads."""
    stream = unique("src-reshard")
    create_stream(kinesis_client, stream, 2)
    puts = put_keyed(kinesis_client, stream, 60, tag="a")
    parent = split_first_shard(kinesis_client, stream)
    puts += put_keyed(kinesis_client, stream, 60, tag="b")
    merged = merge_children(kinesis_client, stream, parent)
    puts += put_keyed(kinesis_client, stream, 60, tag="c")
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    batches = plan_until(engine, 180, max_rows=25)
    split(kinesis_client, stream, "shardId-000000000001")  # the other original shard, mid-query
    puts += put_keyed(kinesis_client, stream, 40, tag="d")
    batches += plan_until(engine, 40, start=batches[-1].end, max_rows=25)

    rows = rows_of(batches)
    result = verdict(puts, rows)
    assert result.ok, result
    assert all(b.planned.rows <= 25 for b in batches), "a batch over the read limit"
    lineage = {s["ShardId"]: s for s in kinesis_client.list_shards(StreamName=stream)["Shards"]}
    parents_of = {
        sid: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p] for sid, s in lineage.items()
    }
    assert parents_of[merged], "the merged shard has no parents: the test proves nothing"
    for child, parents in parents_of.items():
        child_batches = [r.batch for r in rows if r.shard_id == child]
        for p in parents:
            parent_batches = [r.batch for r in rows if r.shard_id == p]
            if child_batches and parent_batches:
                assert max(parent_batches) < min(child_batches), f"{child} read in the batch of its parent {p}"
    last = SourceOffset.from_json(batches[-1].end).streams
    (shards,) = [s.shards for s in last.values()]
    assert shards[parent].ended and all(shards[c].ended for c in parents_of[merged]), "an ended shard not in the offset"
    # Every batch read again between its offsets is the same rows, across the split and the merge.
    for batch in batches:
        assert replayed(local_stack, stream, batch) == planned_keys(batch)


def test_a_child_born_after_a_latest_start_is_read_from_its_start(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-latest")
    create_stream(kinesis_client, stream, 1)
    before = put_keyed(kinesis_client, stream, 10, tag="old")
    engine = engine_of(local_stack, stream, startingPosition="LATEST")
    engines.append(engine)
    pin = engine.plan(initial_offset())
    assert pin.advanced and pin.rows == 0, "the first batch pins LATEST in the offsets"
    puts = put_keyed(kinesis_client, stream, 20, tag="new")
    split_first_shard(kinesis_client, stream)
    puts += put_keyed(kinesis_client, stream, 30, tag="child")
    batches = plan_until(engine, 50, start=pin.end)
    result = verdict(puts, rows_of(batches))
    assert result.ok, result
    assert not {(p.shard_id, p.sequence_number) for p in before} & {
        (r.shard_id, r.sequence_number) for r in rows_of(batches)
    }


def test_a_restart_from_an_offset_reads_on_exactly_after_it(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-restart")
    create_stream(kinesis_client, stream, 2)
    puts = put_keyed(kinesis_client, stream, 40, tag="a")
    first = engine_of(local_stack, stream)
    engines.append(first)
    batches = plan_until(first, 40, max_rows=15)
    first.close()
    puts += put_keyed(kinesis_client, stream, 40, tag="b")
    second = engine_of(local_stack, stream)  # a new process: only the checkpoint's offset
    engines.append(second)
    batches += plan_until(second, 40, start=batches[-1].end, max_rows=15)
    result = verdict(puts, rows_of(batches))
    assert result.ok, result


def test_read_limits_split_a_kpl_aggregate_across_batches_and_a_replay_gives_the_same_sub_records(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    from aws_kinesis_agg.aggregator import RecordAggregator

    stream = unique("src-kpl")
    create_stream(kinesis_client, stream, 1)
    aggregator = RecordAggregator()
    for i in range(30):
        aggregator.add_user_record(f"k{i % 3}", f"sub-{i}".encode())
    record = aggregator.clear_and_get()
    assert record is not None
    partition_key, _, data = record.get_contents()
    kinesis_client.put_record(StreamName=stream, Data=data, PartitionKey=partition_key)
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    batches = plan_until(engine, 30, max_rows=7, max_bytes=40)
    sizes = [b.planned.rows for b in batches if b.planned.rows]
    assert max(sizes) <= 7 and sum(sizes) == 30
    assert all(sum(len(d) for c in b.planned.chunks for d in c.data) <= 40 for b in batches)
    subs = [r.sub_sequence_number for r in rows_of(batches)]
    assert subs == list(range(30)), "sub-records lost, repeated or out of order across batches"
    for batch in batches:
        assert replayed(local_stack, stream, batch) == planned_keys(batch)


def test_available_now_reads_up_to_its_start_across_a_split_and_nothing_after(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-now")
    create_stream(kinesis_client, stream, 2)
    before = put_keyed(kinesis_client, stream, 40, tag="before")
    parent = split_first_shard(kinesis_client, stream)
    before += put_keyed(kinesis_client, stream, 40, tag="child")
    time.sleep(1.2)
    at_ms = int(time.time() * 1000)
    time.sleep(1.2)
    after = put_keyed(kinesis_client, stream, 40, tag="after")
    engine = engine_of(local_stack, stream, available_now_at_ms=at_ms)
    engines.append(engine)
    start, batches = initial_offset(), []
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, "AvailableNow did not end"
        planned = engine.plan(start, 30)
        if not planned.advanced:
            break  # the start came back: the query stops
        batches.append(Batch(start, planned.end, planned))
        start = planned.end
    rows = rows_of(batches)
    result = verdict(before, rows)
    assert result.ok, result
    assert not {(p.shard_id, p.sequence_number) for p in after} & {(r.shard_id, r.sequence_number) for r in rows}
    (shards,) = [s.shards for s in SourceOffset.from_json(start).streams.values()]
    assert shards[parent].ended, "the split parent was not read to its end"


def test_a_checkpoint_naming_a_shard_the_stream_no_longer_has_fails_naming_it_or_reads_on_when_allowed(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-gone")
    create_stream(kinesis_client, stream, 1)
    puts = put_keyed(kinesis_client, stream, 10, tag="a")
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    checkpoint = plan_until(engine, 10)[-1].end
    engine.close()  # one subscriber per shard and consumer: the next engine is the query restarted
    (entry,) = checkpoint["streams"].values()
    entry["shards"]["shardId-000000000077"] = {"from": "TRIM_HORIZON", "rows": 0}
    strict = engine_of(local_stack, stream)
    engines.append(strict)
    with pytest.raises(DataLost, match=r"shard shardId-000000000077 of stream .*failOnDataLoss=false"):
        strict.plan(checkpoint)
    lenient = engine_of(local_stack, stream, failOnDataLoss="false")
    engines.append(lenient)
    more = put_keyed(kinesis_client, stream, 10, tag="b")
    batches = plan_until(lenient, 10, start=checkpoint)
    assert verdict(more, rows_of(batches)).ok and puts


def test_a_stream_recreated_under_its_name_is_refused_and_a_missing_one_is_named(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-recreated")
    create_stream(kinesis_client, stream, 1)
    put_keyed(kinesis_client, stream, 5, tag="a")
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    batch = plan_until(engine, 5)[-1]
    engine.close()
    kinesis_client.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    deadline = time.monotonic() + 30
    while stream in kinesis_client.list_streams()["StreamNames"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    missing = engine_of(local_stack, stream)
    engines.append(missing)
    with pytest.raises(ResourceNotFound, match=rf"stream '{stream}' not found.*option"):
        missing.plan(batch.end)
    time.sleep(1.1)  # a creation time of another second
    create_stream(kinesis_client, stream, 1)
    again = engine_of(local_stack, stream)
    engines.append(again)
    with pytest.raises(StreamRecreated, match="deleted and created again"):
        again.plan(batch.end)


def test_a_batch_whose_records_kinesis_no_longer_has_is_data_loss_naming_the_shard(
    local_stack: StackEndpoints, kinesis_client: Any
) -> None:
    """What a replay finds when records of a planned batch were trimmed since: fewer rows than the
    end offset says the batch holds (kinesis-local never trims; the offset claims more than was put)."""
    stream = unique("src-trimmed")
    create_stream(kinesis_client, stream, 1)
    puts = put_keyed(kinesis_client, stream, 5, tag="a")
    arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    created = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
        "StreamCreationTimestamp"
    ]
    end = {
        "v": 1,
        "streams": {
            arn: {
                "stream": stream,
                "created": int(created.timestamp() * 1000),
                "shards": {puts[0].shard_id: {"from": "TRIM_HORIZON", "rows": 8, "seq": puts[-1].sequence_number}},
            }
        },
    }
    with pytest.raises(
        DataLost, match=rf"holds 8 rows of shard {puts[0].shard_id} of stream '{stream}', but Kinesis gave 5"
    ):
        read_between(options_of(local_stack, stream), SourceOffset(), SourceOffset.from_json(end))
    lenient = read_between(
        options_of(local_stack, stream, failOnDataLoss="false"), SourceOffset(), SourceOffset.from_json(end)
    )
    assert sum(len(c) for c in lenient) == 5


def test_several_streams_in_one_source_each_with_its_offsets_and_how_far_behind(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    orders, clicks = unique("src-orders"), unique("src-clicks")
    create_stream(kinesis_client, orders, 1)
    create_stream(kinesis_client, clicks, 2)
    puts = {
        orders: put_keyed(kinesis_client, orders, 20, tag="o"),
        clicks: put_keyed(kinesis_client, clicks, 30, tag="c"),
    }
    engine = engine_of(local_stack, f"{orders},{clicks}")
    engines.append(engine)
    batches = plan_until(engine, 50, max_rows=20)
    rows = rows_of(batches)
    for name, put in puts.items():  # shard ids, and sequence numbers too, repeat across streams
        result = verdict(put, [r for r in rows if r.stream == name])
        assert result.ok, (name, result)
    streams = batches[-1].end["streams"]
    assert sorted(s["stream"] for s in streams.values()) == sorted([orders, clicks])
    assert all(isinstance(s.get("behindMs"), int) for s in streams.values()), "no MillisBehindLatest reported"
    assert sum(len(s["shards"]) for s in streams.values()) == 3


def test_skip_older_than_starts_a_shard_whose_next_record_is_older_at_now_minus_it_on_a_restart(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    stream = unique("src-skip")
    create_stream(kinesis_client, stream, 1)
    put_keyed(kinesis_client, stream, 10, tag="a")
    first = engine_of(local_stack, stream)
    engines.append(first)
    checkpoint = plan_until(first, 10)[-1].end
    first.close()
    old = put_keyed(kinesis_client, stream, 10, tag="old")  # written while the query is down ...
    time.sleep(3)
    new = put_keyed(kinesis_client, stream, 10, tag="new")  # ... and these within the last 2 s
    second = engine_of(local_stack, stream, skipOlderThan="2s")
    engines.append(second)
    batches = plan_until(second, 10, start=checkpoint)
    time.sleep(2)  # nothing more comes
    more = second.plan(batches[-1].end)
    rows = rows_of([*batches, Batch(batches[-1].end, more.end, more)])
    assert verdict(new, rows).ok, "the records within skipOlderThan were not read"
    assert not {p.sequence_number for p in old} & {r.sequence_number for r in rows}, "older records were read"
    (entry,) = batches[-1].end["streams"].values()
    assert entry["shards"]["shardId-000000000000"]["from"].startswith("AT_TIMESTAMP:")
    # The batch that skipped, read again between its offsets, is the same rows.
    for batch in batches:
        assert replayed(local_stack, stream, batch) == planned_keys(batch)


def test_throttled_subscriptions_are_retried_and_access_denied_fails_naming_the_shard(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    from efo.devstack.faults import FaultClient
    from efo.errors import AccessDenied

    stream = unique("src-faults")
    create_stream(kinesis_client, stream, 1)
    puts = put_keyed(kinesis_client, stream, 20, tag="a")
    faults = FaultClient(local_stack.kinesis_endpoint)
    faults.clear()
    try:
        throttled = {"action": "error", "status": 400, "error_code": "LimitExceededException"}
        faults.add(operation="SubscribeToShard", count=3, **throttled)
        engine = engine_of(local_stack, stream)
        engines.append(engine)
        batches = plan_until(engine, 20)
        assert verdict(puts, rows_of(batches)).ok
        assert not faults.pending(), "the throttling was never met"
        engine.close()
        denied_rule = {"action": "error", "status": 400, "error_code": "AccessDeniedException"}
        faults.add(operation="SubscribeToShard", count=100, **denied_rule)
        denied = engine_of(local_stack, stream)
        engines.append(denied)
        start = batches[-1].end
        deadline = time.monotonic() + 30
        with pytest.raises(AccessDenied, match=r"access to shard shardId-000000000000 of stream .* denied"):
            while time.monotonic() < deadline:
                start = denied.plan(start).end
                time.sleep(0.2)
    finally:
        faults.clear()


def test_metrics_port_serves_efos_metrics_of_the_querys_subscriptions(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    import urllib.request

    from efo.devstack.stack import free_port

    stream = unique("src-metrics")
    create_stream(kinesis_client, stream, 1)
    put_keyed(kinesis_client, stream, 5, tag="a")
    port = free_port()
    engine = engine_of(local_stack, stream, metricsPort=str(port))
    engines.append(engine)
    plan_until(engine, 5)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'efo_records_received_total{{shard_id="shardId-000000000000",stream="{stream}"}} 5.0' in text
    assert f'efo_shard_lag_seconds{{shard_id="shardId-000000000000",stream="{stream}"}}' in text


def test_available_now_fails_naming_a_shard_that_gives_nothing_for_shard_timeout(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    from efo.devstack.faults import FaultClient
    from efo.errors import ShardTimeout

    stream = unique("src-silent")
    create_stream(kinesis_client, stream, 1)
    put_keyed(kinesis_client, stream, 5, tag="a")
    faults = FaultClient(local_stack.kinesis_endpoint)
    faults.clear()
    faults.add(operation="SubscribeToShard", action="stall", count=100)  # silent until the client goes away
    try:
        engine = engine_of(local_stack, stream, available_now_at_ms=int(time.time() * 1000), shardTimeout="3s")
        engines.append(engine)
        started = time.monotonic()
        with pytest.raises(ShardTimeout, match=rf"option shardTimeout.*{stream}/shardId-000000000000"):
            engine.plan(initial_offset())
        assert time.monotonic() - started < 30, "the wait was not bounded by shardTimeout"
    finally:
        faults.clear()


def test_a_corrupt_kpl_aggregate_is_passed_through_marked_or_fails_the_query_naming_the_shard(
    local_stack: StackEndpoints, kinesis_client: Any, engines: list[Engine]
) -> None:
    from efo.kinesis.kpl import CORRUPT_AGGREGATE, MAGIC, CorruptAggregate

    stream = unique("src-corrupt")
    create_stream(kinesis_client, stream, 1)
    corrupt = MAGIC + b"\x0a\xff not a protobuf" + bytes(16)
    kinesis_client.put_record(StreamName=stream, Data=corrupt, PartitionKey="k")
    puts = put_keyed(kinesis_client, stream, 3, tag="a")
    engine = engine_of(local_stack, stream)
    engines.append(engine)
    batches = plan_until(engine, 4)
    rows = [(bytes(d), e) for b in batches for c in b.planned.chunks for d, e in zip(c.data, c.errors, strict=True)]
    assert rows[0] == (corrupt, CORRUPT_AGGREGATE) and [e for _, e in rows[1:]] == [None] * len(puts)
    for batch in batches:
        assert replayed(local_stack, stream, batch) == planned_keys(batch)
    engine.close()
    strict = engine_of(local_stack, stream, onCorruptAggregate="fail")
    engines.append(strict)
    start, deadline = initial_offset(), time.monotonic() + 30
    with pytest.raises(CorruptAggregate, match=rf"in shard shardId-000000000000 of stream '{stream}'"):
        while time.monotonic() < deadline:
            start = strict.plan(start).end
            time.sleep(0.2)
