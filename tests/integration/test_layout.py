"""A lease table of the layout before lease partitions (every row of an application under one
partition key) is refused with the command that migrates it; ``efo checkpoints migrate`` moves its
leases to lease partitions without losing a checkpoint, and ``efo run`` then resumes from them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME

from .service import (
    ServiceRun,
    arrow_env,
    assert_exactly,
    create_stream,
    efo,
    put_records,
    raw_lease_table,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration


def _old_layout_table(
    dynamodb: Any, *, app: str, stream_arn: str, created: datetime, checkpoints: dict[str, dict[str, Any]]
) -> str:
    """The rows an efo before lease partitions wrote: meta and leases in the control partition."""
    control = raw_lease_table(dynamodb, app=app, stream_arn=stream_arn, created=created)
    for shard_id, position in checkpoints.items():
        dynamodb.put_item(
            TableName=app,
            Item={
                "pk": {"S": control},
                "sk": {"S": f"shard|{shard_id}"},
                "parents": {"L": []},
                "lease_counter": {"N": "3"},
                "lease_owner": {"S": "old-worker"},  # killed: its lease was never released
                "updated_at": {"S": datetime.now(UTC).isoformat()},
                **position,
            },
        )
    return control


def test_a_table_of_the_old_layout_is_refused_then_migrated_and_read_from_its_checkpoints(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("layout"), unique("app")
    create_stream(kinesis_client, stream, 2)
    summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    puts = put_records(kinesis_client, stream, 12)
    shard_a, shard_b = sorted({p.shard_id for p in puts})
    of_a = [p for p in puts if p.shard_id == shard_a]
    assert len(of_a) >= 3, "the test needs records before and after shard A's checkpoint"
    control = _old_layout_table(
        dynamodb_client,
        app=app,
        stream_arn=summary["StreamARN"],
        created=summary["StreamCreationTimestamp"],
        checkpoints={
            shard_a: {
                "position_kind": {"S": "AFTER_SEQUENCE_NUMBER"},
                "sequence_number": {"S": of_a[1].sequence_number},
            },
            shard_b: {"position_kind": {"S": "TRIM_HORIZON"}},
        },
    )
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="LATEST")

    for command in (["run"], ["checkpoints", "show"]):
        refused = efo(env, *command)
        assert refused.code == EXIT_CONFIG, refused.stderr
        line = refused.one_error_line()
        assert repr(app) in line and "efo checkpoints migrate" in line and "nothing checkpointed is lost" in line

    heartbeat = {"pk": {"S": control}, "sk": {"S": "worker|old-worker"}}
    dynamodb_client.put_item(TableName=app, Item={**heartbeat, "heartbeat": {"N": "7"}})
    running = efo(env, "checkpoints", "migrate", "--yes")
    assert running.code == EXIT_RUNTIME and "old-worker" in running.one_error_line()
    dynamodb_client.delete_item(TableName=app, Key=heartbeat)  # it is gone for good

    migrated = efo(env, "checkpoints", "migrate", "--yes")
    assert migrated.code == EXIT_OK, migrated.stderr
    assert "moved 2 lease(s)" in migrated.stdout
    again = efo(env, "checkpoints", "migrate", "--yes")
    assert again.code == EXIT_OK and "nothing to move" in again.stdout
    left = dynamodb_client.query(
        TableName=app,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :shard)",
        ExpressionAttributeValues={":pk": {"S": control}, ":shard": {"S": "shard|"}},
        ConsistentRead=True,
    )
    assert left["Items"] == [], "lease rows left in the control partition"

    shown = efo(env, "checkpoints", "show", "--json")
    assert shown.code == EXIT_OK, shown.stderr
    assert {row["shard_id"]: (row["checkpoint"], row["owner"]) for row in json.loads(shown.stdout)} == {
        shard_a: (f"AFTER_SEQUENCE_NUMBER:{of_a[1].sequence_number}", None),
        shard_b: ("TRIM_HORIZON", None),
    }

    # Resumes from the migrated checkpoints: LATEST applies at a first start only, and this is not one.
    expected = [p for p in puts if p not in of_a[:2]]
    run = ServiceRun(env, tmp_path / "efo-run.log").start()
    rows = wait_for_rows(tmp_path / "out", len(expected), run)
    assert run.stop() == EXIT_OK, run.tail()
    assert_exactly(rows, expected)


def test_delete_all_removes_a_table_of_the_old_layout_without_a_migration(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """A stream deleted and recreated under an old table: starting over needs no migration first."""
    stream, app = unique("layout"), unique("app")
    create_stream(kinesis_client, stream, 1)
    summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    shard_id = kinesis_client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    control = _old_layout_table(
        dynamodb_client,
        app=app,
        stream_arn=summary["StreamARN"],
        created=summary["StreamCreationTimestamp"],
        checkpoints={shard_id: {"position_kind": {"S": "TRIM_HORIZON"}}},
    )
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="LATEST")
    deleted = efo(env, "checkpoints", "reset", "--delete-all", "--yes")
    assert deleted.code == EXIT_OK, deleted.stderr
    assert "removed 2 rows" in deleted.stdout
    rows = dynamodb_client.query(
        TableName=app, KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": control}}
    )
    assert rows["Items"] == []
