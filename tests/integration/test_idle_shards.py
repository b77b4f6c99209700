"""An idle shard writes no checkpoint: an ``efo run`` process on kinesis-local, whose empty events
the conformance proxy gives a newer ContinuationSequenceNumber each (kinesis-local itself keeps an
idle shard's number still; AWS may move it), writes each shard's pin and the position of committed
records, and nothing for the empty events in between. Writes are read from the lease rows: every
checkpoint write sets ``updated_at``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints

from .workers import Workers

pytestmark = pytest.mark.integration

SUBSCRIPTIONS_PER_SHARD = 5  # rule firings per shard: a retried subscription takes one too
IDLE_S = 5.0  # about five empty events (one a second), ten checkpoint intervals (FAST_SETTINGS: 0.5 s)


@pytest.fixture
def faults(local_stack: StackEndpoints) -> Iterator[FaultClient]:
    client = FaultClient(local_stack.kinesis_endpoint)
    yield client
    client.clear()


def _rows(w: Workers) -> dict[str, tuple[str, str, str | None]]:
    """Per shard: when its checkpoint was written, and the checkpoint."""
    return {
        sid: (item["updated_at"]["S"], item["position_kind"]["S"], item.get("sequence_number", {}).get("S"))
        for sid, item in w.leases().items()
    }


def test_an_idle_shard_writes_its_pin_then_nothing_while_the_continuation_moves_and_committed_records_are_written(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2, initial_position="LATEST")
    shards = {s["ShardId"]: s for s in kinesis_client.list_shards(StreamName=w.stream)["Shards"]}
    rules = {
        sid: faults.add(
            operation="SubscribeToShard", shard_id=sid, action="advance_continuation", count=SUBSCRIPTIONS_PER_SHARD
        )["id"]
        for sid in shards
    }
    run = w.start("w1")
    run.wait_for_event("service.ready", timeout_s=60)

    def all_pinned() -> bool:
        rows = _rows(w)
        return rows.keys() == shards.keys() and all(kind != "AT_TIMESTAMP" for _, kind, _ in rows.values())

    w.wait_until(all_pinned, 30, "every shard's start (LATEST: AT_TIMESTAMP) pinned to its first event")
    left = {rule["id"]: rule["count"] for rule in faults.pending()}
    assert all(left.get(rule, 0) < SUBSCRIPTIONS_PER_SHARD for rule in rules.values()), "a shard kept its continuation"

    pinned = _rows(w)
    time.sleep(IDLE_S)
    assert _rows(w) == pinned, "an idle shard wrote a checkpoint for empty events"

    busy, idle = sorted(shards)
    hash_key = shards[busy]["HashKeyRange"]["StartingHashKey"]
    put = kinesis_client.put_record(StreamName=w.stream, Data=b"one", PartitionKey="k", ExplicitHashKey=hash_key)
    assert put["ShardId"] == busy
    # At the record, or past it: an empty event that came before the sink committed the record moves
    # the chunk's resume position on (to the proxy's newer continuation), which is written with it.
    w.wait_until(
        lambda: _rows(w)[busy][1] == "AFTER_SEQUENCE_NUMBER"
        and int(_rows(w)[busy][2] or 0) >= int(put["SequenceNumber"]),
        30,
        "the committed record's checkpoint",
    )
    committed = _rows(w)
    assert committed[idle] == pinned[idle]
    time.sleep(IDLE_S)
    assert _rows(w) == committed, "a shard idle again wrote a checkpoint for empty events"
    assert w.stop("w1") == 0
