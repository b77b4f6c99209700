"""The operator CLI of an application with several streams (issue 20), as a subprocess against the
local stack: ``leases``/``checkpoints show``, ``shards``, ``workers`` and ``consumers list`` cover
every configured stream with a stream column and field; ``--stream`` selects one, also a stream
removed from the list; commands that act on one stream refuse several without ``--stream``; a
configured stream that is missing, or has no rows yet, is named without hiding the others.

The lease rows are written with :class:`LeaseTable` itself (no ``efo run``): a meta row, one lease
per shard and one worker's heartbeat per stream, as a first start writes them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiobotocore.session import get_session

from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_OK
from efo.leases.table import LeaseTable
from efo.pipeline.records import Position

from .service import create_stream, efo, service_env, unique

pytestmark = pytest.mark.integration

DUMMY_CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


@dataclass(frozen=True)
class Application:
    env: dict[str, str]  # EFO_STREAMS names orders and payments; refunds was removed from it
    app: str
    orders: str
    payments: str
    refunds: str
    shard_ids: dict[str, list[str]]  # by stream


async def write_first_start(
    stack: StackEndpoints, app: str, stream_arn: str, shard_ids: list[str], worker: str
) -> None:
    """The rows a worker's first start writes on one stream: meta, a lease per shard, its heartbeat."""
    async with get_session().create_client(
        "dynamodb", endpoint_url=stack.dynamodb_endpoint, region_name=stack.region, **DUMMY_CREDENTIALS
    ) as dynamodb:
        table = LeaseTable(dynamodb, table=app, app=app, stream_arn=stream_arn, worker_id=worker)
        await table.ensure_table(create=True)
        now = datetime.now(UTC)
        assert await table.create_meta(now, "TRIM_HORIZON", now)
        for shard_id in shard_ids:
            assert await table.create_lease(shard_id, (), Position("TRIM_HORIZON"))
        await table.complete_meta()
        await table.heartbeat()


@pytest.fixture(scope="module")
def application(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Application]:
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **DUMMY_CREDENTIALS
    )
    app = unique("multi")
    streams = {"orders": (unique("orders"), 2), "payments": (unique("payments"), 1), "refunds": (unique("refunds"), 1)}
    shard_ids: dict[str, list[str]] = {}
    for role, (stream, shards) in streams.items():
        create_stream(kinesis, stream, shards)
        arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
        shard_ids[stream] = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"])
        asyncio.run(write_first_start(local_stack, app, arn, shard_ids[stream], worker=f"w-{role}"))
    orders, payments, refunds = (stream for stream, _ in streams.values())
    env = service_env(
        local_stack, stream="-", app=app, output=tmp_path_factory.mktemp("multi"), initial_position="LATEST"
    )
    env.pop("EFO_STREAM")
    env["EFO_STREAMS"] = f"{orders},{payments}"
    yield Application(env, app, orders, payments, refunds, shard_ids)


def table_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[0].split(), [line.split() for line in lines[1:]]


def by_stream(records: list[dict[str, Any]], field: str) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for record in records:
        found.setdefault(record["stream"], []).append(record[field])
    return found


# ---- every configured stream ---------------------------------------------------------------------


def test_checkpoints_show_and_leases_cover_every_configured_stream_with_a_stream_column(
    application: Application,
) -> None:
    a = application
    result = efo(a.env, "checkpoints", "show", "--json")
    assert result.code == EXIT_OK, result.stderr
    leases = json.loads(result.stdout)
    assert by_stream(leases, "shard_id") == {a.orders: a.shard_ids[a.orders], a.payments: a.shard_ids[a.payments]}
    assert all(lease["checkpoint"] == "TRIM_HORIZON" and lease["owner"] is None for lease in leases)

    table = efo(a.env, "leases")
    assert table.code == EXIT_OK, table.stderr
    header, rows = table_rows(table.stdout)
    assert header[:3] == ["STREAM", "SHARD", "OWNER"]
    assert [row[:2] for row in rows] == [[lease["stream"], lease["shard_id"]] for lease in leases]


def test_workers_and_shards_cover_every_configured_stream(application: Application) -> None:
    a = application
    workers = efo(a.env, "workers", "--json")
    assert workers.code == EXIT_OK, workers.stderr
    assert by_stream(json.loads(workers.stdout), "worker_id") == {a.orders: ["w-orders"], a.payments: ["w-payments"]}
    header, rows = table_rows(efo(a.env, "workers").stdout)
    assert header[:2] == ["STREAM", "WORKER"]
    assert [row[:2] for row in rows] == [[a.orders, "w-orders"], [a.payments, "w-payments"]]

    shards = efo(a.env, "shards", "--json")
    assert shards.code == EXIT_OK, shards.stderr
    records = json.loads(shards.stdout)
    assert by_stream(records, "shard_id") == {a.orders: a.shard_ids[a.orders], a.payments: a.shard_ids[a.payments]}
    assert {record["lease_state"] for record in records} == {"free"}
    header, rows = table_rows(efo(a.env, "shards").stdout)
    assert header[:2] == ["STREAM", "SHARD"] and header[-4:] == ["OWNER", "LEASE", "LAG", "CHECKPOINT"]
    assert [row[0] for row in rows] == [a.orders, a.orders, a.payments]


def test_consumers_list_covers_every_configured_stream(application: Application, kinesis_client: Any) -> None:
    a = application
    for stream in (a.orders, a.payments):
        arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
        kinesis_client.register_stream_consumer(StreamARN=arn, ConsumerName=a.app)
    result = efo(a.env, "consumers", "list", "--json")
    assert result.code == EXIT_OK, result.stderr
    assert by_stream(json.loads(result.stdout), "name") == {a.orders: [a.app], a.payments: [a.app]}


# ---- --stream selects one ------------------------------------------------------------------------


def test_stream_selects_one_configured_stream(application: Application) -> None:
    a = application
    for command in (["checkpoints", "show"], ["workers"], ["shards"]):
        result = efo(a.env, *command, "--stream", a.payments, "--json")
        assert result.code == EXIT_OK, (command, result.stderr)
        assert {record["stream"] for record in json.loads(result.stdout)} == {a.payments}, command


def test_a_stream_removed_from_the_list_is_shown_and_deleted_with_stream(application: Application) -> None:
    a = application
    assert {lease["stream"] for lease in json.loads(efo(a.env, "checkpoints", "show", "--json").stdout)} == {
        a.orders,
        a.payments,
    }
    kept = efo(a.env, "checkpoints", "show", "--stream", a.refunds, "--json")
    assert kept.code == EXIT_OK, kept.stderr
    assert by_stream(json.loads(kept.stdout), "shard_id") == {a.refunds: a.shard_ids[a.refunds]}

    deleted = efo(a.env, "checkpoints", "reset", "--delete-all", "--stream", a.refunds, "--yes", "--force", "--json")
    assert deleted.code == EXIT_OK, deleted.stderr
    record = json.loads(deleted.stdout)
    assert record["stream"] == a.refunds and record["deleted_rows"] >= 3  # meta, heartbeat, one lease (version)

    gone = efo(a.env, "checkpoints", "show", "--stream", a.refunds)
    assert gone.code == EXIT_NOT_FOUND
    assert gone.one_error_line().startswith(f"efo: application {a.app!r} has no rows for stream {a.refunds!r}")
    assert len(json.loads(efo(a.env, "checkpoints", "show", "--json").stdout)) == 3  # the others untouched


# ---- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["checkpoints", "reset", "--all", "--to", "LATEST", "--yes"],
        ["checkpoints", "reset", "--delete-all", "--yes"],
        ["consumers", "deregister", "--yes"],
    ],
    ids=" ".join,
)
def test_destructive_commands_refuse_several_streams_without_stream(application: Application, args: list[str]) -> None:
    a = application
    result = efo(a.env, *args)
    assert result.code == EXIT_CONFIG
    assert result.stdout == ""
    command = " ".join(args[:2])
    assert result.one_error_line() == (
        f"efo: 'efo {command}' acts on one stream and 2 are configured ({a.orders}, {a.payments}): pass --stream NAME"
    )
    assert all(lease["reset_pending"] is None for lease in json.loads(efo(a.env, "leases", "--json").stdout))


# ---- a configured stream missing, or without rows ------------------------------------------------


def test_a_missing_configured_stream_is_named_and_the_others_still_shown(application: Application) -> None:
    a = application
    missing = unique("missing")
    env = {**a.env, "EFO_STREAMS": f"{a.orders},{missing},{a.payments}"}
    result = efo(env, "checkpoints", "show", "--json")
    assert result.code == EXIT_NOT_FOUND
    assert set(by_stream(json.loads(result.stdout), "shard_id")) == {a.orders, a.payments}
    assert result.one_error_line().startswith(f"efo: stream {missing!r} not found")

    table = efo(env, "workers")
    assert table.code == EXIT_NOT_FOUND
    assert [row[0] for row in table_rows(table.stdout)[1]] == [a.orders, a.payments]


def test_a_configured_stream_without_rows_yet_is_named_and_the_others_still_shown(
    application: Application, kinesis_client: Any
) -> None:
    a = application
    added = unique("added")
    create_stream(kinesis_client, added, 1)
    env = {**a.env, "EFO_STREAMS": f"{a.orders},{added}"}
    result = efo(env, "shards", "--json")
    assert result.code == EXIT_NOT_FOUND
    assert set(by_stream(json.loads(result.stdout), "shard_id")) == {a.orders}
    assert result.one_error_line() == (
        f"efo: application {a.app!r} has no rows for stream {added!r} in DynamoDB table {a.app!r}; "
        "check --app (or EFO_APP, EFO_TABLE), or start 'efo run' once"
    )
    tree = efo({key: value for key, value in env.items() if key != "EFO_APP"}, "shards", "--json")
    assert tree.code == EXIT_OK, tree.stderr  # without an application, the tree of both
    assert set(by_stream(json.loads(tree.stdout), "shard_id")) == {a.orders, added}


def test_config_show_lists_each_configured_stream(application: Application, tmp_path: Path) -> None:
    a = application
    result = efo(a.env, "config", "show", "--json")
    assert result.code == EXIT_OK, result.stderr
    streams = [row for row in json.loads(result.stdout) if row["setting"] == "stream" and row["stream"]]
    assert [(row["stream"], row["source"], row["origin"], row["entry"]) for row in streams] == [
        (a.orders, "environment", "EFO_STREAMS", 1),
        (a.payments, "environment", "EFO_STREAMS", 2),
    ]
