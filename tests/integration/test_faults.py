"""Injected faults through the conformance proxy: every record still arrives, in order per shard,
exactly once, with more shards than the HTTP client's default pool; a deregistered consumer stops
the service with exit 3."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_NOT_FOUND

from .service import (
    ServiceRun,
    arrow_env,
    assert_exactly,
    create_stream,
    operator_lines,
    put_records,
    read_output,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def faults(local_stack: StackEndpoints) -> Iterator[FaultClient]:
    client = FaultClient(local_stack.kinesis_endpoint)
    yield client
    client.clear()


def test_every_record_arrives_once_and_in_order_through_resets_stalls_throttles_and_takeovers(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    stream = unique("faults")
    create_stream(kinesis_client, stream, 16)
    shards = [s["ShardId"] for s in kinesis_client.list_shards(StreamName=stream)["Shards"]]
    before = put_records(kinesis_client, stream, 320, keys=64, tag="before")
    op = "SubscribeToShard"
    faults.add(operation=op, shard_id=shards[0], action="reset", after_events=1)
    faults.add(operation=op, shard_id=shards[1], action="stall", after_events=1)
    faults.add(
        operation=op,
        shard_id=shards[2],
        action="error",
        status=400,
        error_code="ResourceInUseException",
        count=2,
    )
    faults.add(operation=op, shard_id=shards[3], action="error", status=400, error_code="LimitExceededException")
    faults.add(operation=op, shard_id=shards[4], action="error", status=500, error_code="InternalFailure")
    faults.add(
        operation=op,
        shard_id=shards[5],
        action="exception_frame",
        error_code="ResourceInUseException",
        after_events=1,
    )
    faults.add(operation=op, shard_id=shards[6], action="reset", after_events=0)
    env = arrow_env(
        local_stack,
        stream=stream,
        app=unique("app"),
        sink_dir=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_SUBSCRIPTION__READ_TIMEOUT_S="3",
    )
    run = ServiceRun(env, tmp_path / "efo.log").start()
    run.wait_for_event("service.ready", timeout_s=120)
    after = put_records(kinesis_client, stream, 320, keys=64, tag="after")
    wait_for_rows(tmp_path / "out", len(before) + len(after), run, timeout_s=120)
    assert run.stop() == 0
    rows = read_output(tmp_path / "out")
    assert_exactly(rows, before + after)
    # In order per shard: batch ids sort in commit order, rows keep their order inside a batch.
    by_shard: dict[str, list[int]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["efo_batch_id"]):
        by_shard[row["shard_id"]].append(int(row["sequence_number"]))
    assert all(seqs == sorted(seqs) for seqs in by_shard.values())
    assert faults.pending() == [], "every injected fault fired"
    retried = {e.get("shard_id") for e in run.events() if e["event"] == "subscription.retry"}
    assert set(shards[:7]) <= retried, sorted(retried)


def test_a_consumer_deregistered_under_a_running_service_stops_it_with_exit_3_naming_it(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    stream = unique("dereg")
    create_stream(kinesis_client, stream, 1)
    # The running subscription is cut (a takeover the lease check clears), and its renewal gets
    # what AWS answers once the consumer is gone.
    faults.add(
        operation="SubscribeToShard",
        action="exception_frame",
        error_code="ResourceInUseException",
        after_events=2,
    )
    faults.add(
        operation="SubscribeToShard",
        action="error",
        status=400,
        error_code="ResourceNotFoundException",
        message="Consumer arn:aws:kinesis:us-east-1:000000000000:stream/x/consumer/y:1 not found.",
        count=100,
    )
    env = arrow_env(local_stack, stream=stream, app=unique("app"), sink_dir=tmp_path / "out", initial_position="LATEST")
    run = ServiceRun(env, tmp_path / "efo.log").start()
    assert run.process is not None
    code = run.process.wait(120)
    assert code == EXIT_NOT_FOUND, run.tail()
    assert any(e["event"] == "service.ready" for e in run.events())
    lines = operator_lines(run.log_path.read_text())
    assert len(lines) == 1 and "consumer" in lines[0] and "not found" in lines[0], lines
    assert "Traceback" not in run.log_path.read_text()
