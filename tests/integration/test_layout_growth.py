"""A lease table whose layout grew (a second generation of lease partitions, efo.leases.model.Layout),
on the real local stack: ``efo run`` finds every lease, in whichever generation it is, resumes from
its checkpoint and writes there; a worker restarted on it reads on from those checkpoints; and a
layout of a later format is refused, naming the field and what to do."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.leases import shard_leases
from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_OK
from efo.leases.codec import GROWN, RESERVED_PREFIX
from efo.leases.model import LAYOUT_FORMAT, Layout

from .service import (
    ServiceRun,
    arrow_env,
    assert_exactly,
    create_stream,
    efo,
    put_records,
    raw_lease_table,
    split_first_shard,
    unique,
    wait_for_rows,
)

pytestmark = pytest.mark.integration

LAYOUT = Layout((8, 16))


def _grown_table(
    dynamodb: Any, *, app: str, stream_arn: str, created: datetime, checkpoints: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """The rows of a table grown once (as LeaseTable.grow leaves the meta row): the first shard's lease
    from the first start (generation 0, no reservation), the others' written since (generation 1, each
    behind its reservation). Returns shard id -> the partition key of its lease."""
    control = raw_lease_table(
        dynamodb,
        app=app,
        stream_arn=stream_arn,
        created=created,
        lease_partitions={"S": GROWN},
        lease_generations={"L": [{"N": str(size)} for size in LAYOUT.sizes]},
        lease_generation={"N": "1"},
        layout_format={"N": str(LAYOUT_FORMAT)},
        migrating_to={"N": str(LAYOUT.partitions)},
    )
    where: dict[str, str] = {}
    for n, (shard_id, position) in enumerate(sorted(checkpoints.items())):
        partition = LAYOUT.home(shard_id) if n == 0 else LAYOUT.newest(shard_id)
        if n:
            dynamodb.put_item(
                TableName=app,
                Item={
                    "pk": {"S": f"{control}#{LAYOUT.home(shard_id)}"},
                    "sk": {"S": RESERVED_PREFIX + shard_id},
                    "partition": {"N": str(partition)},
                },
            )
        where[shard_id] = f"{control}#{partition}"
        dynamodb.put_item(
            TableName=app,
            Item={
                "pk": {"S": where[shard_id]},
                "sk": {"S": f"shard|{shard_id}"},
                "parents": {"L": []},
                "lease_counter": {"N": "3"},
                "updated_at": {"S": datetime.now(UTC).isoformat()},
                **position,
            },
        )
    return where


def test_a_grown_table_is_read_from_every_generation_by_a_worker_and_by_a_restarted_one(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("grown"), unique("app")
    create_stream(kinesis_client, stream, 3)
    summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    puts = put_records(kinesis_client, stream, 18)
    shards = sorted({p.shard_id for p in puts})
    assert len(shards) == 3, "the test needs records in every shard"
    first = [p for p in puts if p.shard_id == shards[0]]
    second = [p for p in puts if p.shard_id == shards[1]]
    assert len(first) >= 2 and len(second) >= 2, "the test needs records before and after two checkpoints"
    where = _grown_table(
        dynamodb_client,
        app=app,
        stream_arn=summary["StreamARN"],
        created=summary["StreamCreationTimestamp"],
        checkpoints={
            shards[0]: {  # generation 0
                "position_kind": {"S": "AFTER_SEQUENCE_NUMBER"},
                "sequence_number": {"S": first[0].sequence_number},
            },
            shards[1]: {  # generation 1
                "position_kind": {"S": "AFTER_SEQUENCE_NUMBER"},
                "sequence_number": {"S": second[1].sequence_number},
            },
            shards[2]: {"position_kind": {"S": "TRIM_HORIZON"}},  # generation 1
        },
    )
    assert len(set(where.values())) == 3
    control = f"{app}|{summary['StreamARN']}"
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="LATEST")

    shown = efo(env, "checkpoints", "show", "--json")
    assert shown.code == EXIT_OK, shown.stderr
    assert {row["shard_id"] for row in json.loads(shown.stdout)} == set(shards)

    expected = [p for p in puts if p not in first[:1] and p not in second[:2]]
    run = ServiceRun(env, tmp_path / "efo-run.log").start()
    rows = wait_for_rows(tmp_path / "out", len(expected), run)
    assert run.stop() == EXIT_OK, run.tail()
    assert_exactly(rows, expected)

    leases = shard_leases(dynamodb_client, app, app, summary["StreamARN"])
    assert set(leases) == set(shards)
    assert {shard_id: row["pk"]["S"] for shard_id, row in leases.items()} == where, "a lease moved"
    assert all(row["position_kind"]["S"] == "AFTER_SEQUENCE_NUMBER" for row in leases.values()), leases

    # A worker started again reads on from the checkpoints it wrote in both generations; a shard split
    # meanwhile gets its children's leases in the newest generation, each behind its reservation.
    more = put_records(kinesis_client, stream, 9, tag="more")
    again = ServiceRun(env, tmp_path / "efo-run-2.log").start()
    rows = wait_for_rows(tmp_path / "out", len(expected) + len(more), again)
    parent = split_first_shard(kinesis_client, stream)
    after_split = put_records(kinesis_client, stream, 12, tag="split")
    rows = wait_for_rows(tmp_path / "out", len(expected) + len(more) + len(after_split), again)
    assert again.stop() == EXIT_OK, again.tail()
    assert_exactly(rows, expected + more + after_split)
    leases = shard_leases(dynamodb_client, app, app, summary["StreamARN"])
    children = {shard_id for shard_id in leases if shard_id not in shards}
    assert len(children) == 2, (parent, sorted(leases))
    for child in children:
        assert leases[child]["pk"]["S"] == f"{control}#{LAYOUT.newest(child)}"
        reservation = dynamodb_client.get_item(
            TableName=app,
            Key={"pk": {"S": f"{control}#{LAYOUT.home(child)}"}, "sk": {"S": RESERVED_PREFIX + child}},
            ConsistentRead=True,
        )["Item"]
        assert reservation["partition"] == {"N": str(LAYOUT.newest(child))}

    # A meta row of a later layout format: refused, not read with leases missing.
    dynamodb_client.update_item(
        TableName=app,
        Key={"pk": {"S": control}, "sk": {"S": "meta"}},
        UpdateExpression="SET layout_format = :later",
        ExpressionAttributeValues={":later": {"N": str(LAYOUT_FORMAT + 1)}},
    )
    refused = efo(env, "run")
    assert refused.code == EXIT_CONFIG, refused.stderr
    line = refused.one_error_line()
    assert repr(app) in line and "layout_format" in line and "run the release that wrote it" in line
