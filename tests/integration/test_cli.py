"""The ``efo`` CLI as a subprocess against the local stack, with no worker running: ``--help``,
``config``, the shard tree, checkpoints of a stream the service ran on, consumer registration,
and every error case with its exit code. (With live workers: test_cli_live.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.leases import shard_leases
from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_OK, EXIT_RUNTIME

from .service import (
    ServiceRun,
    arrow_env,
    closed_port_url,
    create_stream,
    efo,
    service_env,
    split_first_shard,
    unique,
)

pytestmark = pytest.mark.integration

DUMMY_CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
COMMAND_GROUPS = ("run", "doctor", "selftest", "consumers", "shards", "workers", "checkpoints", "config", "dev")


def table_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a printed table (columns are separated by spaces; empty cells are '-')."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[0].split(), [line.split() for line in lines[1:]]


@dataclass(frozen=True)
class RanOnce:
    env: dict[str, str]
    stream: str
    stream_arn: str
    app: str
    shard_ids: list[str]


@pytest.fixture(scope="module")
def ran_once(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RanOnce]:
    """A 2-shard stream that ``efo run`` consumed once (started, ready, stopped with SIGTERM)."""
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **DUMMY_CREDENTIALS
    )
    stream, app = unique("cli"), unique("app")
    create_stream(kinesis, stream, 2)
    tmp = tmp_path_factory.mktemp("cli")
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp / "out", initial_position="TRIM_HORIZON")
    run = ServiceRun(env, tmp / "efo-run.log").start()
    run.wait_for_event("service.ready")
    assert run.stop() == EXIT_OK, run.tail()
    summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    shard_ids = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"])
    yield RanOnce(env, stream, summary["StreamARN"], app, shard_ids)


@pytest.fixture
def offline_env(local_stack: StackEndpoints, tmp_path: Path) -> dict[str, str]:
    """Settings for commands that make no AWS call."""
    return service_env(
        local_stack, stream=unique("offline"), app="orders", output=tmp_path / "out", initial_position="LATEST"
    )


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in names}


# ---- help ----------------------------------------------------------------------------------------


def test_efo_help_lists_every_command_group_and_the_exit_codes(offline_env: dict[str, str]) -> None:
    result = efo(offline_env, "--help")
    assert result.code == EXIT_OK, result.stderr
    listed = result.stdout.split("Commands:")[1].split("Examples:")[0]
    assert [line.split()[0] for line in listed.strip().splitlines()] == list(COMMAND_GROUPS)
    assert "0 ok, 1 failed, 2 usage, 3 not found" in " ".join(result.stdout.split())


# ---- config --------------------------------------------------------------------------------------


def test_config_validate_exits_0_with_valid_settings(offline_env: dict[str, str], tmp_path: Path) -> None:
    result = efo(offline_env, "config", "validate")
    assert result.code == EXIT_OK, result.stderr
    assert result.stdout.strip() == (
        f"configuration is valid: stream={offline_env['EFO_STREAM']} app=orders sink=parquet:{tmp_path / 'out'}"
    )
    as_json = efo(offline_env, "config", "validate", "--json", "--app", "billing")
    assert json.loads(as_json.stdout) == {
        "valid": True,
        "stream": offline_env["EFO_STREAM"],
        "streams": [offline_env["EFO_STREAM"]],
        "app": "billing",
        "sink": f"parquet:{tmp_path / 'out'}",
    }


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"EFO_BATCH__MAX_WAIT_S": "0"}, "batch.max_wait_s (EFO_BATCH__MAX_WAIT_S) = '0'"),
        ({"EFO_STREAM": None}, "stream (EFO_STREAM) is required"),
        ({"EFO_VALUE_FORMAT": "xml"}, "value_format (EFO_VALUE_FORMAT) = 'xml'"),
    ],
)
def test_config_validate_exits_2_naming_the_bad_setting(
    offline_env: dict[str, str], change: dict[str, str | None], expected: str
) -> None:
    env = dict(offline_env)
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    result = efo(env, "config", "validate")
    assert result.code == EXIT_CONFIG
    assert result.stdout == ""
    assert result.one_error_line().startswith("efo: invalid configuration: ")
    assert expected in result.stderr


def test_config_show_says_where_each_setting_came_from_flag_environment_file_or_default(
    offline_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "efo.yaml"
    config.write_text(
        "pool:\n  max_pending_records: 5\n  reserved_records_per_shard: 3\nlog:\n  level: WARNING\ntable: from-yaml\n"
        "spark:\n  conf:\n    spark.hadoop.fs.s3a.secret.key: hunter2\n    spark.sql.shuffle.partitions: '4'\n"
    )
    env = {
        **without(offline_env, "EFO_SPARK__CONF"),
        "EFO_POOL__MAX_PENDING_RECORDS": "7",
        "EFO_SPARK_REMOTE": "sc://spark:15002/;token=s3cr3t;user_id=ops",
    }
    result = efo(env, "config", "show", "--config", str(config), "--stream", "from-flag", "--json")
    assert result.code == EXIT_OK, result.stderr
    records = json.loads(result.stdout)
    assert all(set(row) == {"stream", "setting", "value", "source", "origin", "entry"} for row in records)
    shown = {row["setting"]: row for row in records if row["stream"] is None}
    [flagged] = [row for row in records if row["stream"] == "from-flag" and row["setting"] == "stream"]
    assert (flagged["value"], flagged["source"], flagged["origin"]) == ("from-flag", "flag", "--stream")

    def where(setting: str) -> tuple[Any, str, str | None]:
        return shown[setting]["value"], shown[setting]["source"], shown[setting]["origin"]

    assert where("stream") == ("from-flag", "flag", "--stream")  # the flag wins over EFO_STREAM
    assert where("app") == ("orders", "environment", "EFO_APP")
    assert where("pool.max_pending_records") == (7, "environment", "EFO_POOL__MAX_PENDING_RECORDS")
    assert where("pool.reserved_records_per_shard") == (3, "file", str(config))
    assert where("table") == ("from-yaml", "file", str(config))
    assert where("batch.max_records") == (50_000, "default", None)
    assert where("spark.conf")[0] == {
        "spark.hadoop.fs.s3a.secret.key": "<redacted>",
        "spark.sql.shuffle.partitions": "4",
    }
    assert where("spark_remote")[0] == "sc://spark:15002/;token=<redacted>;user_id=ops"
    assert "hunter2" not in result.stdout and "s3cr3t" not in result.stdout

    table = efo(env, "config", "show", "--config", str(config))
    assert table.code == EXIT_OK, table.stderr
    settings_table, streams_table = table.stdout.split("\n\n")
    header, rows = table_rows(settings_table)
    assert header == ["SETTING", "VALUE", "SOURCE"]
    by_setting = {row[0]: row[1:] for row in rows}
    assert by_setting["app"] == ["orders", "environment", "EFO_APP"]
    assert by_setting["batch.max_records"] == ["50000", "default"]
    header, rows = table_rows(streams_table)
    assert header == ["STREAM", "SETTING", "VALUE", "SOURCE"]
    stream = offline_env["EFO_STREAM"]
    assert rows[0] == [stream, "stream", stream, "environment", "EFO_STREAM"]
    assert {row[1] for row in rows} == {
        "stream",
        "initial_position",
        "skip_older_than",
        "consumer_name",
        "consumer_arn",
    }
    assert "hunter2" not in table.stdout and "s3cr3t" not in table.stdout


def test_config_show_with_a_missing_file_exits_2_naming_it(offline_env: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = efo(offline_env, "config", "show", "--config", str(missing))
    assert result.code == EXIT_CONFIG
    assert result.one_error_line() == f"efo: cannot read the configuration file {missing}: No such file or directory"


# ---- the shard tree ------------------------------------------------------------------------------


def test_shards_shows_the_tree_across_a_split_with_hash_ranges(
    local_stack: StackEndpoints, kinesis_client: Any, offline_env: dict[str, str]
) -> None:
    stream = unique("tree")
    create_stream(kinesis_client, stream, 2)
    parent = split_first_shard(kinesis_client, stream)
    env = without(offline_env, "EFO_APP")  # no application: the tree alone

    result = efo(env, "shards", "--stream", stream, "--json")
    assert result.code == EXIT_OK, result.stderr
    shards = json.loads(result.stdout)
    by_id = {s["shard_id"]: s for s in shards}
    children = by_id[parent]["children"]
    assert len(shards) == 4 and len(children) == 2
    assert by_id[parent]["state"] == "closed" and by_id[parent]["depth"] == 0
    assert [s["shard_id"] for s in shards][:3] == [parent, *children]  # each child right after its parent
    for child in children:
        assert by_id[child] | {"starting_hash_key": None, "ending_hash_key": None} == {
            "stream": stream,
            "shard_id": child,
            "depth": 1,
            "state": "open",
            "parents": [parent],
            "children": [],
            "starting_hash_key": None,
            "ending_hash_key": None,
            "owner": None,
            "lease_state": None,
            "checkpoint": None,
            "checkpointed_at": None,
            "lag_ms": None,
            "reset_pending": None,
        }
    low, high = (by_id[c] for c in children)
    assert low["starting_hash_key"] == by_id[parent]["starting_hash_key"]
    assert int(low["ending_hash_key"]) + 1 == int(high["starting_hash_key"])
    assert high["ending_hash_key"] == by_id[parent]["ending_hash_key"]

    table = efo(env, "shards", "--stream", stream)
    header, rows = table_rows(table.stdout)
    assert header == ["STREAM", "SHARD", "STATE", "HASH", "RANGE", "PARENTS", "CHILDREN"]
    assert rows[0] == [stream, parent, "closed", "0.0-50.0%", "-", ",".join(children)]
    assert rows[1] == [stream, "└", children[0], "open", "0.0-25.0%", parent, "-"]
    assert rows[2] == [stream, "└", children[1], "open", "25.0-50.0%", parent, "-"]
    assert rows[3][2:] == ["open", "50.0-100.0%", "-", "-"]


def test_shards_with_an_application_shows_released_leases_and_the_lag_their_owner_wrote(
    ran_once: RanOnce, dynamodb_client: Any
) -> None:
    rows = shard_leases(dynamodb_client, ran_once.app, ran_once.app, ran_once.stream_arn)
    lagging, other = ran_once.shard_ids
    dynamodb_client.update_item(  # as an owner writes it with a checkpoint: MillisBehindLatest 4.2 s
        TableName=ran_once.app,
        Key={"pk": rows[lagging]["pk"], "sk": rows[lagging]["sk"]},
        UpdateExpression="SET lag_ms = :lag",
        ExpressionAttributeValues={":lag": {"N": "4200"}},
    )
    row = rows[other]
    other_lag_ms = int(row["lag_ms"]["N"]) if "lag_ms" in row else None  # what efo run wrote, if anything

    as_json = efo(ran_once.env, "shards", "--json")
    assert as_json.code == EXIT_OK, as_json.stderr
    shards = json.loads(as_json.stdout)
    assert [s["shard_id"] for s in shards] == ran_once.shard_ids
    for shard in shards:
        assert shard["owner"] is None and shard["lease_state"] == "free"  # released at the clean stop
        assert shard["checkpoint"].startswith(("AFTER_SEQUENCE_NUMBER:", "AT_TIMESTAMP:", "TRIM_HORIZON"))
    assert [s["lag_ms"] for s in shards] == [4200, other_lag_ms]

    header, rows = table_rows(efo(ran_once.env, "shards").stdout)
    assert header[-4:] == ["OWNER", "LEASE", "LAG", "CHECKPOINT"]
    # Nobody reads them now: the lag last written says nothing of the backlog since (--json keeps it).
    assert [row[-4:-1] for row in rows] == [["-", "free", "-"], ["-", "free", "-"]]


def test_a_heartbeat_row_however_old_and_unregistered_blocks_deregister_and_delete_all_without_force(
    ran_once: RanOnce, dynamodb_client: Any, kinesis_client: Any
) -> None:
    """A worker's row names the consumer; it is 10 minutes old (dead, or its clock is behind, or its
    failover is longer) and its application is missing from the registry partition (a worker of a
    release before it): the CLI must neither deregister the consumer nor delete the leases under it."""
    consumer = kinesis_client.describe_stream_consumer(StreamARN=ran_once.stream_arn, ConsumerName=ran_once.app)
    consumer_arn = consumer["ConsumerDescription"]["ConsumerARN"]
    partition = f"{ran_once.app}|{ran_once.stream_arn}"
    dynamodb_client.delete_item(TableName=ran_once.app, Key={"pk": {"S": "efo:partitions"}, "sk": {"S": partition}})
    ghost = {"pk": {"S": partition}, "sk": {"S": "worker|ghost"}}
    dynamodb_client.put_item(
        TableName=ran_once.app,
        Item={
            **ghost,
            "heartbeat": {"N": "7"},
            "updated_at": {"S": (datetime.now(UTC) - timedelta(minutes=10)).isoformat()},
            "consumer_arn": {"S": consumer_arn},
        },
    )
    try:
        refused = efo(ran_once.env, "consumers", "deregister", "--yes")
        assert refused.code == EXIT_RUNTIME, refused.stderr
        assert f"is named by the heartbeat of 1 worker(s): {ran_once.app}/ghost (heartbeat 10m" in refused.stderr
        assert kinesis_client.describe_stream_consumer(StreamARN=ran_once.stream_arn, ConsumerName=ran_once.app)
        kept = efo(ran_once.env, "checkpoints", "reset", "--delete-all", "--yes")
        assert kept.code == EXIT_RUNTIME and "worker(s) ghost of application" in kept.one_error_line()
        assert len(json.loads(efo(ran_once.env, "checkpoints", "show", "--json").stdout)) == 2
    finally:
        dynamodb_client.delete_item(TableName=ran_once.app, Key=ghost)


# ---- checkpoints ---------------------------------------------------------------------------------


def test_checkpoints_show_and_its_alias_leases_print_released_leases_as_a_table_and_as_json(
    ran_once: RanOnce,
) -> None:
    as_json = efo(ran_once.env, "checkpoints", "show", "--json")
    assert as_json.code == EXIT_OK, as_json.stderr
    leases = json.loads(as_json.stdout)
    assert [lease["shard_id"] for lease in leases] == ran_once.shard_ids
    for lease in leases:
        assert set(lease) == {
            "stream",
            "shard_id",
            "parents",
            "counter",
            "owner",
            "lease_state",
            "checkpoint",
            "checkpointed_at",
            "lag_ms",
            "reset_pending",
        }
        assert lease["owner"] is None and lease["lease_state"] == "free"  # released at the clean stop
        assert lease["counter"] >= 2  # claimed, then released
        assert lease["checkpoint"] and lease["checkpoint"] != "SHARD_END"
        assert lease["parents"] == [] and lease["reset_pending"] is None

    alias = efo(ran_once.env, "leases")
    assert alias.code == EXIT_OK, alias.stderr
    header, rows = table_rows(alias.stdout)
    assert header == [
        "STREAM", "SHARD", "OWNER", "LEASE", "COUNTER", "CHECKPOINT", "WRITTEN", "LAG", "RESET", "PENDING"
    ]  # fmt: skip
    for row, lease in zip(rows, leases, strict=True):
        assert lease["stream"] == ran_once.stream
        assert row[:6] == [ran_once.stream, lease["shard_id"], "-", "free", str(lease["counter"]), lease["checkpoint"]]
        assert row[-1] == "-"


def test_checkpoints_reset_without_a_terminal_and_without_yes_exits_2_and_changes_nothing(ran_once: RanOnce) -> None:
    result = efo(ran_once.env, "checkpoints", "reset", "--all", "--to", "TRIM_HORIZON")
    assert result.code == EXIT_CONFIG
    assert result.one_error_line() == (
        "efo: refusing to reset checkpoints without --yes (there is no terminal to ask on)"
    )
    leases = json.loads(efo(ran_once.env, "checkpoints", "show", "--json").stdout)
    assert all(lease["reset_pending"] is None for lease in leases)


# ---- consumers: registration ---------------------------------------------------------------------


def test_consumers_register_waits_until_active_and_is_idempotent(ran_once: RanOnce, kinesis_client: Any) -> None:
    name = unique("ops")
    first = efo(ran_once.env, "consumers", "register", "--name", name, "--wait", "--json")
    assert first.code == EXIT_OK, first.stderr
    registered = json.loads(first.stdout)
    assert registered["name"] == name and registered["registered"] is True
    assert registered["status"] == "ACTIVE"
    assert registered["arn"].startswith(f"{ran_once.stream_arn}/consumer/{name}:")
    assert f"waiting for consumer {name!r} to become ACTIVE" in first.stderr  # the progress line, no terminal

    again = efo(ran_once.env, "consumers", "register", "--name", name)
    assert again.code == EXIT_OK, again.stderr
    assert again.stdout.splitlines() == [
        f"already registered: consumer {name!r} on stream {ran_once.stream!r}, ACTIVE",
        f"arn: {registered['arn']}",
    ]
    listed = {
        c["ConsumerName"] for c in kinesis_client.list_stream_consumers(StreamARN=ran_once.stream_arn)["Consumers"]
    }
    assert name in listed


def test_consumers_register_past_the_limit_of_20_per_stream_exits_1_explaining_it(
    local_stack: StackEndpoints, kinesis_client: Any, offline_env: dict[str, str]
) -> None:
    stream = unique("limits")
    create_stream(kinesis_client, stream, 1)
    arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    registered = 0
    while registered < 20:  # at most 5 CREATING at once per account: retry until the others are ACTIVE
        try:
            kinesis_client.register_stream_consumer(StreamARN=arn, ConsumerName=f"c{registered:02d}")
            registered += 1
        except kinesis_client.exceptions.LimitExceededException:
            time.sleep(0.1)
    result = efo(offline_env, "consumers", "register", "--stream", stream, "--name", "one-too-many")
    assert result.code == EXIT_RUNTIME
    line = result.one_error_line()
    assert line.startswith("efo: cannot register consumer 'one-too-many' on stream ")
    assert "LimitExceededException" in line
    assert "at most 20 consumers per stream, and 5 consumers CREATING at once per account" in line
    assert "efo consumers list" in line


# ---- consumers: listing and retiring, no worker running ------------------------------------------


def test_consumers_list_and_describe_show_a_consumer_no_live_worker_uses(ran_once: RanOnce) -> None:
    result = efo(ran_once.env, "consumers", "list", "--json")
    assert result.code == EXIT_OK, result.stderr
    consumers = {c["name"]: c for c in json.loads(result.stdout)}
    mine = consumers[ran_once.app]
    assert mine["arn"].startswith(f"{ran_once.stream_arn}/consumer/{ran_once.app}:")
    assert mine["status"] == "ACTIVE" and mine["created_at"]
    assert mine["in_use"] is False and mine["readers"] == []  # the worker stopped cleanly

    described = efo(ran_once.env, "consumers", "describe", "--json")
    assert described.code == EXIT_OK, described.stderr
    assert json.loads(described.stdout) == mine
    alias = efo(ran_once.env, "consumer", "show", "--arn", mine["arn"])
    assert alias.code == EXIT_OK, alias.stderr
    header, rows = table_rows(alias.stdout)
    assert header == ["STREAM", "NAME", "STATUS", "CREATED", "IN", "USE", "ARN"]
    created = mine["created_at"]
    assert mine["stream"] == ran_once.stream
    assert rows == [[ran_once.stream, ran_once.app, "ACTIVE", created[:10], created[11:19] + "Z", "no", mine["arn"]]]

    unknown = efo(without(ran_once.env, "EFO_APP"), "consumers", "list", "--stream", ran_once.stream)
    assert unknown.code == EXIT_OK, unknown.stderr
    assert all(row[5] == "?" for row in table_rows(unknown.stdout)[1])
    assert "IN USE '?': who reads through it is unknown; name the lease table(s) with --table or --app" in (
        unknown.stderr
    )


def test_consumers_deregister_without_a_terminal_and_without_yes_exits_2_and_leaves_the_consumer(
    ran_once: RanOnce, kinesis_client: Any
) -> None:
    result = efo(ran_once.env, "consumers", "deregister")
    assert result.code == EXIT_CONFIG
    assert result.stdout == ""
    assert result.one_error_line() == (
        "efo: refusing to deregister a consumer without --yes (there is no terminal to ask on)"
    )
    description = kinesis_client.describe_stream_consumer(StreamARN=ran_once.stream_arn, ConsumerName=ran_once.app)
    assert description["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE"


# ---- every error case, with its exit code --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "drop", "code", "expected"),
    [
        (
            ["consumers", "list", "--bogus"],
            (),
            EXIT_CONFIG,
            "efo: No such option '--bogus'; see 'efo consumers list --help'",
        ),
        (
            ["shards"],
            ("EFO_STREAM",),
            EXIT_CONFIG,
            "efo: no stream given: pass --stream NAME, or set EFO_STREAM (or EFO_STREAMS for several)",
        ),
        (
            ["workers"],
            ("EFO_APP",),
            EXIT_CONFIG,
            "efo: no application given: pass --app NAME or set EFO_APP (it names the lease table's rows)",
        ),
        (
            ["consumers", "describe", "--name", "a", "--arn", "arn:b"],
            (),
            EXIT_CONFIG,
            "efo: --name and --arn name the same consumer: pass one of them",
        ),
        (
            ["consumers", "deregister", "--yes", "--stream", "{stream}"],
            ("EFO_APP",),
            EXIT_CONFIG,
            "efo: cannot tell whether a live worker reads through the consumer: name the lease table(s) with "
            "--table or --app, or pass --force",
        ),
        (
            ["checkpoints", "reset", "--all", "--yes"],
            (),
            EXIT_CONFIG,
            "efo: checkpoints reset needs --to POSITION: LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>, AFTER:<seq>",
        ),
        (
            ["checkpoints", "reset", "--all", "--to", "AFTER:123", "--yes"],
            (),
            EXIT_CONFIG,
            "efo: --to AFTER:<sequence> names a record of one shard: use it with --shard, not --all",
        ),
        (
            ["consumers", "deregister", "--name", "nobody", "--yes"],
            (),
            EXIT_NOT_FOUND,
            "efo: consumer 'nobody' is not registered on stream '{stream}'; see 'efo consumers list --stream {stream}'",
        ),
        (
            ["checkpoints", "reset", "--shard", "shardId-999", "--to", "LATEST", "--yes"],
            (),
            EXIT_NOT_FOUND,
            "efo: no lease for shard(s) shardId-999 of application '{app}', and stream '{stream}' does not list "
            "them (past its retention, or never one of its shards); see 'efo checkpoints show' and 'efo shards'",
        ),
        (
            ["workers", "--app", "nobody"],
            (),
            EXIT_NOT_FOUND,
            "efo: DynamoDB table 'nobody' does not exist; name the lease table with --app (or EFO_TABLE), "
            "or start 'efo run' once to create it",
        ),
        (
            ["consumers", "list", "--table", "nowhere"],
            (),
            EXIT_NOT_FOUND,
            "efo: DynamoDB table 'nowhere' not found (ResourceNotFoundException: Requested resource not found); "
            "check --table, --app and EFO_TABLE: each names a lease table that efo run has created",
        ),
    ],
)
def test_each_error_is_one_line_naming_the_resource_with_its_exit_code(
    ran_once: RanOnce, args: list[str], drop: tuple[str, ...], code: int, expected: str
) -> None:
    fill = {"stream": ran_once.stream, "app": ran_once.app}
    result = efo(without(ran_once.env, *drop), *(arg.format(**fill) for arg in args))
    assert result.code == code, result.stderr
    assert result.stdout == ""
    assert result.stderr == expected.format(**fill) + "\n"  # plain, although EFO_LOG__FORMAT is json


def test_an_application_without_rows_on_the_stream_exits_3_naming_it(ran_once: RanOnce) -> None:
    result = efo({**ran_once.env, "EFO_TABLE": ran_once.app}, "shards", "--app", "never-ran")
    assert result.code == EXIT_NOT_FOUND
    assert result.one_error_line() == (
        f"efo: application 'never-ran' has no rows for stream {ran_once.stream!r} in DynamoDB table "
        f"{ran_once.app!r}; check --app (or EFO_APP, EFO_TABLE), or start 'efo run' once"
    )


def test_operator_commands_on_a_missing_stream_exit_3_naming_it(ran_once: RanOnce) -> None:
    stream = unique("missing")
    for command in (
        ["shards"],
        ["workers"],
        ["consumers", "list"],
    ):
        result = efo(ran_once.env, *command, "--stream", stream)
        assert result.code == EXIT_NOT_FOUND, (command, result.stderr)
        assert result.stdout == ""
        line = result.one_error_line()
        assert line.startswith(f"efo: stream {stream!r} not found")
        assert "check EFO_STREAM (or EFO_STREAMS) and EFO_REGION, or create the stream" in line


def test_an_unreachable_endpoint_exits_1_naming_the_settings(ran_once: RanOnce) -> None:
    result = efo({**ran_once.env, "EFO_KINESIS_ENDPOINT": closed_port_url()}, "consumers", "list")
    assert result.code == EXIT_RUNTIME
    line = result.one_error_line()
    assert line.startswith("efo: cannot connect to the endpoint for stream ")
    assert "EFO_KINESIS_ENDPOINT" in line
