"""``efo run`` end to end against the local stack: every acknowledged record arrives, exactly once
in a clean run, across restarts, kills, LATEST and a shard split. The first test runs the whole
path into Parquet through Spark; the others test the service, not Spark, and use the Spark-free
arrow sink (no JVM start-up each)."""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints

from .service import (
    ServiceRun,
    arrow_env,
    assert_exactly,
    create_stream,
    efo,
    keys,
    put_records,
    read_output,
    service_env,
    split_first_shard,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration


def _run(
    stack: StackEndpoints, tmp_path: Path, stream: str, app: str, position: str, *, spark: bool = False, **extra: str
) -> ServiceRun:
    runs = len(list(tmp_path.glob("efo-run-*.log")))
    out = tmp_path / "out"
    if spark:
        env = service_env(stack, stream=stream, app=app, output=out, initial_position=position, **extra)
    else:
        env = arrow_env(stack, stream=stream, app=app, sink_dir=out, initial_position=position, **extra)
    return ServiceRun(env, tmp_path / f"efo-run-{runs}.log").start()


def _batch_order(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {batch: i for i, batch in enumerate(sorted({r["efo_batch_id"] for r in rows}))}


def test_trim_horizon_delivers_records_put_before_and_after_start_exactly_once(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("th")
    create_stream(kinesis_client, stream, 2)
    before = put_records(kinesis_client, stream, 300, tag="before")
    run = _run(local_stack, tmp_path, stream, unique("app"), "TRIM_HORIZON", spark=True)
    run.wait_for_event("service.ready")
    after = put_records(kinesis_client, stream, 300, tag="after")
    rows = wait_for_rows(tmp_path / "out", 600, run)
    assert run.stop() == 0
    rows = read_output(tmp_path / "out")
    assert_exactly(rows, before + after)
    by_key = {(p.shard_id, p.sequence_number): p for p in before + after}
    for row in rows:
        put = by_key[(row["shard_id"], row["sequence_number"])]
        assert (row["data"], row["partition_key"], row["stream"]) == (put.data, put.partition_key, stream)
        assert row["sub_sequence_number"] is None and row["error"] is None
    # Within a batch, the rows of one shard are in sequence order.
    sequences: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row in rows:
        sequences[(row["efo_batch_id"], row["shard_id"])].append(int(row["sequence_number"]))
    assert all(seq == sorted(seq) for seq in sequences.values())
    assert any(e["event"] == "leases.released" for e in run.events())


def test_service_killed_with_sigkill_and_restarted_loses_nothing(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("kill"), unique("app")
    create_stream(kinesis_client, stream, 2)
    first = put_records(kinesis_client, stream, 400, tag="first")
    run = _run(local_stack, tmp_path, stream, app, "TRIM_HORIZON", EFO_BATCH__MAX_RECORDS="100")
    wait_for_rows(tmp_path / "out", 100, run)
    run.stop(signal.SIGKILL)
    second = put_records(kinesis_client, stream, 200, tag="second")
    restarted = _run(local_stack, tmp_path, stream, app, "TRIM_HORIZON")
    restarted.wait_for_event("service.ready")
    third = put_records(kinesis_client, stream, 100, tag="third")
    expected = {(p.shard_id, p.sequence_number) for p in first + second + third}
    deadline = time.monotonic() + 90
    while not expected <= set(keys(read_output(tmp_path / "out"))):
        assert time.monotonic() < deadline, restarted.tail()
        time.sleep(0.5)
    assert restarted.stop() == 0
    got = keys(read_output(tmp_path / "out"))
    assert expected <= set(got)
    assert set(got) <= expected
    # Duplicates are bounded by what was handed on but not checkpointed at the kill.
    assert len(got) - len(set(got)) <= len(first)


def test_latest_skips_records_put_before_first_start_and_delivers_all_after_ready(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("latest")
    create_stream(kinesis_client, stream, 2)
    put_records(kinesis_client, stream, 100, tag="old")
    run = _run(local_stack, tmp_path, stream, unique("app"), "LATEST")
    run.wait_for_event("service.ready")
    new = put_records(kinesis_client, stream, 200, tag="new")
    wait_for_rows(tmp_path / "out", 200, run)
    time.sleep(2)  # give any wrongly read old record the chance to show up
    assert run.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), new)


def test_latest_service_restarted_delivers_everything_written_while_it_was_down(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("down"), unique("app")
    create_stream(kinesis_client, stream, 2)
    run = _run(local_stack, tmp_path, stream, app, "LATEST")
    run.wait_for_event("service.ready")
    live = put_records(kinesis_client, stream, 50, tag="live")
    wait_for_rows(tmp_path / "out", 50, run)
    assert run.stop() == 0
    while_down = put_records(kinesis_client, stream, 150, tag="down")
    restarted = _run(local_stack, tmp_path, stream, app, "LATEST")
    wait_for_rows(tmp_path / "out", 200, restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), live + while_down)


def test_latest_restart_before_any_record_still_reads_what_was_written_while_down(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    """The first continuation of a LATEST subscription is checkpointed: LATEST never applies twice."""
    stream, app = unique("pin"), unique("app")
    create_stream(kinesis_client, stream, 1)
    run = _run(local_stack, tmp_path, stream, app, "LATEST")
    run.wait_for_event("service.ready")
    time.sleep(1.5)  # let the pinned position reach the table (checkpoint interval 0.5 s)
    assert run.stop() == 0
    while_down = put_records(kinesis_client, stream, 60, tag="down")
    restarted = _run(local_stack, tmp_path, stream, app, "LATEST")
    wait_for_rows(tmp_path / "out", 60, restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), while_down)


def test_shard_split_during_consumption_loses_nothing_and_keeps_parent_before_child_order(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("split"), unique("app")
    create_stream(kinesis_client, stream, 2)
    deleted_after = {"EFO_LEASE__DELETE_FINISHED_AFTER_S": "1"}
    run = _run(local_stack, tmp_path, stream, app, "TRIM_HORIZON", **deleted_after)
    run.wait_for_event("service.ready")
    before = put_records(kinesis_client, stream, 300, keys=8, tag="parent")
    parent = split_first_shard(kinesis_client, stream)
    after = put_records(kinesis_client, stream, 300, keys=8, tag="child")
    rows = wait_for_rows(tmp_path / "out", 600, run)
    # Once both children's reading began, the parent's finished lease is deleted; the parent is still in
    # the stream, and a restart (which lists it) must not read it again.
    assert run.wait_for_event("lease.deleted", timeout_s=60)["shard_id"] == parent
    assert run.stop() == 0
    rows = read_output(tmp_path / "out")
    assert_exactly(rows, before + after)
    restarted = _run(local_stack, tmp_path, stream, app, "TRIM_HORIZON", **deleted_after)
    restarted.wait_for_event("service.ready")
    later = put_records(kinesis_client, stream, 60, keys=8, tag="later")
    wait_for_rows(tmp_path / "out", 660, restarted)
    assert restarted.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), before + after + later)
    assert not [e for e in restarted.events() if e.get("shard_id") == parent and e["event"] == "shard.started"]
    # The parent alone, named: its lease is written again at the position (it had none to reset).
    again = efo(restarted.env, "checkpoints", "reset", "--shard", parent, "--to", "TRIM_HORIZON", "--yes", "--json")
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout)["shard_ids"] == [parent]
    # Reading everything again means the parent too: its lease is written again, before the resets.
    reset = efo(restarted.env, "checkpoints", "reset", "--all", "--to", "TRIM_HORIZON", "--yes", "--json")
    assert reset.code == 0, reset.stderr
    assert parent in json.loads(reset.stdout)["shard_ids"]
    children = {p.shard_id for p in after} - {p.shard_id for p in before}
    assert children, "the split produced no child shard that received records"
    # Per partition key, every parent record is committed no later than the first child record.
    order = _batch_order(rows)
    by_key: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["shard_id"] == parent or row["shard_id"] in children:
            role = "parent" if row["shard_id"] == parent else "child"
            by_key[row["partition_key"]][role].append(order[row["efo_batch_id"]])
    checked = 0
    for roles in by_key.values():
        if roles["parent"] and roles["child"]:
            assert max(roles["parent"]) <= min(roles["child"])
            checked += 1
    assert checked > 0
    assert [e for e in run.events() if e["event"] == "checkpoint.shard_end" and e["shard_id"] == parent]


def test_more_shards_than_the_http_clients_default_pool_are_all_read(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    """aiobotocore's default pool is 10 connections and stalls silently beyond; each subscription
    holds one, so the data-plane pool is sized from the shard count."""
    stream = unique("wide")
    create_stream(kinesis_client, stream, 16)
    run = _run(local_stack, tmp_path, stream, unique("app"), "TRIM_HORIZON")
    ready = run.wait_for_event("service.ready")
    assert ready["shards"] == 16
    puts = put_records(kinesis_client, stream, 480, keys=64, tag="wide")
    assert len({p.shard_id for p in puts}) == 16
    wait_for_rows(tmp_path / "out", len(puts), run)
    assert run.stop() == 0
    assert_exactly(read_output(tmp_path / "out"), puts)
