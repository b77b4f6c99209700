"""``EFO_SINK=arrow:<module>:<function>``: the whole service without a JVM. The function is
handed each batch as a pyarrow.Table of the DataFrame schema; no Spark session is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .ledger_check import Producer, committed_rows, wait_until_all_committed
from .service import SPARK_MARKERS, ServiceRun, arrow_env, create_stream, unique

pytestmark = pytest.mark.integration


def test_an_arrow_sink_gets_every_record_once_in_order_and_no_spark_starts(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("arrow"), unique("app")
    create_stream(kinesis_client, stream, 2)
    producer = Producer(kinesis_client, stream)
    producer.put(200)
    run = ServiceRun(
        arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "sink", initial_position="TRIM_HORIZON"),
        tmp_path / "efo.log",
    ).start()
    run.wait_for_event("service.ready", timeout_s=30)
    producer.put(200)
    verdict = wait_until_all_committed(producer.acknowledged, tmp_path / "sink", timeout_s=60)
    assert run.stop() == 0
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    log = run.log_path.read_text()
    assert not [marker for marker in SPARK_MARKERS if marker in log], "a Spark session was started"


def test_small_and_large_records_reach_the_sink_whole_in_one_batch(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    """An event of small records is decoded by msgspec, an event of records over 1,350 B by orjson
    and pybase64 (efo.kinesis.decoder.decode_event); the bridge makes one data column of a batch
    holding both. Every payload arrives whole, once, in order per key.

    The small records all go to one shard and the large ones to the other (ExplicitHashKey), so
    no event mixes the two; a 20 s batch window holds an event of each."""
    stream, app = unique("sizes"), unique("app")
    create_stream(kinesis_client, stream, 2)
    shards = kinesis_client.list_shards(StreamName=stream)["Shards"]
    starts = [shard["HashKeyRange"]["StartingHashKey"] for shard in shards]
    small = Producer(kinesis_client, stream, hash_key=starts[0])
    large = Producer(kinesis_client, stream, pad="p" * 1500, hash_key=starts[1])
    small.put(40)
    large.put(40)
    assert {p.shard_id for p in small.acknowledged}.isdisjoint({p.shard_id for p in large.acknowledged})
    run = ServiceRun(
        arrow_env(
            local_stack,
            stream=stream,
            app=app,
            sink_dir=tmp_path / "sink",
            initial_position="TRIM_HORIZON",
            EFO_BATCH__MAX_WAIT_S="20",
        ),
        tmp_path / "efo.log",
    ).start()
    verdict = wait_until_all_committed(small.acknowledged + large.acknowledged, tmp_path / "sink", timeout_s=60)
    assert run.stop() == 0
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    rows = committed_rows(tmp_path / "sink")
    by_sequence = {row["seq"]: row["data"] for row in rows}
    for producer in (small, large):
        for record in producer.acknowledged:
            assert by_sequence[record.sequence_number] == f"{producer.pad}{record.key}:{record.counter}"
    sizes_by_batch: dict[str, set[bool]] = {}
    for row in rows:
        sizes_by_batch.setdefault(row["batch"], set()).add(len(row["data"]) > 1500)
    assert {True, False} in sizes_by_batch.values(), f"no batch held both sizes: {sizes_by_batch}"
